//! The NAT study (`nat --quick`) end to end on a catalogue this test writes itself: it exits 0,
//! every run it reports names gzipped outputs whose re-scored BLEU (13a) and chrF equal the
//! reported ones, every condition, objective and variant is there, the statistics cover the
//! compared objectives, and `--resume` continues from the checkpoints without training again.

mod common;

use candle_bleu_research::data::mo::MoWriter;
use candle_bleu_research::nat::files::read_lines_gz;
use common::{check_13a_scores, run_example};
use std::path::Path;

/// A French catalogue of 300 messages (the study's default language is German: this checks
/// `--lang`).
fn write_catalogue(dir: &Path) {
    let verbs = [
        ("open", "ouvrir"),
        ("read", "lire"),
        ("write", "écrire"),
        ("delete", "supprimer"),
        ("copy", "copier"),
        ("move", "déplacer"),
        ("create", "créer"),
        ("find", "trouver"),
        ("save", "enregistrer"),
        ("load", "charger"),
    ];
    let objects = [
        ("file", "le fichier"),
        ("directory", "le répertoire"),
        ("link", "le lien"),
        ("archive", "l'archive"),
        ("device", "le périphérique"),
        ("key", "la clé"),
        ("table", "la table"),
        ("index", "l'index"),
        ("user", "l'utilisateur"),
        ("group", "le groupe"),
    ];
    let mut writer = MoWriter::new().header("Content-Type: text/plain; charset=UTF-8\n");
    for (verb, verb_fr) in verbs {
        for (object, object_fr) in objects {
            writer = writer
                .message(
                    &format!("Cannot {verb} the {object} %s"),
                    &format!("Impossible de {verb_fr} {object_fr} %s"),
                )
                .message(
                    &format!("Do you want to {verb} this {object}?"),
                    &format!("Voulez-vous {verb_fr} {object_fr} ?"),
                )
                .message(
                    &format!("Failed to {verb} the {object} now"),
                    &format!("Échec : impossible de {verb_fr} {object_fr} maintenant"),
                );
        }
    }
    let messages = dir.join("fr").join("LC_MESSAGES");
    std::fs::create_dir_all(&messages).unwrap();
    std::fs::write(messages.join("test.mo"), writer.to_bytes()).unwrap();
}

fn run(args: &[&str]) -> (bool, String, String) {
    run_example("nat", args)
}

#[test]
fn quick_nat_study_is_reproducible_from_its_files() {
    let dir = std::env::temp_dir().join(format!("candle-bleu-nat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_catalogue(&dir);
    let (out, work, none) = (dir.join("out"), dir.join("work"), dir.join("none"));
    let args = [
        "--quick",
        "--lang",
        "fr",
        "--catalogs",
        dir.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--work",
        work.to_str().unwrap(),
        "--translate-run",
        none.to_str().unwrap(),
        "--cpu",
    ];
    let started = std::time::Instant::now();
    let (ok, stdout, stderr) = run(&args);
    assert!(ok, "nat --quick failed\n{stdout}\n{stderr}");
    eprintln!("nat --quick took {:.1} s", started.elapsed().as_secs_f64());
    assert!(stdout.contains("| distilled | BLEU"), "{stdout}");
    assert!(stdout.contains("plan (estimated"), "{stdout}");

    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["study"], "nat");
    assert_eq!(results["corpus"]["pairs"], 300);
    assert_eq!(results["bon2_grid"].as_array().unwrap().len(), 6);
    assert!(results["teacher"]["origin"]
        .as_str()
        .unwrap()
        .starts_with("trained"));
    let runs = results["runs"].as_array().unwrap();
    // The teacher, then 8 variants of: 2 distilled seeds × (baseline, ce, bon2, bleu4) and
    // 1 raw seed × (baseline, ce, bon2).
    assert_eq!(runs.len(), 1 + 8 * (2 * 4 + 3));
    let references = read_lines_gz(&out.join("test.ref.gz")).unwrap();
    assert!(!references.is_empty());
    for run in runs {
        let file = run["test_hyp"].as_str().unwrap();
        assert!(file.ends_with(".gz"), "{run}");
        check_13a_scores(run, &read_lines_gz(&out.join(file)).unwrap(), &references);
        if run["dedup"] == true {
            assert_eq!(run["repetition_share"].as_f64().unwrap(), 0.0, "{run}");
        }
        let share = run["repetition_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{run}");
    }
    for (condition, objective, variant) in [
        ("distilled", "bon2", "l5+dedup"),
        ("distilled", "bleu4", "oracle"),
        ("raw", "ce", "l1+dedup"),
        ("raw", "bon2", "l3"),
    ] {
        let n = runs
            .iter()
            .filter(|r| {
                r["condition"] == condition
                    && r["objective"] == objective
                    && r["variant"] == variant
            })
            .count();
        assert_eq!(
            n,
            if condition == "raw" { 1 } else { 2 },
            "{condition} {objective} {variant}"
        );
    }
    let tests = &results["paired_t_vs_ce"]["l5+dedup"]["test_bleu"];
    assert_eq!(tests.as_array().unwrap().len(), 2, "{tests}");
    assert_eq!(
        results["paired_bootstrap_vs_ce"]["distilled"]
            .as_array()
            .unwrap()
            .len(),
        2 * 2
    );
    assert_eq!(results["speed"].as_array().unwrap().len(), 8);
    let distilled = read_lines_gz(&out.join("distilled.ids.gz")).unwrap();
    assert_eq!(
        distilled.len(),
        results["distillation"]["pairs"].as_u64().unwrap() as usize
            + results["distillation"]["empty_outputs_left_out"]
                .as_u64()
                .unwrap() as usize
    );

    // Resuming a finished study trains nothing and reports the same numbers.
    let log_rows = std::fs::read_to_string(out.join("log.csv"))
        .unwrap()
        .lines()
        .count();
    let mut resume_args = args.to_vec();
    resume_args.push("--resume");
    let (ok, stdout, stderr) = run(&resume_args);
    assert!(ok, "nat --quick --resume failed\n{stdout}\n{stderr}");
    assert_eq!(
        std::fs::read_to_string(out.join("log.csv"))
            .unwrap()
            .lines()
            .count(),
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
