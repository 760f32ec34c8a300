//! candle-bleu: BLEU as a training signal for candle seq2seq models.
pub mod exact;
pub mod gradcheck;
pub mod loss;
pub mod ngram;
mod orders;
