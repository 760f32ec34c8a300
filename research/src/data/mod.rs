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
//! - [`tokens`]: token-level pairs (the synthetic tasks, whitespace or character files) and
//!   their vocabularies; [`batch`]: ids to padded tensors and shuffled batches, for either.
//!
//! Every vocabulary here — BPE or token-level — gives the special tokens the same ids
//! ([`special`]): [`PAD`] 0, [`BOS`] 1, [`EOS`] 2, [`UNK`] 3.

pub mod batch;
pub mod bpe;
pub mod corpus;
pub mod mo;
pub mod special;
pub mod tokens;

pub use batch::{
    encode_pairs, make_batch, reference_tensor, source_tensor, Batch, Batches, Encoded,
    EncodedCorpus,
};
pub use bpe::{Bpe, BpeConfig};
pub use corpus::{
    build_corpus, corpus_from_files, Corpus, CorpusConfig, CorpusSummary, Pair, Split,
};
pub use mo::{MoError, MoFile};
pub use special::{BOS, EOS, PAD, SPECIAL_TOKENS, UNK};
