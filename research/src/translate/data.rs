//! The real-data studies' data: the corpus from the system's gettext catalogues, the joint BPE
//! model trained on its training split, and every split as subword ids and text.

use anyhow::{bail, Result};
use std::path::Path;

use super::batches::IdPairs;
use crate::data::{build_corpus, Bpe, BpeConfig, CorpusConfig, CorpusSummary, Pair};

/// The pairs of a split as subword ids and as text.
pub struct SplitData {
    /// Subword ids (no BOS/EOS).
    pub ids: IdPairs,
    /// Source texts.
    pub sources: Vec<String>,
    /// Reference texts.
    pub references: Vec<String>,
}

/// `pairs` as subword ids, leaving out (and counting) those with a side longer than
/// `max_tokens` subwords.
pub fn encode(bpe: &Bpe, pairs: &[Pair], max_tokens: Option<usize>) -> Result<(SplitData, usize)> {
    let src = bpe.encode_batch(&pairs.iter().map(|p| p.source.as_str()).collect::<Vec<_>>())?;
    let tgt = bpe.encode_batch(&pairs.iter().map(|p| p.target.as_str()).collect::<Vec<_>>())?;
    let mut data = SplitData {
        ids: IdPairs::default(),
        sources: Vec::new(),
        references: Vec::new(),
    };
    let mut dropped = 0;
    for ((s, t), pair) in src.into_iter().zip(tgt).zip(pairs) {
        if let Some(max) = max_tokens {
            if s.len() > max || t.len() > max {
                dropped += 1;
                continue;
            }
        }
        data.ids.src.push(s);
        data.ids.tgt.push(t);
        data.sources.push(pair.source.clone());
        data.references.push(pair.target.clone());
    }
    Ok((data, dropped))
}

/// Where the corpus comes from and how it is cut into subwords.
#[derive(Debug, Clone)]
pub struct DataConfig<'a> {
    /// The directory holding `<lang>/LC_MESSAGES/*.mo`.
    pub catalogs: &'a Path,
    /// The target language.
    pub lang: &'a str,
    /// The joint BPE vocabulary.
    pub bpe_vocab: usize,
    /// A smoke run: 400 training, 40 dev and 40 test pairs.
    pub quick: bool,
    /// The model's positions: training pairs with a side longer than `max_len / 2 − 2`
    /// subwords are dropped.
    pub max_len: usize,
}

/// A study's data.
pub struct StudyData {
    /// What went into the corpus (its SHA-256 included).
    pub summary: CorpusSummary,
    /// The BPE model.
    pub bpe: Bpe,
    /// Training pairs (the long ones dropped).
    pub train: SplitData,
    /// Development pairs.
    pub dev: SplitData,
    /// Test pairs.
    pub test: SplitData,
}

/// Builds the corpus, writes `corpus.json` and `tokenizer.json` (the BPE model trained on the
/// training split) into `out`, and encodes the splits; prints what it did.
pub fn prepare(cfg: &DataConfig, out: &Path) -> Result<StudyData> {
    let corpus_cfg = CorpusConfig {
        catalogs: cfg.catalogs.to_path_buf(),
        lang: cfg.lang.to_string(),
        ..Default::default()
    };
    let mut corpus = build_corpus(&corpus_cfg)?;
    println!("{}", corpus.summary);
    std::fs::write(out.join("corpus.json"), corpus.summary.to_json())?;
    if cfg.quick {
        corpus.train.truncate(400);
        corpus.dev.truncate(40);
        corpus.test.truncate(40);
    }
    if corpus.train.is_empty() || corpus.dev.is_empty() || corpus.test.is_empty() {
        bail!(
            "the corpus from {} has an empty split (train {}, dev {}, test {})",
            corpus_cfg.messages_dir().display(),
            corpus.train.len(),
            corpus.dev.len(),
            corpus.test.len()
        );
    }
    let bpe = Bpe::train_on_pairs(
        &corpus.train,
        &BpeConfig {
            vocab_size: cfg.bpe_vocab,
            ..Default::default()
        },
    )?;
    bpe.save(out.join("tokenizer.json"))?;
    // Positions for BOS/EOS and the decoder's length limit; longer training pairs are dropped.
    let max_tokens = cfg.max_len / 2 - 2;
    let (train, dropped) = encode(&bpe, &corpus.train, Some(max_tokens))?;
    let (dev, _) = encode(&bpe, &corpus.dev, None)?;
    let (test, _) = encode(&bpe, &corpus.test, None)?;
    println!(
        "BPE: {} subwords; {} training pairs ({dropped} longer than {max_tokens} subwords dropped), {} dev, {} test",
        bpe.vocab_size(),
        train.ids.len(),
        dev.ids.len(),
        test.ids.len()
    );
    Ok(StudyData {
        summary: corpus.summary,
        bpe,
        train,
        dev,
        test,
    })
}
