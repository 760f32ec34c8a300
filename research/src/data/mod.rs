//! Real human-translated data: gettext catalogues → a deduplicated, split parallel corpus →
//! byte-level BPE subwords.
//!
//! ```no_run
//! use candle_bleu_research::data::{build_corpus, Bpe, BpeConfig, CorpusConfig};
//!
//! let corpus = build_corpus(&CorpusConfig { lang: "fr".into(), ..Default::default() })?;
//! println!("{}", corpus.summary);                  // counts, split sizes, SHA-256 of the pairs
//! let bpe = Bpe::train_on_pairs(&corpus.train, &BpeConfig::default())?;
//! let ids = bpe.encode(&corpus.test[0].source)?;   // Vec<u32>, no BOS/EOS
//! assert_eq!(bpe.decode(&ids)?, corpus.test[0].source);
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! - [`mo`]: the `.mo` reader (both byte orders, revisions 0 and 1 with system-dependent
//!   strings expanded, plurals, contexts, declared charsets) and a writer for test fixtures.
//! - [`corpus`]: the corpus rules (normalisation, filters, duplicates, SHA-256 split) and the
//!   [`CorpusSummary`] a study records.
//! - [`bpe`]: the joint byte-level BPE vocabulary with fixed special-token ids.

pub mod bpe;
pub mod corpus;
pub mod mo;

pub use bpe::{Bpe, BpeConfig, BOS, EOS, PAD, UNK};
pub use corpus::{
    build_corpus, corpus_from_files, Corpus, CorpusConfig, CorpusSummary, Pair, Split,
};
pub use mo::{MoError, MoFile};
