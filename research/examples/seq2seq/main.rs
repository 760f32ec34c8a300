//! Train a small candle Transformer translation model with cross-entropy alone and with a
//! cross-entropy warm-up followed by `CE + λ · BLEU loss`, at an equal number of steps, and
//! compare their test BLEU over several seeds with a paired bootstrap test.
//!
//! ```text
//! cargo run --release --example seq2seq                  # synthetic task, 2 objectives, 1 seed
//! cargo run --release --example seq2seq -- --seeds 3     # the full comparison (docs/seq2seq.md)
//! cargo run --release --example seq2seq -- --quick       # smoke test, under a minute (runs/quick/seq2seq)
//! cargo run --release --example seq2seq -- --train train.tsv --dev dev.tsv --test test.tsv
//! cargo run --release --features cuda --example seq2seq  # on CUDA device 0 (`-- --cpu`: CPU)
//! ```
//!
//! **Data.** By default a synthetic English-like → invented-SOV translation task generated
//! from a fixed seed (reordering, one-to-many mappings, synonyms; the research library's
//! `task::reordering`); the generated sets are written to `data/*.tsv` in the output folder.
//! `--train/--dev/--test` read your own tab-separated files (`source<TAB>target`, one pair a
//! line), tokenized on whitespace, or into characters with `--char` (a space becomes the token
//! `▁`).
//!
//! **Why teacher-forced.** The BLEU loss needs a distribution over tokens at every output
//! position. Greedy or sampled decodes are discrete (no gradient); the teacher-forced
//! decoder gives one `softmax(logits)` row per reference position in one parallel pass, the
//! same pass cross-entropy uses, so the BLEU term costs one extra `bleu_loss_from_logits`
//! call per step. Its n-gram statistics reward probability mass on reference n-grams at any
//! position (not only the aligned one), and with `--length soft-eos` or `not-eos` the loss
//! also sees the EOS probabilities, i.e. the hypothesis length. The limitation: each
//! position is conditioned on the gold prefix, so the loss does not see the model's own
//! errors compound (exposure bias), which a soft or Gumbel free-running decode would.
//!
//! **Protocol.** Both objectives train with label-smoothed (0.1) cross-entropy and seeded
//! dropout (0.1); dev BLEU (greedy) is measured every `--eval-every` steps and the best
//! checkpoint after the warm-up (`--warmup` share of the steps, the same window for both) is
//! the one scored on test. Seed-level paired t-test of `ce+bleu` against `ce` (Holm-adjusted
//! over the comparisons; one here) with its detectable difference, and sacrebleu's paired
//! bootstrap per seed and pooled. Scores depend on the thread count (candle's CPU
//! reductions); `results.json` records it. See `docs/seq2seq.md`.
//!
//! **Outputs** (under `--out`, default `runs/seq2seq/`, `runs/quick/seq2seq/` with `--quick`):
//! `results.json` (`{"runs": [{"objective", "seed", "dev_bleu", "selected_step", "test_bleu",
//! "test_hyp", "test_ref", "signature"}, ...], "seed_tests": ..., "bootstrap": ...}`), `test.ref` and
//! `test.<objective>.seed<k>.hyp` (whitespace-tokenized, one segment a line, paths relative to
//! `results.json`: `sacrebleu test.ref -i <hyp> -tok none -b` gives `test_bleu`), `log.csv`,
//! `curves.png`.

use anyhow::Result;
use candle_bleu_research::seq2seq::config::Config;
use candle_bleu_research::seq2seq::entry::run_study;
use clap::Parser;

fn main() -> Result<()> {
    run_study(Config::parse())
}
