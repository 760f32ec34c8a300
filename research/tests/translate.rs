//! The real-data study (`translate --quick`) end to end on a catalogue this test writes itself
//! (so CI needs no system catalogues): it exits 0, writes every file its results name, each
//! reported score equals `exact`'s score of the written files, and `--resume` continues from
//! the checkpoints without training again.

mod common;

use candle_bleu::exact::chrf::{corpus_chrf, ChrfConfig};
use candle_bleu_research::data::mo::MoWriter;
use common::{check_13a_scores, run_example};
use std::path::Path;

const VERBS: [(&str, &str); 10] = [
    ("open", "öffnen"),
    ("read", "lesen"),
    ("write", "schreiben"),
    ("delete", "löschen"),
    ("copy", "kopieren"),
    ("move", "verschieben"),
    ("create", "erstellen"),
    ("find", "finden"),
    ("save", "speichern"),
    ("load", "laden"),
];
const OBJECTS: [(&str, &str); 12] = [
    ("file", "Datei"),
    ("directory", "Verzeichnis"),
    ("link", "Verknüpfung"),
    ("archive", "Archiv"),
    ("device", "Gerät"),
    ("socket", "Socket"),
    ("pipe", "Pipe"),
    ("key", "Schlüssel"),
    ("table", "Tabelle"),
    ("index", "Index"),
    ("user", "Benutzer"),
    ("group", "Gruppe"),
];

/// A catalogue of 480 messages in two templates, as gettext's `msgfmt` would write it.
fn write_catalogue(dir: &Path) {
    let mut writer = MoWriter::new().header("Content-Type: text/plain; charset=UTF-8\n");
    for (verb, verb_de) in VERBS {
        for (object, object_de) in OBJECTS {
            writer = writer
                .message(
                    &format!("Cannot {verb} the {object} %s"),
                    &format!("{object_de} %s kann nicht {verb_de} werden"),
                )
                .message(
                    &format!("Failed to {verb} {object} \"{{name}}\""),
                    &format!("{object_de} „{{name}}“ konnte nicht {verb_de} werden"),
                )
                .message(
                    &format!("Do you want to {verb} this {object}?"),
                    &format!("Möchten Sie diese(s) {object_de} {verb_de}?"),
                )
                .message(
                    &format!("The {object} could not be found, so nothing to {verb}"),
                    &format!("{object_de} nicht gefunden, nichts zu {verb_de}"),
                );
        }
    }
    let messages = dir.join("de").join("LC_MESSAGES");
    std::fs::create_dir_all(&messages).unwrap();
    std::fs::write(messages.join("test.mo"), writer.to_bytes()).unwrap();
}

fn run(args: &[&str]) -> (bool, String, String) {
    run_example("translate", args)
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn quick_study_on_a_written_catalogue_is_reproducible_from_its_files() {
    let dir = std::env::temp_dir().join(format!("candle-bleu-translate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_catalogue(&dir);
    let out = dir.join("out");
    let (catalogs, out_arg) = (dir.to_str().unwrap(), out.to_str().unwrap());
    // Every objective, the paired form (off by default) included.
    let objectives = "expected,lower-bound,paired,mrt";
    let args = [
        "--quick",
        "--catalogs",
        catalogs,
        "--out",
        out_arg,
        "--cpu",
        "--objectives",
        objectives,
    ];
    let (ok, stdout, stderr) = run(&args);
    assert!(ok, "translate --quick failed\n{stdout}\n{stderr}");
    assert!(stdout.contains("| objective | BLEU |"), "{stdout}");

    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["corpus"]["pairs"], 480);
    assert_eq!(results["lambda_grid"].as_array().unwrap().len(), 2);
    assert_eq!(results["mu_grid"].as_array().unwrap().len(), 2);
    let runs = results["runs"].as_array().unwrap();
    // 2 seeds × (baseline, ce, ce+expected, ce+lower-bound, ce+paired, mrt).
    assert_eq!(runs.len(), 12);
    let references = lines(&out.join("test.ref"));
    assert!(!references.is_empty());
    let ref_text: Vec<Vec<String>> = references.iter().map(|r| vec![r.clone()]).collect();
    for run in runs {
        let hyps = lines(&out.join(run["test_hyp"].as_str().unwrap()));
        check_13a_scores(run, &hyps, &references);
        let chrf_pp = corpus_chrf(&hyps, &ref_text, ChrfConfig::chrf_plus_plus()).unwrap();
        assert_eq!(
            run["test_chrf_pp"].as_f64().unwrap(),
            chrf_pp.score,
            "{run}"
        );
    }
    for sweep in results["length_penalty_sweep_of_ce"].as_array().unwrap() {
        assert_eq!(
            lines(&out.join(sweep["test_hyp"].as_str().unwrap())).len(),
            references.len()
        );
    }

    // Resuming a finished study trains nothing and reports the same numbers.
    let log_rows = lines(&out.join("log.csv")).len();
    let mut resume_args = args.to_vec();
    resume_args.push("--resume");
    let (ok, stdout, stderr) = run(&resume_args);
    assert!(ok, "translate --quick --resume failed\n{stdout}\n{stderr}");
    assert_eq!(
        lines(&out.join("log.csv")).len(),
        log_rows,
        "resume trained again"
    );
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    for (a, b) in runs.iter().zip(again["runs"].as_array().unwrap()) {
        assert_eq!(a["test_bleu"], b["test_bleu"]);
        assert_eq!(a["dev_bleu"], b["dev_bleu"]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_catalogue_directory_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!(
        "candle-bleu-translate-empty-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (ok, stdout, stderr) = run(&[
        "--quick",
        "--catalogs",
        dir.to_str().unwrap(),
        "--out",
        dir.join("out").to_str().unwrap(),
    ]);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("LC_MESSAGES"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
