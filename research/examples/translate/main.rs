//! Does BLEU training help on real translations? English→German (or `--lang L`) software
//! messages from the system's gettext catalogues, a Transformer with dropout and tied
//! embeddings on BPE subwords, a label-smoothed cross-entropy baseline per seed, and from its
//! dev-selected checkpoint the same fine-tuning budget for every objective:
//!
//! - `ce`: cross-entropy continued (the control);
//! - `ce+expected` (and `ce+lower-bound`, `ce+paired` with `--objectives
//!   expected,lower-bound,paired,mrt`; cut by default to fit the two-hour budget):
//!   `CE + λ · (−log BLEU)` from the decoder's hidden states
//!   (`candle_bleu::loss::ce_bleu_from_hidden`), λ tuned on seed 1's dev set;
//! - `mrt`: minimum risk training, `CE + μ · risk` over sampled candidates, μ tuned the same way.
//!
//! Checkpoints are chosen on dev BLEU (greedy); the reported test scores are beam search
//! (beam 5, length penalty 1) on detokenised text: sacrebleu's BLEU (13a), chrF and chrF++,
//! with seed-level paired t-tests against `ce` (Holm-corrected), sacrebleu's paired bootstrap
//! per seed, a length-penalty sweep of the control (the gain at matched length), and the cost
//! of each objective. `docs/translate.md` explains the protocol and the committed run.
//!
//! ```text
//! cargo run --release --example translate                      # the whole study (≤ 2 h on 2 cores)
//! cargo run --release --example translate -- --resume          # continue an interrupted study
//! cargo run --release --example translate -- --quick           # a tiny smoke run (< 1 min), runs/quick/translate/<lang>
//! cargo run --release --example translate -- --lang fr --seeds 5
//! cargo run --release --example translate -- --output-distribution  # after a study: its models' softmax rows
//! ```

use anyhow::Result;
use candle_bleu_research::translate::config::Config;
use candle_bleu_research::translate::entry::run_study;
use clap::Parser;

fn main() -> Result<()> {
    run_study(Config::parse())
}
