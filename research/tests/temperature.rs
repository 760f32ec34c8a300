//! The `temperature` example runs to completion, every form of the soft BLEU reaches the exact
//! BLEU at the smallest temperature, and it writes its table and plot.

mod common;

use common::run_example;

#[test]
fn temperature_converges_to_the_exact_bleu_and_writes_the_plot() {
    let dir = std::env::temp_dir().join(format!("candle-bleu-temperature-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (ok, out, stderr) =
        run_example("temperature", &["--out", dir.to_str().expect("utf-8 path")]);
    assert!(ok, "temperature failed\n{out}\n{stderr}");
    for form in ["expected", "paired", "lower_bound"] {
        let prefix = format!("tau = 0.01: {form} differs from exact by");
        let verdict = out
            .lines()
            .find(|l| l.trim_start().starts_with(&prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in\n{out}"));
        assert!(verdict.ends_with(": ok"), "{out}");
    }
    let png = std::fs::read(dir.join("temperature.png")).expect("temperature.png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
    let csv = std::fs::read_to_string(dir.join("temperature.csv")).expect("temperature.csv");
    let rows: Vec<Vec<f64>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 15, "{csv}");
    // τ decreasing from 10 to 0.01; the soft BLEU of each form rises towards the exact one,
    // which it reaches at the smallest τ (and is far from at τ = 10).
    assert!((rows[0][0] - 10.0).abs() < 1e-9 && (rows[14][0] - 0.01).abs() < 1e-9);
    let exact = rows[0][4];
    assert!(exact > 0.0 && exact < 1.0);
    // Columns 1..=3: expected, paired, lower_bound.
    for (hot, cold) in rows[0][1..=3].iter().zip(&rows[14][1..=3]) {
        assert!(*hot < 0.5 * exact, "{csv}");
        assert!((cold - exact).abs() <= 1e-6, "{csv}");
    }
    std::fs::remove_dir_all(&dir).expect("removing the temporary directory");
}
