//! The corpus builder on catalogues the test writes itself (no system catalogues needed):
//! every skip reason counted, the duplicate rule, normalisation, the SHA-256 split and hashes,
//! independence of catalogue order, stability when catalogues are added, and the directory
//! reader. The expected hashes were cross-checked with an independent Python implementation
//! (`research/scripts/corpus_reference.py`) run on the same files.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use candle_bleu_research::data::corpus::{
    build_corpus, corpus_from_files, pairs_sha256, split_of, Corpus, CorpusConfig, CorpusSummary,
    Pair, Split,
};
use candle_bleu_research::data::mo::{ByteOrder, MoWriter, SysdepPiece};
use sha2::{Digest, Sha256};

const UTF8: &str = "Content-Type: text/plain; charset=UTF-8\n";

fn pair(s: &str, t: &str) -> Pair {
    Pair {
        source: s.into(),
        target: t.into(),
    }
}

/// Five catalogues and two files the builder must set aside.
fn catalogues() -> Vec<(String, Vec<u8>)> {
    let a = MoWriter::new()
        .header(UTF8)
        .message("Cannot open file %s", "Datei %s kann nicht geöffnet werden")
        .message("  Could not\tread   the\u{a0}file ", " Die  Datei konnte\u{202f}nicht gelesen werden ")
        .message("Use {name} as the name", "{name} als Namen verwenden")
        .message("Remove the file %1$s", "Die Datei %1$s entfernen")
        .message("Save all files", "Alle Dateien speichern")
        .context("menu", "Close the window", "Fenster schließen")
        .plural("%d file removed", "%d files removed", &["%d Datei entfernt", "%d Dateien entfernt"])
        .message("Usage: prog FILE\nRead FILE.\n", "Aufruf: prog DATEI\nDATEI lesen.\n")
        .message("Trailing newline only is fine\n", "Nur ein Zeilenende am Schluss ist in Ordnung\n")
        .message("Two words", "Zwei Wörter")
        .message("Version 1.2.3 of gzip", "Version 1.2.3 of gzip")
        .message("Beep the \u{7} bell", "Die \u{7} Glocke")
        .message("Report bugs to: %s", "Melden Sie Programmfehler (auf Englisch, mit LC_ALL=C) an %s. Melden Sie Übersetzungsfehler an <translation-team-de@lists.sourceforge.net>.")
        .message(&vec!["word"; 31].join(" "), &vec!["Wort"; 31].join(" "))
        .message(&vec!["word"; 30].join(" "), &vec!["Wort"; 30].join(" "))
        .message("A message without translation", "")
        .to_bytes();
    // Big-endian, revision 1: a system-dependent string and conflicting translations.
    let b = MoWriter::new()
        .byte_order(ByteOrder::Big)
        .header(UTF8)
        .message("Save all files", "Alle Dateien sichern")
        .message("Cannot open file %s", "Kann Datei %s nicht öffnen")
        .message("Remove the file %1$s", "Datei %1$s wegnehmen")
        .sysdep(
            &[
                SysdepPiece::Text(b"%".to_vec()),
                SysdepPiece::Segment("PRIdMAX".into()),
                SysdepPiece::Text(b" bytes copied".to_vec()),
            ],
            &[
                SysdepPiece::Text(b"%".to_vec()),
                SysdepPiece::Segment("PRIdMAX".into()),
                SysdepPiece::Text(b" Bytes kopiert".to_vec()),
            ],
        )
        .to_bytes();
    let c = MoWriter::new()
        .header(UTF8)
        .message("Save all files", "Alle Dateien sichern")
        .message("Cannot open file %s", "Datei %s kann nicht geöffnet werden")
        .context("dialog", "Close the window", "Das Fenster schließen")
        .to_bytes();
    // ISO-8859-1 declared: decoded, not skipped.
    let d = MoWriter::new()
        .header("Content-Type: text/plain; charset=ISO-8859-1\n")
        .raw(
            b"Could not create the directory",
            b"Verzeichnis konnte nicht erstellt werden",
        )
        .raw(b"Remove the file %1$s", b"Datei %1$s l\xf6schen")
        .to_bytes();
    let iso = MoWriter::new()
        .header(UTF8)
        .message("Bosnia and Herzegovina", "Bosnien und Herzegowina")
        .to_bytes();
    vec![
        ("a.mo".into(), a),
        ("b.mo".into(), b),
        ("c.mo".into(), c),
        ("d.mo".into(), d),
        ("iso_3166-1.mo".into(), iso),
        (
            "broken.mo".into(),
            b"\x95\x04\x12\xde\x00\x00\x00\x00\x00\x00".to_vec(),
        ),
    ]
}

fn build(files: &[(String, Vec<u8>)]) -> Corpus {
    corpus_from_files(files, &CorpusConfig::default()).unwrap()
}

fn all_pairs(c: &Corpus) -> BTreeMap<String, (String, Split)> {
    let mut m = BTreeMap::new();
    for split in Split::ALL {
        for p in c.split(split) {
            assert!(
                m.insert(p.source.clone(), (p.target.clone(), split))
                    .is_none(),
                "{:?} is in two splits",
                p.source
            );
        }
    }
    m
}

#[test]
fn pairs_counts_and_the_duplicate_rule() {
    let c = build(&catalogues());
    let pairs = all_pairs(&c);
    let expected: BTreeMap<String, String> = [
        // a + c agree (2 votes) against b (1).
        ("Cannot open file %s", "Datei %s kann nicht geöffnet werden"),
        // Whitespace runs (tab, no-break spaces, several spaces) become one space.
        (
            "Could not read the file",
            "Die Datei konnte nicht gelesen werden",
        ),
        ("Use {name} as the name", "{name} als Namen verwenden"),
        // One vote each for three translations: the smallest in byte order.
        ("Remove the file %1$s", "Datei %1$s l\u{f6}schen"),
        // b + c (2 votes) against a (1).
        ("Save all files", "Alle Dateien sichern"),
        // Two contexts, one vote each: the smallest translation.
        ("Close the window", "Das Fenster schließen"),
        (
            "Trailing newline only is fine",
            "Nur ein Zeilenende am Schluss ist in Ordnung",
        ),
        ("%ld bytes copied", "%ld Bytes kopiert"),
        (
            "Could not create the directory",
            "Verzeichnis konnte nicht erstellt werden",
        ),
        (&*vec!["word"; 30].join(" "), &*vec!["Wort"; 30].join(" ")),
    ]
    .into_iter()
    .map(|(s, t)| (s.to_string(), t.to_string()))
    .collect();
    let got: BTreeMap<String, String> = pairs
        .iter()
        .map(|(s, (t, _))| (s.clone(), t.clone()))
        .collect();
    assert_eq!(got, expected);

    let s = &c.summary;
    assert_eq!(s.excluded, ["iso_3166-1.mo"]);
    let names: Vec<&str> = s.catalogues.iter().map(|c| c.file.as_str()).collect();
    assert_eq!(names, ["a.mo", "b.mo", "broken.mo", "c.mo", "d.mo"]);
    let broken = &s.catalogues[2];
    assert_eq!(
        broken.error.as_deref(),
        Some("broken.mo: header field `number of strings` at offset 8 (4 bytes) lies outside the file (10 bytes)")
    );
    let a = &s.catalogues[0];
    assert_eq!(a.messages, 16);
    assert_eq!(a.context_kept, 1);
    assert_eq!(a.skipped.plural, 1);
    assert_eq!(a.skipped.multi_line, 1);
    assert_eq!(a.skipped.empty, 1); // msgfmt would drop it; a hand-made file may not
    assert_eq!(a.skipped.untranslated, 1);
    assert_eq!(a.skipped.control, 1);
    assert_eq!(a.skipped.length, 2); // 2 words, 31 words
    assert_eq!(a.skipped.ratio, 1);
    assert_eq!(a.candidates, 8);
    let b = &s.catalogues[1];
    assert_eq!(
        (b.revision.as_str(), b.sysdep_expanded, b.candidates),
        ("0.1", 1, 4)
    );
    assert_eq!(s.catalogues[4].charset, "windows-1252");
    assert_eq!(s.messages, 16 + 4 + 3 + 2);
    assert_eq!(s.candidates, 8 + 4 + 3 + 2);
    assert_eq!(s.context_kept, 2);
    assert_eq!(s.pairs, 10);
    assert_eq!(s.duplicate, 17 - 10);
    // Cannot open, Save all, Remove, Close the window.
    assert_eq!(s.conflicting_sources, 4);
    assert_eq!(s.skipped.total(), 8);
    assert_eq!(s.train.pairs + s.dev.pairs + s.test.pairs, 10);
}

#[test]
fn hashes_are_sha256_of_the_sorted_pairs() {
    let c = build(&catalogues());
    let mut all: Vec<Pair> = Split::ALL
        .iter()
        .flat_map(|&s| c.split(s).to_vec())
        .collect();
    all.sort();
    let text: String = all
        .iter()
        .map(|p| format!("{}\t{}\n", p.source, p.target))
        .collect();
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(c.summary.sha256, hex(&Sha256::digest(text.as_bytes())));
    assert_eq!(c.summary.sha256, pairs_sha256(&all));
    // The same value from research/scripts/corpus_reference.py on these files (written out
    // with CORPUS_TEST_DUMP=DIR, then `corpus_reference.py DIR de`).
    if let Ok(dir) = std::env::var("CORPUS_TEST_DUMP") {
        let dir = PathBuf::from(dir).join("de/LC_MESSAGES");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in catalogues() {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    assert_eq!(
        c.summary.sha256,
        "651febb385578a506796e451db550f37b0174b30e1c7e614b181b95b524e8ea0"
    );
    for split in Split::ALL {
        let summary = match split {
            Split::Train => &c.summary.train,
            Split::Dev => &c.summary.dev,
            Split::Test => &c.summary.test,
        };
        assert_eq!(summary.sha256, pairs_sha256(c.split(split)));
        assert_eq!(summary.pairs, c.split(split).len());
    }
    assert_eq!(pairs_sha256(&[]), hex(&Sha256::digest(b"")));
    // Sorting is by source then target, as bytes.
    assert_eq!(
        pairs_sha256(&[pair("b", "1"), pair("a", "2")]),
        hex(&Sha256::digest(b"a\t2\nb\t1\n"))
    );
}

/// A larger synthetic set: 12 catalogues of 400 messages, overlapping sources.
fn many_catalogues() -> Vec<(String, Vec<u8>)> {
    const WORDS: [&str; 16] = [
        "file",
        "open",
        "close",
        "read",
        "write",
        "cannot",
        "the",
        "a",
        "directory",
        "remove",
        "link",
        "create",
        "missing",
        "option",
        "value",
        "name",
    ];
    let mut seed = 7u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
    (0..12)
        .map(|k| {
            let mut w = MoWriter::new().header(UTF8);
            for _ in 0..400 {
                let n = 2 + next() % 6;
                let src: Vec<&str> = (0..n).map(|_| WORDS[next() % WORDS.len()]).collect();
                let src = src.join(" ");
                let tgt = format!("{} [{}]", src.to_uppercase(), next() % 3);
                w = w.message(&src, &tgt);
            }
            (format!("cat{k:02}.mo"), w.to_bytes())
        })
        .collect()
}

#[test]
fn catalogue_order_does_not_matter() {
    for files in [catalogues(), many_catalogues()] {
        let reference = build(&files);
        assert!(reference.summary.pairs > 0);
        let mut shuffled = files.clone();
        let mut seed = 1u64;
        for _ in 0..5 {
            // Fisher-Yates with a fixed LCG.
            for i in (1..shuffled.len()).rev() {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                shuffled.swap(i, (seed >> 33) as usize % (i + 1));
            }
            let c = build(&shuffled);
            assert_eq!(c.train, reference.train);
            assert_eq!(c.dev, reference.dev);
            assert_eq!(c.test, reference.test);
            assert_eq!(c.summary, reference.summary);
        }
        let mut reversed = files.clone();
        reversed.reverse();
        assert_eq!(build(&reversed).summary, reference.summary);
    }
}

#[test]
fn splits_are_disjoint_stable_and_hash_ordered() {
    let files = many_catalogues();
    let full = build(&files);
    let pairs = all_pairs(&full); // panics if a source is in two splits
    assert_eq!(pairs.len(), full.summary.pairs);
    let cfg = CorpusConfig::default();
    for (source, (_, split)) in &pairs {
        assert_eq!(split_of(source, &cfg), *split);
    }
    // Near-duplicates (case, punctuation) share a split.
    assert_eq!(
        split_of("Cannot open the file.", &cfg),
        split_of("cannot open the file", &cfg)
    );
    // About 5 % dev and 5 % test.
    let n = full.summary.pairs as f64;
    assert!(n > 2000.0, "{n}");
    for size in [full.summary.dev.pairs, full.summary.test.pairs] {
        let share = size as f64 / n;
        assert!((0.03..0.07).contains(&share), "{share}");
    }
    // Fewer catalogues: every source they share keeps its split.
    let part = build(&files[..5]);
    let part_pairs = all_pairs(&part);
    assert!(part_pairs.len() < pairs.len());
    for (source, (_, split)) in &part_pairs {
        assert_eq!(pairs[source].1, *split, "{source:?} moved");
    }
    // A prefix of a split is the same whichever catalogues were read: within a split, pairs
    // are ordered by the SHA-256 of their split key, so the part's order is a subsequence.
    let position: HashMap<&str, usize> = full
        .train
        .iter()
        .enumerate()
        .map(|(i, p)| (p.source.as_str(), i))
        .collect();
    let order: Vec<usize> = part
        .train
        .iter()
        .map(|p| position[p.source.as_str()])
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn config_changes_what_is_kept() {
    let files = catalogues();
    let no_ratio = corpus_from_files(
        &files,
        &CorpusConfig {
            max_length_ratio: None,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(no_ratio.summary.skipped.ratio, 0);
    assert_eq!(no_ratio.summary.pairs, 11);
    let no_contexts = corpus_from_files(
        &files,
        &CorpusConfig {
            keep_contexts: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(no_contexts.summary.skipped.context, 2);
    assert_eq!(no_contexts.summary.context_kept, 0);
    assert!(!all_pairs(&no_contexts).contains_key("Close the window"));
    let short = corpus_from_files(
        &files,
        &CorpusConfig {
            min_words: 2,
            max_words: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let kept = all_pairs(&short);
    assert!(kept.contains_key("Two words"));
    assert!(kept.keys().all(|s| (2..=3).contains(&s.split(' ').count())));
    let everything_test = corpus_from_files(
        &files,
        &CorpusConfig {
            test_per_mille: 1000,
            dev_per_mille: 0,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(everything_test.test.len(), 10);
    let all_train = corpus_from_files(
        &files,
        &CorpusConfig {
            exclude_prefixes: vec![],
            test_per_mille: 0,
            dev_per_mille: 0,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(all_train.train.len(), 11); // the iso_ list's pair included
    let dup = vec![files[0].clone(), files[0].clone()];
    let err = corpus_from_files(&dup, &CorpusConfig::default()).unwrap_err();
    assert_eq!(err.to_string(), "catalogue file name \"a.mo\" given twice");
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "candle-bleu-research-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn build_corpus_reads_lang_lc_messages() {
    let root = temp_dir("catalogs");
    let de = root.join("de/LC_MESSAGES");
    std::fs::create_dir_all(&de).unwrap();
    for (name, bytes) in catalogues() {
        std::fs::write(de.join(name), bytes).unwrap();
    }
    std::fs::write(de.join("README.txt"), "not a catalogue").unwrap();
    // A regional variant is another language directory, not read for `de`.
    let ch = root.join("de_CH/LC_MESSAGES");
    std::fs::create_dir_all(&ch).unwrap();
    std::fs::write(
        ch.join("x.mo"),
        MoWriter::new()
            .message("Regional only source", "Nur regional")
            .to_bytes(),
    )
    .unwrap();
    let cfg = CorpusConfig {
        catalogs: root.clone(),
        ..Default::default()
    };
    let c = build_corpus(&cfg).unwrap();
    let from_memory = build(&catalogues());
    assert_eq!(c.summary.sha256, from_memory.summary.sha256);
    assert_eq!(c.summary.catalogues, from_memory.summary.catalogues);
    assert_eq!(c.summary.config.catalogs, root);

    // The summary prints and round-trips through JSON.
    let text = c.summary.to_string();
    assert!(text.starts_with("corpus en-de: 5 catalogues in "), "{text}");
    assert!(
        text.contains("(1 failed to parse, 1 excluded by name), 25 messages"),
        "{text}"
    );
    assert!(text.contains("pairs: 10 (train "), "{text}");
    assert!(text.contains(&c.summary.sha256));
    let table = format!("{:#}", c.summary);
    let row = format!("  {:<32} error: broken.mo: header field", "broken.mo");
    assert!(table.contains(&row), "{table}");
    assert!(table.ends_with("excluded: iso_3166-1.mo"), "{table}");
    let back: CorpusSummary = serde_json::from_str(&c.summary.to_json()).unwrap();
    assert_eq!(back, c.summary);

    // Written splits read back as the same pairs.
    let out = root.join("out");
    c.write(&out).unwrap();
    for split in Split::ALL {
        let text = std::fs::read_to_string(out.join(format!("{split}.tsv"))).unwrap();
        let read: Vec<Pair> = text
            .lines()
            .map(|l| {
                let (s, t) = l.split_once('\t').unwrap();
                pair(s, t)
            })
            .collect();
        assert_eq!(read, c.split(split));
    }
    let json = std::fs::read_to_string(out.join("corpus.json")).unwrap();
    assert_eq!(
        serde_json::from_str::<CorpusSummary>(&json).unwrap(),
        c.summary
    );

    let ch_only = build_corpus(&CorpusConfig {
        lang: "de_CH".into(),
        ..cfg.clone()
    })
    .unwrap();
    assert_eq!(ch_only.summary.pairs, 1);

    let err = build_corpus(&CorpusConfig {
        lang: "fr".into(),
        ..cfg.clone()
    })
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("reading the catalogues of \"fr\" in "),
        "{msg}"
    );
    assert!(msg.contains("fr/LC_MESSAGES"), "{msg}");
    assert!(msg.contains("scripts/fetch-catalogs.sh"), "{msg}");
    std::fs::create_dir_all(root.join("ko/LC_MESSAGES")).unwrap();
    let err = build_corpus(&CorpusConfig {
        lang: "ko".into(),
        ..cfg
    })
    .unwrap_err();
    assert!(err.to_string().starts_with("no .mo files in "), "{err}");
    std::fs::remove_dir_all(&root).unwrap();
}
