//! Subwords: a byte-level BPE model trained with the `tokenizers` crate.
//!
//! One joint vocabulary for source and target (a model with tied embeddings needs one),
//! trained on the training split only. The pre-tokenizer and decoder are byte-level
//! (GPT-2's: the text is split by its regular expression into words, numbers, punctuation
//! and spaces, every byte maps to one of 256 visible characters, merges never cross a split),
//! with no prefix space and no normaliser, so detokenization is **lossless** for every string:
//! `decode(encode(text)) == text`, characters never seen in training included (they are
//! spelled as bytes; there is no unknown token in practice).
//!
//! Special tokens have fixed ids: [`PAD`] = 0, [`BOS`] = 1, [`EOS`] = 2, [`UNK`] = 3, then the
//! 256 byte symbols, then one token per merge, up to [`BpeConfig::vocab_size`]. [`Bpe::encode`]
//! never produces a special id — the strings `<pad>`, `<s>`, `</s>`, `<unk>` in a text are
//! encoded as ordinary text — and [`Bpe::decode`] drops special ids.
//!
//! Training is deterministic (the trainer breaks count ties by token id and the ids of the
//! byte alphabet are assigned in sorted order): the same texts give the same `tokenizer.json`
//! bytes, in any order, on any thread count.
//!
//! ```
//! use candle_bleu_research::data::bpe::{Bpe, BpeConfig, EOS};
//! let texts = ["Datei öffnen", "Datei speichern", "Datei schließen", "파일 열기"];
//! let bpe = Bpe::train(texts.iter().copied(), &BpeConfig { vocab_size: 300, min_frequency: 1 })?;
//! let ids = bpe.encode("Datei öffnen? 파일")?;
//! assert_eq!(bpe.decode(&ids)?, "Datei öffnen? 파일");
//! let mut with_eos = ids.clone();
//! with_eos.push(EOS);
//! assert_eq!(bpe.decode(&with_eos)?, "Datei öffnen? 파일");
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use super::corpus::Pair;

pub use super::special::{BOS, EOS, PAD, SPECIAL_TOKENS, UNK};

/// Training settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BpeConfig {
    /// Vocabulary size: 4 special tokens + 256 byte symbols + merges (default 8000, so 7740
    /// merges). Training stops earlier if no pair is frequent enough.
    pub vocab_size: usize,
    /// A pair is merged only if it occurs at least this often (default 2).
    pub min_frequency: u64,
}

impl Default for BpeConfig {
    fn default() -> Self {
        BpeConfig {
            vocab_size: 8000,
            min_frequency: 2,
        }
    }
}

/// The smallest vocabulary: the special tokens and the byte alphabet.
pub const MIN_VOCAB_SIZE: usize = SPECIAL_TOKENS.len() + 256;

/// A trained byte-level BPE tokenizer (see the module docs).
#[derive(Clone)]
pub struct Bpe {
    tokenizer: Tokenizer,
    vocab_size: usize,
}

impl std::fmt::Debug for Bpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bpe")
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

fn tk(context: &str) -> impl FnOnce(tokenizers::Error) -> anyhow::Error + '_ {
    move |e| anyhow!("{context}: {e}")
}

impl Bpe {
    /// Trains on `texts` (any order; each text is one sequence).
    ///
    /// Errors: `vocab_size` below [`MIN_VOCAB_SIZE`] (260), no text.
    pub fn train<'a>(
        texts: impl Iterator<Item = &'a str> + Send,
        config: &BpeConfig,
    ) -> Result<Bpe> {
        if config.vocab_size < MIN_VOCAB_SIZE {
            bail!(
                "vocab_size {} is below {MIN_VOCAB_SIZE} (4 special tokens + 256 bytes)",
                config.vocab_size
            );
        }
        let mut texts = texts.peekable();
        if texts.peek().is_none() {
            bail!("no texts to train the BPE model on");
        }
        let model = BPE::builder()
            .unk_token(SPECIAL_TOKENS[UNK as usize].to_string())
            .build()
            .map_err(tk("building the BPE model"))?;
        let mut tokenizer = Tokenizer::new(model);
        tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
        tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, false, true)));
        let special: Vec<AddedToken> = SPECIAL_TOKENS
            .iter()
            .map(|t| AddedToken::from(t.to_string(), true))
            .collect();
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(config.vocab_size)
            .min_frequency(config.min_frequency)
            .show_progress(false)
            .special_tokens(special)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        tokenizer
            .train(&mut trainer, texts)
            .map_err(tk("training the BPE model"))?;
        Bpe::from_tokenizer(tokenizer)
    }

    /// Trains one joint vocabulary on the sources and targets of `pairs` (the training split).
    pub fn train_on_pairs(pairs: &[Pair], config: &BpeConfig) -> Result<Bpe> {
        let texts = pairs
            .iter()
            .flat_map(|p| [p.source.as_str(), p.target.as_str()]);
        Bpe::train(texts, config)
    }

    /// Wraps a tokenizer after checking the special tokens have their fixed ids.
    fn from_tokenizer(mut tokenizer: Tokenizer) -> Result<Bpe> {
        for (id, token) in SPECIAL_TOKENS.iter().enumerate() {
            if tokenizer.token_to_id(token) != Some(id as u32) {
                bail!(
                    "the tokenizer maps {token:?} to {:?}, expected id {id}",
                    tokenizer.token_to_id(token)
                );
            }
        }
        // Special-token strings inside a text are encoded as text, never as special ids.
        tokenizer.set_encode_special_tokens(true);
        let vocab_size = tokenizer.get_vocab_size(true);
        Ok(Bpe {
            tokenizer,
            vocab_size,
        })
    }

    /// Number of ids (special tokens included): the model's vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Token ids of `text`, without BOS/EOS.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(tk("encoding"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of many texts (in parallel), without BOS/EOS.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        let encs = self
            .tokenizer
            .encode_batch_fast(texts.to_vec(), false)
            .map_err(tk("encoding a batch"))?;
        Ok(encs.into_iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// The text of `ids` (detokenized), special ids dropped. Byte sequences that are not
    /// UTF-8 (a model can emit them) become U+FFFD. Errors: an id ≥ [`Bpe::vocab_size`].
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some((i, id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= self.vocab_size)
        {
            bail!(
                "ids[{i}] = {id} is outside the vocabulary (size {})",
                self.vocab_size
            );
        }
        self.tokenizer.decode(ids, true).map_err(tk("decoding"))
    }

    /// The token string of `id` (byte-level symbols, e.g. `Ġfile`), if `id` is in range.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The `tokenizer.json` text (compact; deterministic for a given training).
    pub fn to_json(&self) -> Result<String> {
        self.tokenizer
            .to_string(false)
            .map_err(tk("serialising the tokenizer"))
    }

    /// Loads a tokenizer from its `tokenizer.json` text (checking the special-token ids).
    pub fn from_json(json: &str) -> Result<Bpe> {
        let tokenizer: Tokenizer = json.parse().map_err(tk("parsing tokenizer.json"))?;
        Bpe::from_tokenizer(tokenizer)
    }

    /// Writes `tokenizer.json` to `path`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()?).with_context(|| format!("writing {}", path.display()))
    }

    /// Reads a `tokenizer.json` written by [`Bpe::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Bpe> {
        let path = path.as_ref();
        let json =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Bpe::from_json(&json).with_context(|| format!("loading {}", path.display()))
    }
}
