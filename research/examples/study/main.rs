//! What the BLEU loss does to a model: every form and length model of the loss next to
//! cross-entropy, BLEU alone, and the loss on the model's own soft free-running decode, trained
//! from the same cross-entropy warm-up for an equal number of steps, over several seeds, on a
//! synthetic task where cross-entropy is not at the ceiling (the research library's
//! `task::agreement`, `docs/study.md`).
//!
//! ```text
//! cargo run --release --example study                 # the full study (11 objectives x 3 seeds)
//! cargo run --release --example study -- --quick      # a smoke test, well under a minute (runs/quick/study)
//! cargo run --release --example study -- --project    # time steps, project the full run's time
//! ```
//!
//! Protocol: label-smoothed (0.1) cross-entropy and seeded dropout (0.1) everywhere; every
//! objective is scored on test at its best dev evaluation (greedy BLEU every `--eval-every`
//! steps, among its own evaluations); seed-level paired t-tests against `ce` with Holm's
//! correction over the comparisons and the detectable difference; the averaging measures next
//! to what they give without a model (always the most frequent token, unigram draws, the
//! references). Scores depend on the thread count (candle's CPU reductions): `results.json`
//! records it. See `docs/study.md`.
//!
//! Outputs (under `--out`, default `runs/study/`, `runs/quick/study/` with `--quick`):
//! `results.json` (`runs: [{objective, seed, dev_bleu, selected_step, test_bleu, test_hyp,
//! test_ref, signature, measures: {...}}]`, the seed-level tests and paired bootstrap of every
//! objective against `ce`, the measures' controls, the yardstick, the configuration), `test.ref`
//! and `test.<objective>.seed<k>.hyp`
//! (whitespace-tokenized, paths relative to `results.json`: `sacrebleu test.ref -i <hyp> -tok
//! none -b` gives `test_bleu`), `table.md`, `log.csv`, `curves.png`, `averaging.png`, and the
//! generated data in `data/*.tsv`.

use anyhow::Result;
use candle_bleu_research::study::config::Config;
use candle_bleu_research::study::entry::run_study;
use clap::Parser;

fn main() -> Result<()> {
    run_study(Config::parse())
}
