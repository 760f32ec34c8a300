//! Does the BLEU loss on CTC outputs help a CTC non-autoregressive translator? English→German
//! (or `--lang L`) software messages, sequence-level distillation from an autoregressive
//! teacher trained to its dev plateau, a CTC NAT (the source upsampled `--ratio` times, blank
//! = BOS) trained with CTC per seed, and from its dev-selected checkpoint the same fine-tuning
//! budget for `ctc` (the control), `ctc+bon2` and `ctc+bleu4` (the crate's BLEU loss on CTC
//! outputs). `docs/ctc_nat.md` describes the design; the library is
//! `candle_bleu_research::ctc_nat`.
//!
//! ```text
//! cargo run --release --example ctc_nat                # the whole study (estimate: docs/ctc_nat.md)
//! cargo run --release --example ctc_nat -- --resume    # continue an interrupted study
//! cargo run --release --example ctc_nat -- --quick     # a smoke run into runs/ctc_nat_quick
//! ```

use anyhow::Result;
use candle_bleu_research::ctc_nat::config::Config;
use candle_bleu_research::ctc_nat::study::run_study;
use clap::Parser;

fn main() -> Result<()> {
    run_study(Config::parse())
}
