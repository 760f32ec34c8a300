//! The worked example of `docs/loss.md` ("15. Worked example"), computed twice: once from the
//! formulas of the document in plain `f64` (every intermediate table), once by the crate
//! (`bleu_loss`: statistics and loss for each form × length model × smoothing). Every number the
//! document prints is asserted here to the digits it shows; if the document changes, change the
//! literals below with it.
//!
//! The example: `V = 4` (ids 0 `<pad>`, 1 `a`, 2 `b`, 3 `</s>`), `S = 3`, one reference `a b a`,
//! `N = 2`, and the hypothesis rows
//! `P_0 = (0, ½, ½, 0)`, `P_1 = (0, 0, 1, 0)`, `P_2 = (0, ½, 0, ½)`.

use candle_bleu::loss::{
    bleu_loss, log_brevity_penalty, BleuLossConfig, Form, LengthModel, LossSmoothing, Reduction,
    References,
};
use candle_core::{Device, Tensor};

const DOC: &str = include_str!("../docs/loss.md");

const PROBS: [[f64; 4]; 3] = [
    [0.0, 0.5, 0.5, 0.0],
    [0.0, 0.0, 1.0, 0.0],
    [0.0, 0.5, 0.0, 0.5],
];
const REFERENCE: [u32; 3] = [1, 2, 1];
const EOS: u32 = 3;

/// Asserts that `got` rounds to `printed` at the number of decimals `printed` shows. A number
/// printed without decimals is an exact value (to rounding error, 1e-12).
fn assert_digits(what: &str, got: f64, printed: &str) {
    let want: f64 = printed.parse().expect("a number");
    let tolerance = match printed.split('.').nth(1) {
        Some(decimals) => 0.5 * 10f64.powi(-(decimals.len() as i32)) * (1.0 + 1e-9),
        None => 1e-12,
    };
    assert!(
        (got - want).abs() <= tolerance,
        "{what}: computed {got}, docs/loss.md prints {printed}"
    );
}

/// Asserts a table of numbers, row by row.
fn assert_table(what: &str, got: &[Vec<f64>], printed: &[&[&str]]) {
    assert_eq!(got.len(), printed.len(), "{what}: rows");
    for (r, (row, printed_row)) in got.iter().zip(printed).enumerate() {
        assert_eq!(row.len(), printed_row.len(), "{what}: row {r} columns");
        for (c, (&x, p)) in row.iter().zip(printed_row.iter()).enumerate() {
            assert_digits(&format!("{what}[{r}][{c}]"), x, p);
        }
    }
}

/// Asserts one row of numbers.
fn assert_row(what: &str, got: &[f64], printed: &[&str]) {
    assert_table(what, &[got.to_vec()], &[printed]);
}

/// `X[j][i] = P[i, ρ_j]`.
fn token_match() -> Vec<Vec<f64>> {
    REFERENCE
        .iter()
        .map(|&id| PROBS.iter().map(|row| row[id as usize]).collect())
        .collect()
}

/// `Z[i][i'] = P_i · P_{i'}`.
fn hyp_self_match() -> Vec<Vec<f64>> {
    PROBS
        .iter()
        .map(|a| {
            PROBS
                .iter()
                .map(|b| a.iter().zip(b).map(|(x, y)| x * y).sum())
                .collect()
        })
        .collect()
}

/// `A_n[a][b] = Π_{k<n} A[a+k][b+k]`.
fn ngram_product(base: &[Vec<f64>], order: usize) -> Vec<Vec<f64>> {
    let rows = base.len() + 1 - order;
    let cols = base[0].len() + 1 - order;
    (0..rows)
        .map(|a| {
            (0..cols)
                .map(|b| (0..order).map(|k| base[a + k][b + k]).product())
                .collect()
        })
        .collect()
}

/// The intermediate quantities of one order, as the document's tables list them.
struct OrderTables {
    first: Vec<f64>,
    clip: Vec<f64>,
    ngram_match: Vec<Vec<f64>>,
    expected_count: Vec<f64>,
    expected: f64,
    lower_bound_terms: Vec<Vec<f64>>,
    lower_bound: f64,
    hyp_ngram_self_match: Vec<Vec<f64>>,
    hyp_first: Vec<f64>,
    hyp_count: Vec<f64>,
    clipped: Vec<Vec<f64>>,
    unclipped: Vec<Vec<f64>>,
    paired: f64,
}

/// The first-occurrence mask `ν` and clip counts `κ` of the reference's n-grams of `order`,
/// by their definitions (docs/loss.md): `ν_j = 1` where the n-gram starting at `j` occurs for
/// the first time, and there `κ_j` is its count in the reference (one reference: the max over
/// references is that count); 0 elsewhere.
fn first_and_clip(order: usize) -> (Vec<f64>, Vec<f64>) {
    let ngrams: Vec<&[u32]> = REFERENCE.windows(order).collect();
    let first: Vec<bool> = (0..ngrams.len())
        .map(|j| !ngrams[..j].contains(&ngrams[j]))
        .collect();
    let clip = (0..ngrams.len())
        .map(|j| {
            if first[j] {
                ngrams.iter().filter(|&&g| g == ngrams[j]).count() as f64
            } else {
                0.0
            }
        })
        .collect();
    (
        first.iter().map(|&f| f64::from(u8::from(f))).collect(),
        clip,
    )
}

/// The document's formulas (§5–§8) in plain loops, with `u_i = 1` (the match weights of every
/// length model in this example).
fn order_tables(order: usize) -> OrderTables {
    let (first, clip) = first_and_clip(order);
    let starts_ref = REFERENCE.len() + 1 - order;
    let ngram_match = ngram_product(&token_match(), order);
    let starts_hyp = ngram_match[0].len();
    let match_weight = vec![1.0; starts_hyp];
    let expected_count: Vec<f64> = ngram_match
        .iter()
        .map(|row| row.iter().zip(&match_weight).map(|(m, u)| m * u).sum())
        .collect();
    let expected = (0..starts_ref)
        .map(|j| clip[j].min(first[j] * expected_count[j]))
        .sum();
    let lower_bound_terms: Vec<Vec<f64>> = (0..starts_ref)
        .map(|j| {
            (0..starts_hyp)
                .map(|i| {
                    let a = match_weight[i] * ngram_match[j][i];
                    a * (clip[j] / (1.0 + expected_count[j] - a)).min(1.0)
                })
                .collect()
        })
        .collect();
    let lower_bound = lower_bound_terms.iter().flatten().sum();
    let z = ngram_product(&hyp_self_match(), order);
    let hyp_first: Vec<f64> = (0..starts_hyp)
        .map(|i| {
            match_weight[i]
                * (0..i)
                    .map(|k| 1.0 - z[i][k] * match_weight[k])
                    .product::<f64>()
        })
        .collect();
    let hyp_count: Vec<f64> = (0..starts_hyp)
        .map(|i| {
            hyp_first[i]
                * (0..starts_hyp)
                    .map(|k| z[i][k] * match_weight[k])
                    .sum::<f64>()
        })
        .collect();
    let clipped: Vec<Vec<f64>> = (0..starts_ref)
        .map(|j| {
            (0..starts_hyp)
                .map(|i| ngram_match[j][i] * clip[j] * hyp_first[i])
                .collect()
        })
        .collect();
    let unclipped: Vec<Vec<f64>> = (0..starts_ref)
        .map(|j| {
            (0..starts_hyp)
                .map(|i| ngram_match[j][i] * hyp_count[i] * first[j])
                .collect()
        })
        .collect();
    let paired = clipped
        .iter()
        .flatten()
        .zip(unclipped.iter().flatten())
        .map(|(a, b)| a.min(*b))
        .sum();
    OrderTables {
        first,
        clip,
        ngram_match,
        expected_count,
        expected,
        lower_bound_terms,
        lower_bound,
        hyp_ngram_self_match: z,
        hyp_first,
        hyp_count,
        clipped,
        unclipped,
        paired,
    }
}

#[test]
fn intermediate_tables_are_as_printed() {
    assert_table(
        "X",
        &token_match(),
        &[
            &["0.5", "0", "0.5"],
            &["0.5", "1", "0"],
            &["0.5", "0", "0.5"],
        ],
    );
    assert_table(
        "Z",
        &hyp_self_match(),
        &[
            &["0.5", "0.5", "0.25"],
            &["0.5", "1", "0"],
            &["0.25", "0", "0.5"],
        ],
    );

    let one = order_tables(1);
    assert_row("ν (n=1)", &one.first, &["1", "1", "0"]);
    assert_row("κ (n=1)", &one.clip, &["2", "1", "0"]);
    assert_row("E (n=1)", &one.expected_count, &["1", "1.5", "1"]);
    assert_table(
        "lower-bound terms (n=1)",
        &one.lower_bound_terms,
        &[
            &["0.5", "0", "0.5"],
            &["0.25", "0.666667", "0"],
            &["0", "0", "0"],
        ],
    );
    assert_row("μ (n=1)", &one.hyp_first, &["1", "0.5", "0.75"]);
    assert_row("c (n=1)", &one.hyp_count, &["1.25", "0.75", "0.5625"]);
    assert_table(
        "clipped (n=1)",
        &one.clipped,
        &[&["1", "0", "0.75"], &["0.5", "0.5", "0"], &["0", "0", "0"]],
    );
    assert_table(
        "unclipped (n=1)",
        &one.unclipped,
        &[
            &["0.625", "0", "0.28125"],
            &["0.625", "0.75", "0"],
            &["0", "0", "0"],
        ],
    );
    assert_digits("m_1 expected", one.expected, "2");
    assert_digits("m_1 lower bound", one.lower_bound, "1.916667");
    assert_digits("m_1 paired", one.paired, "1.90625");
    // The unigram M is X itself.
    assert_eq!(one.ngram_match, token_match());

    let two = order_tables(2);
    assert_row("ν (n=2)", &two.first, &["1", "1"]);
    assert_row("κ (n=2)", &two.clip, &["1", "1"]);
    assert_table("M (n=2)", &two.ngram_match, &[&["0.5", "0"], &["0", "0.5"]]);
    assert_row("E (n=2)", &two.expected_count, &["0.5", "0.5"]);
    assert_table(
        "lower-bound terms (n=2)",
        &two.lower_bound_terms,
        &[&["0.5", "0"], &["0", "0.5"]],
    );
    assert_table(
        "Z_2",
        &two.hyp_ngram_self_match,
        &[&["0.5", "0"], &["0", "0.5"]],
    );
    assert_row("μ (n=2)", &two.hyp_first, &["1", "1"]);
    assert_row("c (n=2)", &two.hyp_count, &["0.5", "0.5"]);
    assert_table(
        "clipped (n=2)",
        &two.clipped,
        &[&["0.5", "0"], &["0", "0.5"]],
    );
    assert_table(
        "unclipped (n=2)",
        &two.unclipped,
        &[&["0.25", "0"], &["0", "0.25"]],
    );
    assert_digits("m_2 expected", two.expected, "1");
    assert_digits("m_2 lower bound", two.lower_bound, "1");
    assert_digits("m_2 paired", two.paired, "0.5");
}

/// One row of the document's results table: statistics and loss of one configuration.
struct Row {
    form: Form,
    length: LengthModel,
    smoothing: LossSmoothing,
    matches: [&'static str; 2],
    totals: [&'static str; 2],
    hyp_len: &'static str,
    ref_len: &'static str,
    loss: &'static str,
    bleu: &'static str,
}

fn rows() -> Vec<Row> {
    let given = LengthModel::Given;
    let not_eos = LengthModel::NotEos { eos_id: EOS };
    let soft_eos = LengthModel::SoftEos { eos_id: EOS };
    let (none, add1) = (LossSmoothing::None, LossSmoothing::AddK(1.0));
    let mut rows = Vec::new();
    for (form, matches) in [
        (Form::Expected, ["2", "1"]),
        (Form::LowerBound, ["1.916667", "1"]),
        (Form::Paired, ["1.90625", "0.5"]),
    ] {
        let losses: [(&str, &str); 4] = match form {
            Form::Expected => [
                ("0.5493061443", "0.5773502692"),
                ("0.4054651081", "0.6666666667"),
                ("0.5143043297", "0.5979164026"),
                ("0.4231435513", "0.6549846025"),
            ],
            Form::LowerBound => [
                ("0.5705859515", "0.5651941653"),
                ("0.4267449153", "0.6526300069"),
                ("0.5355841369", "0.5853272790"),
                ("0.4444233585", "0.6411939085"),
            ],
            Form::Paired => [
                ("0.9198843442", "0.3985651348"),
                ("0.5733107539", "0.5636562191"),
                ("0.8848825296", "0.4127626578"),
                ("0.5909891971", "0.5537792169"),
            ],
        };
        for (length, totals, hyp_len, soft) in [
            (given, ["3", "2"], "3", false),
            (not_eos, ["2.5", "1.5"], "2.5", true),
            (soft_eos, ["2.5", "1.5"], "2.5", true),
        ] {
            for (smoothing, index) in [(none, 0), (add1, 1)] {
                let (loss, bleu) = losses[index + if soft { 2 } else { 0 }];
                rows.push(Row {
                    form,
                    length,
                    smoothing,
                    matches,
                    totals,
                    hyp_len,
                    ref_len: "3",
                    loss,
                    bleu,
                });
            }
        }
    }
    rows
}

#[test]
fn the_crate_computes_the_printed_statistics_and_losses() -> candle_core::Result<()> {
    let device = Device::Cpu;
    let probs = Tensor::new(&[PROBS], &device)?; // f64 [1, 3, 4]
    let refs = References::from_ids(&Tensor::new(&[REFERENCE], &device)?, 0)?;
    for row in rows() {
        for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
            let cfg = BleuLossConfig {
                max_order: 2,
                weights: None,
                form: row.form,
                length: row.length,
                reduction,
                smoothing: row.smoothing,
                ..Default::default()
            };
            let what = format!(
                "{:?} {:?} {:?} {:?}",
                row.form, row.length, row.smoothing, reduction
            );
            let out = bleu_loss(&probs, None, &refs, &cfg)?;
            let matches = out.stats.matches.to_vec2::<f64>()?;
            let totals = out.stats.totals.to_vec2::<f64>()?;
            for n in 0..2 {
                assert_digits(
                    &format!("{what} m_{}", n + 1),
                    matches[0][n],
                    row.matches[n],
                );
                assert_digits(&format!("{what} t_{}", n + 1), totals[0][n], row.totals[n]);
            }
            assert_digits(
                &format!("{what} c"),
                out.stats.hyp_len.to_vec1::<f64>()?[0],
                row.hyp_len,
            );
            assert_digits(
                &format!("{what} L"),
                out.stats.ref_len.to_vec1::<f64>()?[0],
                row.ref_len,
            );
            let loss = out.loss.to_scalar::<f64>()?;
            assert_digits(&format!("{what} loss"), loss, row.loss);
            assert_digits(&format!("{what} BLEU"), (-loss).exp(), row.bleu);
            // The printed numbers are in the document (only the long ones are distinctive).
            for printed in [row.loss, row.bleu] {
                assert!(
                    DOC.contains(printed),
                    "docs/loss.md does not print {printed}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn brevity_penalty_lines_are_as_printed() -> candle_core::Result<()> {
    let device = Device::Cpu;
    // (c, L, printed β): above one token, at the example's soft length, and below one token.
    for (c, l, printed) in [
        (3.0f64, 3.0f64, "0"),
        (2.5, 3.0, "-0.2"),
        (1.0, 3.0, "-2"),
        (0.5, 3.0, "-3.5"),
        (0.0, 3.0, "-5"),
    ] {
        let beta = log_brevity_penalty(&Tensor::new(&[c], &device)?, &Tensor::new(&[l], &device)?)?
            .to_vec1::<f64>()?[0];
        assert_digits(&format!("β({c}, {l})"), beta, printed);
    }
    assert_digits("BP at c = 2.5", (-0.2f64).exp(), "0.8187307531");
    assert!(DOC.contains("0.8187307531"));
    Ok(())
}
