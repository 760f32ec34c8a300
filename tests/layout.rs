//! The source layout of docs/design.md ("The layers and what each may import"), read from the
//! code: the files of `src/loss/` and `src/exact/` import each other without a cycle, the
//! kernels never import a loss configuration or the dispatch, and a face (`mod.rs`) only
//! declares and re-exports.
//!
//! Edges are read as text, the way a reader follows them: every `use` path, every
//! `crate::`/`super::`/`self::` path and every bare path through a module the file declares
//! (`cuda::forward` in the file that says `mod cuda;`) outside comments and unit-test modules,
//! resolved to the file of the longest module prefix it names (a name taken through a face is
//! an edge to that `mod.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `crate::a::b` for `src/a/b.rs` or `src/a/b/mod.rs`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = vec!["crate".into()];
    parts.extend(rel.iter().map(|p| p.to_string_lossy().into_owned()));
    if parts.last().map(String::as_str) == Some("mod") {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its `#[cfg(test)] mod tests` block.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a `use` tree names: `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    // `x as y` keeps `x`; then whitespace goes.
    let tree: String = tree.replace(" as ", "@").split_whitespace().collect();
    let Some(open) = tree.find('{') else {
        return vec![tree.split('@').next().unwrap_or_default().to_string()];
    };
    let head = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.len() - 1];
    let (mut parts, mut depth, mut current) = (Vec::new(), 0, String::new());
    for ch in inner.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(ch);
    }
    parts.push(current);
    parts
        .iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(p))
        .map(|p| {
            if p == "self" {
                head.to_string()
            } else {
                format!("{head}::{p}")
            }
        })
        .collect()
}

/// The module files each file of `src/folder` imports from, within `folder`.
fn import_graph(folder: &str) -> BTreeMap<String, BTreeSet<String>> {
    import_graph_in(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), folder)
}

/// [`import_graph`] of the source tree at `src`.
fn import_graph_in(src: &Path, folder: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = src.to_path_buf();
    let mut files = Vec::new();
    rust_files(&src.join(folder), &mut files);
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| {
            let name = f.strip_prefix(src.join(folder)).unwrap();
            (module_of(&src, f), name.to_string_lossy().into_owned())
        })
        .collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let here = module_of(&src, file);
        let text = code(&std::fs::read_to_string(file).unwrap());
        let declared: BTreeSet<&str> = text
            .split("mod ")
            .skip(1)
            .filter_map(|rest| rest.split(';').next())
            .filter(|name| name.chars().all(|c| c.is_alphanumeric() || c == '_'))
            .collect();
        let mut paths = Vec::new();
        for statement in text.split(';') {
            // The statement without its attributes: `use …`, `pub use …`, `pub(crate) use …`.
            let statement = statement
                .lines()
                .map(str::trim)
                .filter(|line| !line.starts_with('#'))
                .collect::<Vec<_>>()
                .join(" ");
            let tree = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
                .iter()
                .find_map(|prefix| statement.trim().strip_prefix(prefix));
            for path in tree.map(expand).unwrap_or_default() {
                let first = path.split("::").next().unwrap_or_default();
                paths.push(if declared.contains(first) {
                    format!("self::{path}")
                } else {
                    path
                });
            }
        }
        for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
            let word = word.trim_end_matches(':');
            if ["crate::", "super::", "self::"]
                .iter()
                .any(|p| word.starts_with(p))
            {
                paths.push(word.to_string());
            } else if word.contains("::")
                && declared.contains(word.split("::").next().unwrap_or_default())
            {
                // A path through a child module this file declares, without `self::`.
                paths.push(format!("self::{word}"));
            }
        }
        let mut edges = BTreeSet::new();
        for path in paths {
            let parts: Vec<&str> = path.split("::").collect();
            let mut full: Vec<String> = match parts[0] {
                "crate" => vec!["crate".into()],
                "super" | "self" => {
                    let mut base = here.clone();
                    let mut rest = &parts[..];
                    while rest.first() == Some(&"super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    if rest.first() == Some(&"self") {
                        rest = &rest[1..];
                    }
                    base.extend(rest.iter().map(|s| s.to_string()));
                    edges_target(&modules, &base, &here, &mut edges);
                    continue;
                }
                _ => continue,
            };
            full.extend(parts[1..].iter().map(|s| s.to_string()));
            edges_target(&modules, &full, &here, &mut edges);
        }
        graph.insert(modules[&here].clone(), edges);
    }
    graph
}

/// Adds the file of the longest module prefix of `path` (other than `here`) to `edges`.
fn edges_target(
    modules: &BTreeMap<Vec<String>, String>,
    path: &[String],
    here: &[String],
    edges: &mut BTreeSet<String>,
) {
    for k in (1..=path.len()).rev() {
        if let Some(file) = modules.get(&path[..k]) {
            if path[..k] != *here {
                edges.insert(file.clone());
            }
            return;
        }
    }
}

/// The files on a cycle of `graph`, if any (depth-first search for a back edge).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            return Some(stack[at..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, stack, done) {
                return Some(found);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_loss_and_exact_modules_have_no_import_cycle() {
    for folder in ["loss", "exact"] {
        let graph = import_graph(folder);
        assert!(
            graph.len() > 5,
            "src/{folder}: read only {} files",
            graph.len()
        );
        if let Some(files) = cycle(&graph) {
            panic!("src/{folder}: import cycle through {files:?}\n{graph:#?}");
        }
    }
}

/// The reader finds what it must: a face that defines a name its child imports through it (the
/// old `loss/mod.rs` pattern) is a cycle, a child importing from a sibling's file is not.
#[test]
fn the_reader_finds_a_cycle_through_a_face() {
    let root = std::env::temp_dir().join(format!("candle-bleu-layout-{}", std::process::id()));
    let src = root.join("src");
    std::fs::create_dir_all(src.join("m")).unwrap();
    let write = |path: &str, text: &str| std::fs::write(src.join(path), text).unwrap();
    write(
        "m/mod.rs",
        "mod a;\nmod b;\npub use a::run;\npub struct Config;\n",
    );
    write("m/a.rs", "use super::Config;\npub fn run(_: Config) {}\n");
    write("m/b.rs", "use super::a::run; // a comment: super::Config\n");
    let graph = import_graph_in(&src, "m");
    assert_eq!(
        graph["b.rs"],
        BTreeSet::from(["a.rs".to_string()]),
        "{graph:?}"
    );
    let found = cycle(&graph).expect("the face and a.rs import each other");
    assert_eq!(found.len(), 2, "{found:?}");
    // With the shared type in a leaf file the cycle is gone.
    write(
        "m/mod.rs",
        "mod a;\nmod b;\nmod config;\npub use a::run;\npub use config::Config;\n",
    );
    write("m/config.rs", "pub struct Config;\n");
    write(
        "m/a.rs",
        "use super::config::Config;\npub fn run(_: Config) {}\n",
    );
    assert_eq!(cycle(&import_graph_in(&src, "m")), None);
    std::fs::remove_dir_all(&root).unwrap();
}

/// A bare path through a declared child module (`a::run()` in the file that says `mod a;`) is
/// an edge too: a face that defines a name its child imports and calls the child back by such a
/// path (the old `kernels/mod.rs` and `kernels/cuda.rs`) is a cycle.
#[test]
fn the_reader_finds_a_cycle_through_a_bare_child_path() {
    let root = std::env::temp_dir().join(format!("candle-bleu-layout-bare-{}", std::process::id()));
    let src = root.join("src");
    std::fs::create_dir_all(src.join("m")).unwrap();
    let write = |path: &str, text: &str| std::fs::write(src.join(path), text).unwrap();
    write(
        "m/mod.rs",
        "mod a;\npub struct Op;\nimpl Op {\n    fn call(&self) {\n        a::run(self);\n    }\n}\n",
    );
    write("m/a.rs", "use super::Op;\npub fn run(_: &Op) {}\n");
    let graph = import_graph_in(&src, "m");
    assert_eq!(
        graph["mod.rs"],
        BTreeSet::from(["a.rs".to_string()]),
        "{graph:?}"
    );
    let found = cycle(&graph).expect("mod.rs calls a.rs, which imports mod.rs");
    assert_eq!(found.len(), 2, "{found:?}");
    // Passing what the child needs instead of the type it would import: no cycle.
    write("m/a.rs", "pub fn run(_: usize) {}\n");
    write(
        "m/mod.rs",
        "mod a;\npub struct Op(usize);\nimpl Op {\n    fn call(&self) {\n        a::run(self.0);\n    }\n}\n",
    );
    let graph = import_graph_in(&src, "m");
    assert_eq!(graph["mod.rs"], BTreeSet::from(["a.rs".to_string()]));
    assert_eq!(cycle(&graph), None);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn the_kernels_import_no_loss_configuration_and_no_dispatch() {
    let graph = import_graph("loss");
    for (file, edges) in &graph {
        if file.starts_with("kernels/") {
            for forbidden in [
                "config.rs",
                "checked/mod.rs",
                "checked/logits.rs",
                "checked/hidden.rs",
                "checked/hypotheses.rs",
                "checked/targets.rs",
                "checked/calls.rs",
                "checked/stats.rs",
                "checked/ctc.rs",
                "dispatch.rs",
                "pipeline.rs",
                "mod.rs",
                "bleu.rs",
                "training.rs",
                "hidden.rs",
                "cross_entropy.rs",
                "ctc.rs",
            ] {
                assert!(
                    !edges.contains(forbidden),
                    "{file} imports {forbidden}: {edges:?}"
                );
            }
        }
    }
    // Files import a name from the file that defines it: none goes through a face.
    for (file, edges) in &graph {
        for face in ["mod.rs", "checked/mod.rs"] {
            assert!(
                !edges.contains(face),
                "{file} imports through loss/{face}: {edges:?}"
            );
        }
    }
}

/// The layers of `src/loss/`, bottom up (docs/design.md): a file imports only from its own layer
/// or the layers below it, so nothing points back up.
const LOSS_LAYERS: [&[&str]; 9] = [
    // Configs, output types, counted host copies, the collective's trait.
    &["config.rs", "host.rs", "all_reduce.rs"],
    // The kernels: plain parameters, no loss config. The shared bottom, then the families
    // (`row/`, `hidden/`, `ctc/`), which import the bottom and never each other.
    &[
        "kernels/float.rs",
        "kernels/backward.rs",
        "kernels/layout.rs",
        "kernels/gemm.rs",
        "kernels/cpu.rs",
        "kernels/composed.rs",
        "kernels/softcap.rs",
        "kernels/launch.rs",
        "kernels/cuda.rs",
        "kernels/emu/mod.rs",
        "kernels/emu/module.rs",
        "kernels/emu/tests.rs",
        "kernels/emu/ctc_tests.rs",
        "kernels/emu/ngram_tests.rs",
        "kernels/emu/log_softmax_tests.rs",
        "kernels/row/mod.rs",
        "kernels/row/op.rs",
        "kernels/row/launch.rs",
        "kernels/row/cuda.rs",
        "kernels/row/log_softmax.rs",
        "kernels/hidden/mod.rs",
        "kernels/hidden/op.rs",
        "kernels/hidden/cpu.rs",
        "kernels/hidden/composed.rs",
        "kernels/ctc/mod.rs",
        "kernels/ctc/op.rs",
        "kernels/ctc/composed.rs",
        "kernels/ctc/launch.rs",
        "kernels/ctc/cuda.rs",
        "kernels/ctc/ngrams.rs",
        "kernels/ctc/ngrams_composed.rs",
        "kernels/ctc/ngrams_launch.rs",
        "kernels/ctc/ngrams_cuda.rs",
        "kernels/score/mod.rs",
        "kernels/score/args.rs",
        "kernels/score/op.rs",
        "kernels/score/launch.rs",
        "kernels/score/cuda.rs",
        "kernels/emu/score_tests.rs",
        "kernels/matches/mod.rs",
        "kernels/matches/args.rs",
        "kernels/matches/op.rs",
        "kernels/matches/launch.rs",
        "kernels/matches/cuda.rs",
        "kernels/emu/matches_tests.rs",
        "kernels/mod.rs",
    ],
    // The statistics.
    &[
        "products.rs",
        "references.rs",
        "length.rs",
        "forms.rs",
        "score.rs",
    ],
    // The one choice of path and the one validation, by kind of input.
    &[
        "dispatch.rs",
        "checked/logits.rs",
        "checked/hidden.rs",
        "checked/hypotheses.rs",
        "checked/targets.rs",
        "checked/calls.rs",
        "checked/stats.rs",
        "checked/ctc.rs",
        "checked/mod.rs",
    ],
    // The passes.
    &["pipeline.rs", "hidden_pass.rs", "ctc_pass.rs"],
    // The reduction: local or over a data-parallel group, then the score.
    &["reduce.rs"],
    // The one path every loss takes: validation, pass, statistics, reduction.
    &["run.rs"],
    // The entry points.
    &[
        "bleu.rs",
        "cross_entropy.rs",
        "training.rs",
        "hidden.rs",
        "ctc_bleu.rs",
        "ctc_fmeasure.rs",
        "ctc.rs",
    ],
    // Data-parallel training: the group's entry points, the back-ends, the gradient helpers.
    &[
        "distributed/mod.rs",
        "distributed/thread.rs",
        "distributed/mpi_impl.rs",
        "distributed/nccl_impl.rs",
    ],
];

/// The kernel families (`kernels/row/`, `kernels/hidden/`, `kernels/ctc/`) import the shared
/// bottom (the files directly in `kernels/`) and their own family, never another family; the
/// bottom imports no family. The emulator's tests (`kernels/emu/`) test every family.
#[test]
fn the_kernel_families_import_only_the_shared_bottom() {
    let graph = import_graph("loss");
    // The reader sees the families' files and their imports of the bottom.
    for (file, target) in [
        ("kernels/hidden/cpu.rs", "kernels/cpu.rs"),
        ("kernels/ctc/op.rs", "kernels/float.rs"),
        ("kernels/row/op.rs", "kernels/layout.rs"),
    ] {
        assert!(graph[file].contains(target), "{file}: {:?}", graph[file]);
    }
    let family = |file: &str| -> Option<String> {
        let rest = file.strip_prefix("kernels/")?;
        let (folder, _) = rest.split_once('/')?;
        (folder != "emu").then(|| folder.to_string())
    };
    for (file, edges) in &graph {
        if !file.starts_with("kernels/") || file.starts_with("kernels/emu/") {
            continue;
        }
        for target in edges.iter().filter(|t| t.starts_with("kernels/")) {
            if let Some(theirs) = family(target) {
                assert_eq!(
                    family(file).as_deref(),
                    Some(theirs.as_str()),
                    "src/loss/{file} imports {target}, another family's file"
                );
            }
        }
    }
}

#[test]
fn nothing_in_the_loss_imports_from_a_layer_above() {
    let graph = import_graph("loss");
    let layer_of = |file: &str| LOSS_LAYERS.iter().position(|layer| layer.contains(&file));
    for (file, edges) in &graph {
        if file == "mod.rs" {
            continue;
        }
        let Some(here) = layer_of(file) else {
            panic!(
                "src/loss/{file} is in no layer of LOSS_LAYERS: add it there and to docs/design.md"
            );
        };
        for target in edges {
            let there = layer_of(target).unwrap_or(usize::MAX);
            assert!(
                there <= here,
                "src/loss/{file} (layer {here}) imports {target} (layer {there}), a layer above"
            );
        }
    }
}

#[test]
fn the_faces_only_declare_and_reexport() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for face in [
        "loss/mod.rs",
        "loss/checked/mod.rs",
        "loss/kernels/mod.rs",
        "loss/kernels/row/mod.rs",
        "loss/kernels/hidden/mod.rs",
        "loss/kernels/ctc/mod.rs",
        "loss/kernels/score/mod.rs",
        "loss/kernels/matches/mod.rs",
        "loss/kernels/emu/mod.rs",
        "exact/mod.rs",
        "exact/chrf/mod.rs",
    ] {
        let text = code(&std::fs::read_to_string(src.join(face)).unwrap());
        for line in text.lines().map(str::trim) {
            assert!(
                !(line.starts_with("pub fn")
                    || line.starts_with("fn ")
                    || line.starts_with("pub(crate) fn")),
                "{face} defines a function: {line}"
            );
        }
    }
}
