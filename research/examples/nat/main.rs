//! Does the BLEU loss help a non-autoregressive translator? English→German (or `--lang L`)
//! software messages, sequence-level distillation from the translate study's autoregressive
//! model, a vanilla NAT (uniform copy, length predictor) trained with label-smoothed
//! cross-entropy per seed, and from its dev-selected checkpoint the same fine-tuning budget for
//! `ce` (the control), `bon2` (Shao et al.'s bag-of-2-grams through the crate's loss) and
//! `bleu4` (the crate's default `−log BLEU`); plus the raw-reference condition.
//! `docs/nat.md` describes the design; the library is `candle_bleu_research::nat`.
//!
//! ```text
//! cargo run --release --example nat                  # the whole study (about 100 min on 2 cores)
//! cargo run --release --example nat -- --resume      # continue an interrupted study
//! cargo run --release --example nat -- --quick      # a smoke run (< 1 min), runs/quick/nat/<lang>
//! cargo run --release --example nat -- --raw-seeds 3 --resume   # two more raw-reference seeds
//! ```

use anyhow::Result;
use candle_bleu_research::nat::config::Config;
use candle_bleu_research::nat::study::run_study;
use clap::Parser;

fn main() -> Result<()> {
    run_study(Config::parse())
}
