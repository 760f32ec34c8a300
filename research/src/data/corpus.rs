//! A parallel corpus of real human translations from gettext message catalogues.
//!
//! Software message catalogues (`/usr/share/locale/<lang>/LC_MESSAGES/*.mo` on every
//! Debian-like system) are human-translated English → `<lang>` text, the domain of the OPUS
//! GNOME, KDE4 and Ubuntu corpora. [`build_corpus`] reads them and builds a deduplicated,
//! filtered corpus split into train, dev and test sets, deterministically: the same catalogues
//! give the same pairs, splits and hashes on every machine, whatever the order the files are
//! listed in.
//!
//! # Rules, in the order they apply
//!
//! 1. **Catalogues**: the `*.mo` files of `DIR/<lang>/LC_MESSAGES/` exactly (not `<lang>_XX`:
//!    regional variants such as `de_CH` or `pt_BR` are other target languages or spellings;
//!    pass `lang = "de_CH"` to use one). Files whose name starts with a prefix of
//!    [`CorpusConfig::exclude_prefixes`] are skipped — by default `iso_`, the iso-codes name
//!    lists (countries, subdivisions, languages, scripts, currencies): fixed names rather than
//!    sentences, tens of thousands of them in `iso_3166-2` alone, most untranslated or
//!    transliterated, which would swamp the messages of the programs. A file that fails to
//!    parse is skipped and reported with its error ([`CatalogueSummary::error`]).
//! 2. **Messages** (counted per reason in [`SkipCounts`]): the header is not a pair; plural
//!    entries are skipped (`plural`: their forms depend on the language's plural rule, so no
//!    one `msgstr` is "the" translation of the singular); messages with a context are kept
//!    with the context dropped (`context_kept`; or skipped as `context` when
//!    [`CorpusConfig::keep_contexts`] is false); multi-line messages — a line break inside
//!    the trimmed text of source or translation — are skipped (`multi_line`: help screens and
//!    usage blocks, whose line breaks translators re-flow, so they are not sentence pairs).
//! 3. **Text**: every run of Unicode whitespace (tab, newline, no-break space, …) becomes one
//!    ASCII space, leading and trailing whitespace is removed, and nothing else changes:
//!    format placeholders (`%s`, `%1$d`, `{name}`, `%<PRIdMAX>` expanded to `%ld`), accelerator
//!    marks (`_File`) and punctuation stay as text.
//! 4. **Filters** on the normalised pair: an empty source or translation (`empty`); a
//!    translation identical to its source (`untranslated`); control characters (`control`);
//!    a source outside [`CorpusConfig::min_words`]..=[`CorpusConfig::max_words`]
//!    whitespace-separated words (`length`, default 3–30); a length ratio between translation
//!    and source, either way, above [`CorpusConfig::max_length_ratio`] (`ratio`, default 3:
//!    translator notes, bug-report addresses appended to a translation, paraphrases). Lengths
//!    are counted in UTF-8 bytes, which puts scripts on a comparable footing — a Hangul
//!    syllable (3 bytes) carries about as much as 2–3 Latin letters; a character ratio
//!    rejected 317 good English→Korean pairs such as `user does not exist` / `사용자 없음`,
//!    the byte ratio 17, mostly paraphrases.
//! 5. **Duplicates**: one pair per source string. Of the translations a source has across all
//!    catalogues, the one given most often is kept, ties broken by the lexicographically
//!    smallest (byte order) translation — a rule on the multiset of candidates, so catalogue
//!    order never matters (`duplicate` counts the candidates dropped).
//! 6. **Split** by SHA-256 of the source's *split key* — the source lowercased with every
//!    character that is not alphanumeric removed — so that variants differing only in case,
//!    punctuation or spacing (`File not found` / `file not found.`) land in the same split:
//!    the first 8 bytes of the digest, big-endian, modulo 1000 give a bucket; buckets
//!    `[0, test)` are test, `[test, test + dev)` dev, the rest train
//!    ([`CorpusConfig::test_per_mille`], [`CorpusConfig::dev_per_mille`], 50 each: 5 % + 5 %).
//!    A source's split depends on its own text only: no source is in two splits, and adding
//!    catalogues never moves a sentence from one split to another (it may change which
//!    translation a duplicated source keeps).
//!
//! Each split is ordered by the SHA-256 of the split key (then the source), a pseudo-random
//! order that does not depend on the catalogues, so any prefix of a split is a uniform sample
//! that stays the same when catalogues are added (`--quick` runs take a prefix).
//!
//! [`CorpusSummary`] records the counts per catalogue and per reason, the split sizes, and the
//! SHA-256 of the sorted pairs (every pair as `source\ttarget\n`, sorted by source): two
//! machines with the same hash trained on the same data.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::mo::MoFile;

/// One sentence pair.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Pair {
    /// The English source (`msgid`), normalised.
    pub source: String,
    /// The translation (`msgstr`), normalised.
    pub target: String,
}

/// Which part of the corpus a pair belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training set.
    Train,
    /// Development set (checkpoint and hyper-parameter selection).
    Dev,
    /// Test set (reported scores).
    Test,
}

impl Split {
    /// All splits, in the order train, dev, test.
    pub const ALL: [Split; 3] = [Split::Train, Split::Dev, Split::Test];

    /// `train`, `dev` or `test`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Dev => "dev",
            Split::Test => "test",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How to build the corpus. `Default` is the study's setting: German from
/// `/usr/share/locale`, sources of 3–30 words, 5 % dev, 5 % test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CorpusConfig {
    /// The directory holding `<lang>/LC_MESSAGES/*.mo` (default `/usr/share/locale`).
    pub catalogs: PathBuf,
    /// The target language's directory name (default `de`).
    pub lang: String,
    /// Catalogue file-name prefixes to skip (default `["iso_"]`, see the module docs).
    pub exclude_prefixes: Vec<String>,
    /// Keep messages that have a context, without it (default `true`).
    pub keep_contexts: bool,
    /// Fewest whitespace-separated words in a source (default 3).
    pub min_words: usize,
    /// Most whitespace-separated words in a source (default 30).
    pub max_words: usize,
    /// Largest ratio of UTF-8 byte lengths between translation and source, either way
    /// (default `Some(3.0)`; `None` turns the filter off).
    pub max_length_ratio: Option<f64>,
    /// Share of split buckets (out of 1000) for the dev set (default 50).
    pub dev_per_mille: u16,
    /// Share of split buckets (out of 1000) for the test set (default 50).
    pub test_per_mille: u16,
}

impl Default for CorpusConfig {
    fn default() -> Self {
        CorpusConfig {
            catalogs: PathBuf::from("/usr/share/locale"),
            lang: "de".to_string(),
            exclude_prefixes: vec!["iso_".to_string()],
            keep_contexts: true,
            min_words: 3,
            max_words: 30,
            max_length_ratio: Some(3.0),
            dev_per_mille: 50,
            test_per_mille: 50,
        }
    }
}

impl CorpusConfig {
    /// The directory the catalogues are read from: `catalogs/<lang>/LC_MESSAGES`.
    pub fn messages_dir(&self) -> PathBuf {
        self.catalogs.join(&self.lang).join("LC_MESSAGES")
    }

    fn validate(&self) -> Result<()> {
        if self.lang.is_empty() || self.lang.contains(['/', '\\']) || self.lang == ".." {
            bail!("lang {:?} is not a language directory name", self.lang);
        }
        if self.min_words > self.max_words {
            bail!(
                "min_words ({}) is above max_words ({})",
                self.min_words,
                self.max_words
            );
        }
        if let Some(r) = self.max_length_ratio {
            if !(r.is_finite() && r >= 1.0) {
                bail!("max_length_ratio {r} must be finite and at least 1");
            }
        }
        if u32::from(self.dev_per_mille) + u32::from(self.test_per_mille) > 1000 {
            bail!(
                "dev_per_mille ({}) + test_per_mille ({}) exceed 1000",
                self.dev_per_mille,
                self.test_per_mille
            );
        }
        Ok(())
    }
}

/// Why messages were not used, counted per message (each in its first applicable reason).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipCounts {
    /// Plural entries (skipped).
    pub plural: usize,
    /// Messages with a context, skipped (when `keep_contexts` is false).
    pub context: usize,
    /// Messages with a line break inside the trimmed source or translation.
    pub multi_line: usize,
    /// Empty source or translation after normalisation.
    pub empty: usize,
    /// Translation identical to the source.
    pub untranslated: usize,
    /// Control characters in source or translation.
    pub control: usize,
    /// Source length outside `min_words..=max_words`.
    pub length: usize,
    /// Byte-length ratio above `max_length_ratio`.
    pub ratio: usize,
}

impl SkipCounts {
    fn add(&mut self, other: &SkipCounts) {
        self.plural += other.plural;
        self.context += other.context;
        self.multi_line += other.multi_line;
        self.empty += other.empty;
        self.untranslated += other.untranslated;
        self.control += other.control;
        self.length += other.length;
        self.ratio += other.ratio;
    }

    /// The reasons and their counts, in the order they are applied.
    pub fn iter(&self) -> [(&'static str, usize); 8] {
        [
            ("plural", self.plural),
            ("context", self.context),
            ("multi_line", self.multi_line),
            ("empty", self.empty),
            ("untranslated", self.untranslated),
            ("control", self.control),
            ("length", self.length),
            ("ratio", self.ratio),
        ]
    }

    /// Sum over the reasons.
    pub fn total(&self) -> usize {
        self.iter().iter().map(|(_, n)| n).sum()
    }
}

/// What one catalogue contributed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CatalogueSummary {
    /// File name, e.g. `git.mo`.
    pub file: String,
    /// Format revision, e.g. `0.1`.
    pub revision: String,
    /// The charset the messages were decoded with (`encoding_rs`'s name).
    pub charset: String,
    /// Messages read (the header excluded; system-dependent strings expanded).
    pub messages: usize,
    /// Messages with a context that were kept (their context dropped).
    pub context_kept: usize,
    /// System-dependent strings expanded (minor revision 1).
    pub sysdep_expanded: usize,
    /// System-dependent strings skipped (a segment libintl does not know).
    pub sysdep_unsupported: usize,
    /// Messages not valid in the declared charset (dropped by the reader).
    pub undecodable: usize,
    /// Messages skipped, per reason.
    pub skipped: SkipCounts,
    /// Pairs that passed every filter (before removing duplicate sources).
    pub candidates: usize,
    /// Why the file was not used, when it failed to parse.
    pub error: Option<String>,
}

/// Sizes and hashes of one split.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitSummary {
    /// Number of pairs.
    pub pairs: usize,
    /// SHA-256 (hex) of the split's pairs, each `source\ttarget\n`, sorted by source.
    pub sha256: String,
}

/// What went into a corpus: the configuration, counts per catalogue and per reason, split
/// sizes and hashes. `Display` prints a short report (`{:#}` adds the per-catalogue table);
/// serde gives the JSON the study records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CorpusSummary {
    /// The configuration the corpus was built with.
    pub config: CorpusConfig,
    /// Catalogues read, by file name (sorted), failed ones included.
    pub catalogues: Vec<CatalogueSummary>,
    /// Files skipped by `exclude_prefixes`.
    pub excluded: Vec<String>,
    /// Messages read in all catalogues.
    pub messages: usize,
    /// Skip counts summed over the catalogues.
    pub skipped: SkipCounts,
    /// Messages with a context kept, summed.
    pub context_kept: usize,
    /// Candidate pairs (all filters passed), summed.
    pub candidates: usize,
    /// Candidates dropped because their source had already been taken.
    pub duplicate: usize,
    /// Sources whose candidates disagreed on the translation.
    pub conflicting_sources: usize,
    /// Pairs in the corpus (= unique sources).
    pub pairs: usize,
    /// SHA-256 (hex) of all pairs, each `source\ttarget\n`, sorted by source.
    pub sha256: String,
    /// Per split: train, dev, test.
    pub train: SplitSummary,
    /// Dev split.
    pub dev: SplitSummary,
    /// Test split.
    pub test: SplitSummary,
}

impl CorpusSummary {
    /// The summary as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a CorpusSummary serialises")
    }
}

impl fmt::Display for CorpusSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed = self.catalogues.iter().filter(|c| c.error.is_some()).count();
        writeln!(
            f,
            "corpus en-{}: {} catalogues in {} ({} failed to parse, {} excluded by name), {} messages",
            self.config.lang,
            self.catalogues.len(),
            self.config.messages_dir().display(),
            failed,
            self.excluded.len(),
            self.messages
        )?;
        let skipped: Vec<String> = self
            .skipped
            .iter()
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        writeln!(f, "  skipped: {}", skipped.join(", "))?;
        writeln!(
            f,
            "  kept: {} candidates ({} with a context), {} duplicate sources dropped ({} sources had conflicting translations)",
            self.candidates, self.context_kept, self.duplicate, self.conflicting_sources
        )?;
        writeln!(
            f,
            "  pairs: {} (train {}, dev {}, test {})",
            self.pairs, self.train.pairs, self.dev.pairs, self.test.pairs
        )?;
        write!(f, "  sha256 of the sorted pairs: {}", self.sha256)?;
        if f.alternate() {
            write!(
                f,
                "\n  {:<32} {:>4} {:>12} {:>8} {:>10} {:>9} {:>8}",
                "catalogue", "rev", "charset", "messages", "candidates", "skipped", "sysdep"
            )?;
            for c in &self.catalogues {
                match &c.error {
                    Some(e) => write!(f, "\n  {:<32} error: {e}", c.file)?,
                    None => write!(
                        f,
                        "\n  {:<32} {:>4} {:>12} {:>8} {:>10} {:>9} {:>8}",
                        c.file,
                        c.revision,
                        c.charset,
                        c.messages,
                        c.candidates,
                        c.skipped.total(),
                        c.sysdep_expanded
                    )?,
                }
            }
            if !self.excluded.is_empty() {
                write!(f, "\n  excluded: {}", self.excluded.join(" "))?;
            }
        }
        Ok(())
    }
}

/// A built corpus: the three splits (each in split-key hash order, see the module docs) and
/// its summary.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// Training pairs.
    pub train: Vec<Pair>,
    /// Development pairs.
    pub dev: Vec<Pair>,
    /// Test pairs.
    pub test: Vec<Pair>,
    /// Counts and hashes.
    pub summary: CorpusSummary,
}

impl Corpus {
    /// The pairs of one split.
    pub fn split(&self, split: Split) -> &[Pair] {
        match split {
            Split::Train => &self.train,
            Split::Dev => &self.dev,
            Split::Test => &self.test,
        }
    }

    /// Writes `train.tsv`, `dev.tsv`, `test.tsv` (`source<TAB>target`, one pair a line) and
    /// `corpus.json` (the summary) into `dir`, creating it.
    pub fn write(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for split in Split::ALL {
            let path = dir.join(format!("{split}.tsv"));
            let mut text = String::new();
            for p in self.split(split) {
                text.push_str(&p.source);
                text.push('\t');
                text.push_str(&p.target);
                text.push('\n');
            }
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        let path = dir.join("corpus.json");
        std::fs::write(&path, self.summary.to_json())
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// Collapses every run of Unicode whitespace to one ASCII space and trims both ends.
///
/// ```
/// use candle_bleu_research::data::corpus::normalize_whitespace;
/// assert_eq!(normalize_whitespace("  Fichier\u{a0}:\t%s \n"), "Fichier : %s");
/// ```
pub fn normalize_whitespace(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// The string a source is split by: lowercased, alphanumeric characters only.
///
/// ```
/// use candle_bleu_research::data::corpus::split_key;
/// assert_eq!(split_key("%s: File not found."), split_key("%s: file not found"));
/// assert_eq!(split_key("Datei öffnen"), "dateiöffnen");
/// ```
pub fn split_key(source: &str) -> String {
    source
        .chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

fn split_digest(source: &str) -> [u8; 32] {
    Sha256::digest(split_key(source).as_bytes()).into()
}

/// The split of a source under `config`'s shares (see the module docs).
///
/// ```
/// use candle_bleu_research::data::corpus::{split_of, CorpusConfig, Split};
/// let cfg = CorpusConfig::default();
/// // Depends on the text only, and variants in case or punctuation go together.
/// assert_eq!(split_of("Cannot open file", &cfg), split_of("cannot open file.", &cfg));
/// ```
pub fn split_of(source: &str, config: &CorpusConfig) -> Split {
    split_from_digest(&split_digest(source), config)
}

fn split_from_digest(digest: &[u8; 32], config: &CorpusConfig) -> Split {
    let head: [u8; 8] = digest[..8].try_into().expect("8 bytes");
    let bucket = u64::from_be_bytes(head) % 1000;
    let test = u64::from(config.test_per_mille);
    let dev = u64::from(config.dev_per_mille);
    if bucket < test {
        Split::Test
    } else if bucket < test + dev {
        Split::Dev
    } else {
        Split::Train
    }
}

/// SHA-256 (hex) of pairs written as `source\ttarget\n`, sorted by source then target.
pub fn pairs_sha256(pairs: &[Pair]) -> String {
    let mut sorted: Vec<&Pair> = pairs.iter().collect();
    sorted.sort();
    let mut hasher = Sha256::new();
    for p in sorted {
        hasher.update(p.source.as_bytes());
        hasher.update(b"\t");
        hasher.update(p.target.as_bytes());
        hasher.update(b"\n");
    }
    hex(&hasher.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What happened to one message.
enum Verdict {
    Pair(Pair),
    Skip(fn(&mut SkipCounts)),
}

fn classify(msg: &super::mo::Message, config: &CorpusConfig, context_kept: &mut usize) -> Verdict {
    if msg.msgid_plural.is_some() {
        return Verdict::Skip(|s| s.plural += 1);
    }
    if msg.context.is_some() {
        if !config.keep_contexts {
            return Verdict::Skip(|s| s.context += 1);
        }
        *context_kept += 1;
    }
    let target = msg.msgstr.first().map(String::as_str).unwrap_or("");
    if msg.msgid.trim().contains('\n') || target.trim().contains('\n') {
        return Verdict::Skip(|s| s.multi_line += 1);
    }
    let source = normalize_whitespace(&msg.msgid);
    let target = normalize_whitespace(target);
    if source.is_empty() || target.is_empty() {
        return Verdict::Skip(|s| s.empty += 1);
    }
    if source == target {
        return Verdict::Skip(|s| s.untranslated += 1);
    }
    if source.chars().chain(target.chars()).any(char::is_control) {
        return Verdict::Skip(|s| s.control += 1);
    }
    let words = source.split(' ').count();
    if words < config.min_words || words > config.max_words {
        return Verdict::Skip(|s| s.length += 1);
    }
    if let Some(max) = config.max_length_ratio {
        let (a, b) = (source.len() as f64, target.len() as f64);
        if a / b > max || b / a > max {
            return Verdict::Skip(|s| s.ratio += 1);
        }
    }
    Verdict::Pair(Pair { source, target })
}

/// Builds the corpus from `config.catalogs/<lang>/LC_MESSAGES/*.mo` (see the module docs).
///
/// Errors: a missing directory or one without `.mo` files (naming the path; on a machine
/// without catalogues, `scripts/fetch-catalogs.sh DIR` downloads some and `catalogs = DIR`
/// uses them), a bad configuration. A catalogue that fails to parse is not an error: it is
/// skipped and its error recorded in the summary.
pub fn build_corpus(config: &CorpusConfig) -> Result<Corpus> {
    config.validate()?;
    let dir = config.messages_dir();
    let entries = std::fs::read_dir(&dir).with_context(|| {
        format!(
            "reading the catalogues of {:?} in {} (no catalogues on this machine? \
             `scripts/fetch-catalogs.sh DIR` downloads some; then pass DIR as the catalogue directory)",
            config.lang,
            dir.display()
        )
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".mo") {
            continue;
        }
        let path = entry.path();
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        files.push((name, bytes));
    }
    if files.is_empty() {
        bail!("no .mo files in {}", dir.display());
    }
    corpus_from_files(&files, config)
}

/// Builds the corpus from catalogue files given as `(file name, bytes)` — what
/// [`build_corpus`] does after reading the directory. The result does not depend on the order
/// of `files`; `config.catalogs` is only recorded. Errors: two files with the same name, a bad
/// configuration.
pub fn corpus_from_files(files: &[(String, Vec<u8>)], config: &CorpusConfig) -> Result<Corpus> {
    config.validate()?;
    let mut sorted: Vec<&(String, Vec<u8>)> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut seen = HashSet::new();
    for (name, _) in &sorted {
        if !seen.insert(name.as_str()) {
            bail!("catalogue file name {name:?} given twice");
        }
    }

    let mut catalogues = Vec::new();
    let mut excluded = Vec::new();
    // source -> translation -> how many candidates gave it
    let mut candidates: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for (name, bytes) in sorted {
        if config
            .exclude_prefixes
            .iter()
            .any(|p| name.starts_with(p.as_str()))
        {
            excluded.push(name.clone());
            continue;
        }
        let mut summary = CatalogueSummary {
            file: name.clone(),
            ..Default::default()
        };
        let mo = match MoFile::parse(bytes, name) {
            Ok(mo) => mo,
            Err(e) => {
                summary.error = Some(e.to_string());
                catalogues.push(summary);
                continue;
            }
        };
        summary.revision = format!("{}.{}", mo.revision.0, mo.revision.1);
        summary.charset = mo.charset.clone();
        summary.messages = mo.messages.len();
        summary.sysdep_expanded = mo.stats.sysdep_expanded;
        summary.sysdep_unsupported = mo.stats.sysdep_unsupported;
        summary.undecodable = mo.stats.undecodable;
        for msg in &mo.messages {
            match classify(msg, config, &mut summary.context_kept) {
                Verdict::Pair(p) => {
                    summary.candidates += 1;
                    *candidates
                        .entry(p.source)
                        .or_default()
                        .entry(p.target)
                        .or_default() += 1;
                }
                Verdict::Skip(count) => count(&mut summary.skipped),
            }
        }
        catalogues.push(summary);
    }

    let mut skipped = SkipCounts::default();
    for c in &catalogues {
        skipped.add(&c.skipped);
    }
    let total_candidates: usize = catalogues.iter().map(|c| c.candidates).sum();
    let mut conflicting_sources = 0;
    let mut keyed: [Vec<([u8; 32], Pair)>; 3] = Default::default();
    let mut all = Vec::with_capacity(candidates.len());
    for (source, translations) in candidates {
        if translations.len() > 1 {
            conflicting_sources += 1;
        }
        // Most frequent; among equals the smallest (BTreeMap iterates in ascending order and
        // max_by keeps the last maximum, so compare with the order reversed on ties).
        let (target, _) = translations
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .expect("a source has at least one translation");
        let pair = Pair { source, target };
        let digest = split_digest(&pair.source);
        let split = split_from_digest(&digest, config);
        all.push(pair.clone());
        keyed[split as usize].push((digest, pair));
    }
    let [train, dev, test] = keyed.map(|mut v| {
        v.sort();
        v.into_iter().map(|(_, p)| p).collect::<Vec<Pair>>()
    });
    let split_summary = |pairs: &[Pair]| SplitSummary {
        pairs: pairs.len(),
        sha256: pairs_sha256(pairs),
    };
    let summary = CorpusSummary {
        config: config.clone(),
        messages: catalogues.iter().map(|c| c.messages).sum(),
        context_kept: catalogues.iter().map(|c| c.context_kept).sum(),
        skipped,
        candidates: total_candidates,
        duplicate: total_candidates - all.len(),
        conflicting_sources,
        pairs: all.len(),
        sha256: pairs_sha256(&all),
        train: split_summary(&train),
        dev: split_summary(&dev),
        test: split_summary(&test),
        catalogues,
        excluded,
    };
    Ok(Corpus {
        train,
        dev,
        test,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_buckets_follow_the_shares() {
        let cfg = CorpusConfig::default();
        let mut counts = [0usize; 3];
        for i in 0..20_000 {
            counts[split_of(&format!("sentence number {i}"), &cfg) as usize] += 1;
        }
        // 5 % each, within 4 standard deviations (sd of a binomial(20000, 0.05) ~ 31).
        assert!((counts[1] as i64 - 1000).abs() < 125, "{counts:?}");
        assert!((counts[2] as i64 - 1000).abs() < 125, "{counts:?}");
        let none = CorpusConfig {
            dev_per_mille: 0,
            test_per_mille: 0,
            ..Default::default()
        };
        assert_eq!(split_of("anything at all", &none), Split::Train);
    }

    #[test]
    fn split_digest_is_sha256_of_the_key() {
        // SHA-256("") — the key of a source with no alphanumeric character.
        assert_eq!(
            hex(&split_digest("... !!")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        // SHA-256("abc"), FIPS 180-2's test vector, for the key of "A-B-C".
        assert_eq!(
            hex(&split_digest("A-B-C")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn config_errors_name_the_field() {
        let bad = CorpusConfig {
            min_words: 5,
            max_words: 4,
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("min_words"));
        let bad = CorpusConfig {
            dev_per_mille: 600,
            test_per_mille: 500,
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("dev_per_mille"));
        let bad = CorpusConfig {
            max_length_ratio: Some(0.5),
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_length_ratio"));
        let bad = CorpusConfig {
            lang: "../etc".into(),
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("lang"));
    }
}
