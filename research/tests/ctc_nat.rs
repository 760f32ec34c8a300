//! The CTC NAT study (`ctc_nat --quick`) end to end on a catalogue this test writes itself: it
//! exits 0, writes only under its `--out`, every run it reports names gzipped outputs whose
//! re-scored BLEU (13a) and chrF equal the reported ones, every objective is there for every
//! seed, the statistics compare with `ctc`, the dropped pairs add up, and `--resume` trains
//! nothing again.

mod common;

use candle_bleu_research::data::mo::MoWriter;
use candle_bleu_research::nat::files::read_lines_gz;
use common::{check_13a_scores, run_example};
use std::path::Path;

/// A French catalogue of 240 short messages.
fn write_catalogue(dir: &Path) {
    let actions = [
        ("print", "imprimer"),
        ("rename", "renommer"),
        ("close", "fermer"),
        ("send", "envoyer"),
        ("import", "importer"),
        ("export", "exporter"),
        ("share", "partager"),
        ("lock", "verrouiller"),
    ];
    let things = [
        ("page", "la page"),
        ("message", "le message"),
        ("window", "la fenêtre"),
        ("image", "l'image"),
        ("account", "le compte"),
        ("folder", "le dossier"),
        ("note", "la note"),
        ("project", "le projet"),
        ("session", "la session"),
        ("contact", "le contact"),
    ];
    let mut writer = MoWriter::new().header("Content-Type: text/plain; charset=UTF-8\n");
    for (verb, verb_fr) in actions {
        for (thing, thing_fr) in things {
            writer = writer
                .message(
                    &format!("Unable to {verb} the {thing}"),
                    &format!("Impossible de {verb_fr} {thing_fr}"),
                )
                .message(&format!("{verb} {thing}"), &format!("{verb_fr} {thing_fr}"))
                .message(
                    &format!("Please {verb} the {thing} first"),
                    &format!("Veuillez d'abord {verb_fr} {thing_fr}"),
                );
        }
    }
    let messages = dir.join("fr").join("LC_MESSAGES");
    std::fs::create_dir_all(&messages).unwrap();
    std::fs::write(messages.join("test.mo"), writer.to_bytes()).unwrap();
}

#[test]
fn quick_ctc_nat_study_is_reproducible_from_its_files() {
    let dir = std::env::temp_dir().join(format!("candle-bleu-ctc-nat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_catalogue(&dir);
    let (out, work) = (dir.join("out"), dir.join("work"));
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
        "--cpu",
    ];
    let started = std::time::Instant::now();
    let (ok, stdout, stderr) = run_example("ctc_nat", &args);
    assert!(ok, "ctc_nat --quick failed\n{stdout}\n{stderr}");
    eprintln!(
        "ctc_nat --quick took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(stdout.contains("| distilled | BLEU"), "{stdout}");
    assert!(stdout.contains("plan:"), "{stdout}");
    // The quick teacher lives under --out, so nothing else was written.
    let mut top: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, ["fr", "out", "work"]);
    assert!(out.join("teacher/plateau/teacher/teacher.json").exists());

    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["study"], "ctc_nat");
    assert_eq!(results["model"]["blank"], 1);
    assert_eq!(results["bon2_grid"].as_array().unwrap().len(), 3);
    let runs = results["runs"].as_array().unwrap();
    // The copy baseline, the teacher (greedy, beam), and 2 seeds × (baseline, ctc, ctc+bon2,
    // ctc+bleu4).
    assert_eq!(runs.len(), 1 + 2 + 2 * 4);
    let references = read_lines_gz(&out.join("test.ref.gz")).unwrap();
    assert!(!references.is_empty());
    for run in runs {
        let file = run["test_hyp"].as_str().unwrap();
        assert!(file.ends_with(".gz"), "{run}");
        check_13a_scores(run, &read_lines_gz(&out.join(file)).unwrap(), &references);
        let share = run["repetition_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{run}");
    }
    for objective in ["baseline", "ctc", "ctc+bon2", "ctc+bleu4"] {
        let seeds: Vec<u64> = runs
            .iter()
            .filter(|r| r["objective"] == objective && r["variant"] == "greedy")
            .map(|r| r["seed"].as_u64().unwrap())
            .collect();
        assert_eq!(seeds.len(), 2, "{objective}");
    }
    let tests = &results["paired_t_vs_ctc"]["test_bleu"];
    assert_eq!(tests.as_array().unwrap().len(), 2, "{tests}");
    assert_eq!(
        results["paired_bootstrap_vs_ctc"].as_array().unwrap().len(),
        2 * 2
    );
    assert_eq!(results["speed"].as_array().unwrap().len(), 6);
    let distilled = read_lines_gz(&out.join("distilled.ids.gz")).unwrap();
    let d = &results["distillation"];
    assert_eq!(
        distilled.len() as u64,
        d["pairs_kept"].as_u64().unwrap() + d["dropped_no_alignment_or_empty"].as_u64().unwrap()
    );

    // Resuming a finished study trains nothing and reports the same numbers.
    let log_rows = std::fs::read_to_string(out.join("log.csv"))
        .unwrap()
        .lines()
        .count();
    let mut resume_args = args.to_vec();
    resume_args.push("--resume");
    let (ok, stdout, stderr) = run_example("ctc_nat", &resume_args);
    assert!(ok, "ctc_nat --quick --resume failed\n{stdout}\n{stderr}");
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

    // The distillation pilot reuses the trained teacher (nothing is trained), and a second
    // pilot extends the first one's grid.
    for alphas in ["2,1", "4"] {
        let mut pilot_args = args.to_vec();
        pilot_args.extend(["--distill-pilot", alphas]);
        let (ok, stdout, stderr) = run_example("ctc_nat", &pilot_args);
        assert!(
            ok,
            "ctc_nat --distill-pilot {alphas} failed\n{stdout}\n{stderr}"
        );
    }
    let lines = std::fs::read_to_string(out.join("log.csv")).unwrap();
    assert_eq!(lines.lines().count(), log_rows, "the pilot trained");
    let pilot: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("distill_pilot.json")).unwrap())
            .unwrap();
    let rows = pilot["alphas"].as_array().unwrap();
    let alphas: Vec<f64> = rows
        .iter()
        .map(|r| r["length_penalty"].as_f64().unwrap())
        .collect();
    assert_eq!(alphas, [1.0, 2.0, 4.0], "{pilot}");
    assert_eq!(pilot["commands"].as_array().unwrap().len(), 2, "{pilot}");
    for row in rows {
        for key in ["train_sample_ratio", "dev_ratio"] {
            assert!(row[key].as_f64().unwrap() > 0.0, "{row}");
        }
        assert!(
            (0.0..=100.0).contains(&row["dev_bleu"].as_f64().unwrap()),
            "{row}"
        );
    }
    let reaching = rows
        .iter()
        .find(|r| r["train_sample_ratio"].as_f64().unwrap() >= 0.97)
        .map(|r| r["length_penalty"].clone())
        .unwrap_or(serde_json::Value::Null);
    assert_eq!(pilot["chosen"], reaching, "{pilot}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The length-controlled rerun's flags end to end (`--blank-penalties`, `--nmla`,
/// `--average-last`, `--no-bleu4`, `--distill-length-penalty`): every CTC system reported at
/// `δ = 0` and at its dev-best `δ`, each output re-scored, the `δ` chosen the first dev-best of
/// the grid, averaging recorded and chosen on dev, the NMLA arm tested against `ctc`.
#[test]
fn quick_length_controlled_study_reports_every_arm_at_both_blank_penalties() {
    let dir = std::env::temp_dir().join(format!("candle-bleu-ctc-nat-lc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_catalogue(&dir);
    let (out, work) = (dir.join("out"), dir.join("work"));
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
        "--cpu",
        "--blank-penalties",
        "0,1",
        "--nmla",
        "--average-last",
        "2",
        "--no-bleu4",
        "--distill-length-penalty",
        "2",
    ];
    let (ok, stdout, stderr) = run_example("ctc_nat", &args);
    assert!(
        ok,
        "ctc_nat --quick (rerun flags) failed\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("`blank-tuned`"), "{stdout}");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["distillation"]["length_penalty"], 2.0);
    let runs = results["runs"].as_array().unwrap();
    let references = read_lines_gz(&out.join("test.ref.gz")).unwrap();
    for run in runs {
        let file = run["test_hyp"].as_str().unwrap();
        check_13a_scores(run, &read_lines_gz(&out.join(file)).unwrap(), &references);
    }
    let objectives = ["baseline", "ctc", "ctc+bon2", "ctc+nmla2"];
    for objective in objectives {
        for variant in ["greedy", "blank-tuned"] {
            let seeds = runs
                .iter()
                .filter(|r| r["objective"] == objective && r["variant"] == variant)
                .count();
            assert_eq!(seeds, 2, "{objective} {variant}");
        }
    }
    assert!(runs.iter().all(|r| r["objective"] != "ctc+bleu4"));
    // Each run's δ is the first dev-best of the grid, and its blank-tuned output uses it.
    let blank = &results["blank_penalties"];
    assert_eq!(blank["grid"], serde_json::json!([0.0, 1.0]));
    let tried = blank["runs"].as_array().unwrap();
    assert_eq!(tried.len(), objectives.len() * 2);
    for entry in tried {
        let by_delta = entry["dev_bleu_by_delta"].as_array().unwrap();
        assert_eq!(by_delta.len(), 2, "{entry}");
        let best = by_delta
            .iter()
            .map(|d| d[1].as_f64().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        let delta = by_delta
            .iter()
            .find(|d| d[1].as_f64().unwrap() == best)
            .map(|d| d[0].as_f64().unwrap())
            .unwrap();
        let chosen = entry["chosen"].as_str().unwrap();
        assert!(chosen.ends_with(&format!("δ={delta}")), "{entry}");
        let tuned = runs
            .iter()
            .find(|r| {
                r["objective"] == entry["objective"]
                    && r["seed"] == entry["seed"]
                    && r["variant"] == "blank-tuned"
            })
            .unwrap();
        assert_eq!(tuned["config"], entry["chosen"], "{tuned}");
    }
    // Averaging: the last 2 evaluations of every CTC run, kept only when better on dev.
    let averaging = &results["checkpoint_averaging"];
    assert_eq!(averaging["last"], 2);
    let averaged = averaging["runs"].as_array().unwrap();
    assert!(!averaged.is_empty());
    for run in averaged {
        assert!(
            run["averaged_steps"].as_array().unwrap().len() <= 2,
            "{run}"
        );
        let (avg, single) = (
            run["dev_bleu"].as_f64().unwrap(),
            run["single_best_dev_bleu"].as_f64().unwrap(),
        );
        assert_eq!(run["selected"].as_bool().unwrap(), avg > single, "{run}");
    }
    for key in ["paired_t_vs_ctc", "paired_t_vs_ctc_blank_tuned"] {
        let tests = results[key]["test_bleu"].as_array().unwrap();
        let arms: Vec<&str> = tests
            .iter()
            .map(|t| t["objective"].as_str().unwrap())
            .collect();
        assert_eq!(arms, ["ctc+bon2", "ctc+nmla2"], "{key}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
