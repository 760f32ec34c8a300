//! Line-aligned text corpora read exactly as sacrebleu 2.6.0's command line reads them, and
//! tokenized into `u32` ids for fast scoring (the input side of the `candle-bleu` binary).
//!
//! # How sacrebleu reads its inputs (`sacrebleu/sacrebleu.py`, `utils.smart_open`)
//! - **Files** (references and `-i` hypotheses) are opened with `newline="\n"`: lines end at
//!   `\n` only, so a lone `\r` stays inside its line; each line is then `rstrip()`ped (every
//!   trailing Python whitespace character, so the `\r` of a CRLF file goes, and so do trailing
//!   blanks, tabs, U+00A0, U+3000, U+001C..U+001F, ...). A final line without `\n` is a line; an
//!   empty file has no line.
//! - **`--num-refs N`**: each reference line (already `rstrip()`ped) is split with
//!   `line.split('\t', maxsplit=N-1)`; a line with fewer than `N` fields is an error (so a
//!   trailing empty reference, whose tab the `rstrip()` ate, is one too). Further tabs stay in
//!   the last reference.
//! - **Standard input** is decoded with universal newlines (`\n`, `\r\n` and a lone `\r` all end
//!   a line); each line is `rstrip()`ped and split on `\t`: one field per system. The first line
//!   fixes the number of systems; fields of later lines are `rstrip()`ped again.
//! - Everything is UTF-8 (`--encoding` other than UTF-8 is not supported here); a byte sequence
//!   that is not UTF-8 is an error (sacrebleu dies with `UnicodeDecodeError`). A byte-order mark
//!   is kept, as Python's `utf-8` codec keeps it.
//!
//! Differences, deliberate: an empty standard input is an error here (sacrebleu reads it as one
//! empty hypothesis), and every error is an [`InputError`] naming the input and the line instead
//! of a traceback or a bare exit status.
//!
//! Tokenization ([`TokenizedCorpus`]) is sacrebleu's `_preprocess_segment` then `str.split()`
//! ([`super::tokenize::TokenizeBuffer`]); hypothesis tokens are interned into `u32` ids (exact:
//! equal ids iff equal strings) and reference tokens looked up among them, a token that no
//! hypothesis holds getting [`REF_ONLY`], so statistics are counted on integers.

use std::fmt;

use rustc_hash::FxHashMap;

use super::tokenize::{python_rstrip, TokenizeBuffer, Tokenizer};
use super::{BleuStats, StatsCounter};

/// A malformed input. Every variant names the input (a file name, or `<stdin>`) and, where there
/// is one, the 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputError {
    /// The bytes are not UTF-8.
    InvalidUtf8 {
        name: String,
        /// 1-based line of the first invalid byte.
        line: usize,
        /// 0-based byte offset of the first invalid byte in the input.
        offset: usize,
    },
    /// The input holds no line at all.
    Empty { name: String },
    /// A hypothesis input and a reference stream have different numbers of lines.
    LineCount {
        hyp_name: String,
        hyp_lines: usize,
        ref_name: String,
        ref_lines: usize,
    },
    /// A `--num-refs` reference line with too few tab-separated fields.
    RefFields {
        name: String,
        line: usize,
        expected: usize,
        found: usize,
    },
    /// A line of standard input with another number of tab-separated fields (systems) than
    /// the first line.
    StdinFields {
        line: usize,
        expected: usize,
        found: usize,
    },
    /// `num_refs == 0`, or `--num-refs` with more than one reference file.
    NumRefs { message: String },
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputError::InvalidUtf8 { name, line, offset } => write!(
                f,
                "{name}: line {line}: invalid UTF-8 (first bad byte at byte offset {offset})"
            ),
            InputError::Empty { name } => write!(f, "{name}: the input is empty (no line)"),
            InputError::LineCount {
                hyp_name,
                hyp_lines,
                ref_name,
                ref_lines,
            } => write!(
                f,
                "system and reference streams have different lengths: {hyp_name} has \
                 {hyp_lines} line(s), {ref_name} has {ref_lines} line(s)"
            ),
            InputError::RefFields {
                name,
                line,
                expected,
                found,
            } => write!(
                f,
                "{name}: line {line}: expected {expected} tab-separated references \
                 (--num-refs {expected}), found {found}"
            ),
            InputError::StdinFields {
                line,
                expected,
                found,
            } => write!(
                f,
                "<stdin>: line {line}: {found} tab-separated field(s), but the first line has \
                 {expected} (one per system)"
            ),
            InputError::NumRefs { message } => write!(f, "--num-refs: {message}"),
        }
    }
}

impl std::error::Error for InputError {}

/// The name used for standard input in messages and as the system name prefix.
pub const STDIN_NAME: &str = "<stdin>";

/// Decodes `bytes` as UTF-8, or says where it is not (line and byte offset).
pub fn decode_utf8<'a>(name: &str, bytes: &'a [u8]) -> Result<&'a str, InputError> {
    std::str::from_utf8(bytes).map_err(|e| {
        let offset = e.valid_up_to();
        // Lines end at '\n' in files; for stdin a '\r' also ends one, but the count of '\n'
        // is what an editor shows for all but old-Mac files.
        let line = 1 + bytes[..offset].iter().filter(|&&b| b == b'\n').count();
        InputError::InvalidUtf8 {
            name: name.to_owned(),
            line,
            offset,
        }
    })
}

/// The lines of a file as sacrebleu reads them: split at `\n` only (a final line without `\n`
/// counts; nothing after a final `\n`), each `rstrip()`ped of Python whitespace.
pub fn file_lines<'a>(name: &str, bytes: &'a [u8]) -> Result<Vec<&'a str>, InputError> {
    let text = decode_utf8(name, bytes)?;
    let mut lines = Vec::with_capacity(bytes.len() / 64 + 1);
    let mut rest = text;
    while !rest.is_empty() {
        let (line, next) = match rest.find('\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        lines.push(python_rstrip(line));
        rest = next;
    }
    Ok(lines)
}

/// The lines of standard input with Python's universal newlines: `\r\n`, `\r` and `\n` each end
/// a line (not `rstrip()`ped).
pub fn universal_lines(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut lines = Vec::with_capacity(bytes.len() / 64 + 1);
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => {
                lines.push(&text[start..i]);
                i += 1;
                start = i;
            }
            b'\r' => {
                lines.push(&text[start..i]);
                i += if bytes.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < bytes.len() {
        lines.push(&text[start..]);
    }
    lines
}

/// Standard input as sacrebleu reads it: universal newlines, each line `rstrip()`ped and split
/// on `\t` into one hypothesis per system. Returns `systems[system][segment]`.
///
/// Errors: not UTF-8, no line at all (sacrebleu would score one empty hypothesis), a line whose
/// number of fields differs from the first line's.
pub fn stdin_systems(bytes: &[u8]) -> Result<Vec<Vec<&str>>, InputError> {
    let text = decode_utf8(STDIN_NAME, bytes)?;
    let lines = universal_lines(text);
    let Some(first) = lines.first() else {
        return Err(InputError::Empty {
            name: STDIN_NAME.to_owned(),
        });
    };
    // sacrebleu: `fields = inputfh.readline().rstrip().split('\t')`, the fields of the first
    // line kept as they are; later lines' fields are `rstrip()`ped.
    let mut systems: Vec<Vec<&str>> = python_rstrip(first)
        .split('\t')
        .map(|field| {
            let mut v = Vec::with_capacity(lines.len());
            v.push(field);
            v
        })
        .collect();
    let num_sys = systems.len();
    for (k, line) in lines.iter().enumerate().skip(1) {
        let found = python_rstrip(line).split('\t').count();
        if found != num_sys {
            return Err(InputError::StdinFields {
                line: k + 1,
                expected: num_sys,
                found,
            });
        }
        for (system, field) in systems.iter_mut().zip(python_rstrip(line).split('\t')) {
            system.push(python_rstrip(field));
        }
    }
    Ok(systems)
}

/// Splits `--num-refs` reference lines: `line.split('\t', maxsplit=num_refs-1)`, exactly
/// `num_refs` fields per line. Returns `refs[stream][segment]`.
pub fn split_num_refs<'a>(
    name: &str,
    lines: &[&'a str],
    num_refs: usize,
) -> Result<Vec<Vec<&'a str>>, InputError> {
    if num_refs == 0 {
        return Err(InputError::NumRefs {
            message: "must be >= 1, got 0".to_owned(),
        });
    }
    // Check every line before allocating `num_refs` streams (a huge `num_refs` fails on the
    // first line instead of exhausting memory).
    for (k, line) in lines.iter().enumerate() {
        let found = line.splitn(num_refs, '\t').count();
        if found != num_refs {
            return Err(InputError::RefFields {
                name: name.to_owned(),
                line: k + 1,
                expected: num_refs,
                found,
            });
        }
    }
    let mut streams: Vec<Vec<&str>> = (0..num_refs)
        .map(|_| Vec::with_capacity(lines.len()))
        .collect();
    for line in lines {
        for (stream, field) in streams.iter_mut().zip(line.splitn(num_refs, '\t')) {
            stream.push(field);
        }
    }
    Ok(streams)
}

/// One named input: a file's name (as given on the command line) and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub name: &'a str,
    pub bytes: &'a [u8],
}

/// Where the hypotheses come from.
#[derive(Debug, Clone, Copy)]
pub enum HypInput<'a> {
    /// One file per system (`-i A B ...`).
    Files(&'a [Source<'a>]),
    /// Standard input: one tab-separated field per system.
    Stdin(&'a [u8]),
}

/// A parsed corpus: systems (name and one hypothesis per segment) and reference streams
/// (`refs[stream][segment]`), every line already `rstrip()`ped as sacrebleu does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corpus<'a> {
    pub systems: Vec<(String, Vec<&'a str>)>,
    pub refs: Vec<Vec<&'a str>>,
    /// Name of each reference stream, for messages (`file` or `file (field k)`).
    pub ref_names: Vec<String>,
}

impl Corpus<'_> {
    /// Number of segments (lines).
    pub fn len(&self) -> usize {
        self.refs.first().map_or(0, Vec::len)
    }

    /// Whether there is no segment.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reads references then hypotheses as sacrebleu's command line does (see the module docs),
/// then checks them: at least one reference, no empty input, every system and every reference
/// stream of the same length.
///
/// `num_refs > 1` splits the single reference file on tabs (`--num-refs`); it is an error with
/// more than one reference file, as in sacrebleu. Systems read from files are named after them;
/// systems read from standard input are `System 1`, `System 2`, ... (sacrebleu's names).
pub fn read_corpus<'a>(
    refs: &[Source<'a>],
    hyps: HypInput<'a>,
    num_refs: usize,
) -> Result<Corpus<'a>, InputError> {
    if num_refs == 0 {
        return Err(InputError::NumRefs {
            message: "must be >= 1, got 0".to_owned(),
        });
    }
    if refs.is_empty() {
        return Err(InputError::NumRefs {
            message: "no reference file given".to_owned(),
        });
    }
    if num_refs != 1 && refs.len() > 1 {
        return Err(InputError::NumRefs {
            message: format!(
                "--num-refs {num_refs} reads tab-separated references from ONE file, but {} \
                 reference files were given",
                refs.len()
            ),
        });
    }
    let mut streams = Vec::new();
    let mut ref_names = Vec::new();
    for source in refs {
        let lines = file_lines(source.name, source.bytes)?;
        if lines.is_empty() {
            return Err(InputError::Empty {
                name: source.name.to_owned(),
            });
        }
        if num_refs == 1 {
            streams.push(lines);
            ref_names.push(source.name.to_owned());
        } else {
            for (k, stream) in split_num_refs(source.name, &lines, num_refs)?
                .into_iter()
                .enumerate()
            {
                streams.push(stream);
                ref_names.push(format!("{} (field {})", source.name, k + 1));
            }
        }
    }
    let systems: Vec<(String, Vec<&str>)> = match hyps {
        HypInput::Files(files) => {
            let mut systems = Vec::with_capacity(files.len());
            for source in files {
                let lines = file_lines(source.name, source.bytes)?;
                if lines.is_empty() {
                    return Err(InputError::Empty {
                        name: source.name.to_owned(),
                    });
                }
                systems.push((source.name.to_owned(), lines));
            }
            systems
        }
        HypInput::Stdin(bytes) => stdin_systems(bytes)?
            .into_iter()
            .enumerate()
            .map(|(i, lines)| (format!("System {}", i + 1), lines))
            .collect(),
    };
    for (name, lines) in &systems {
        for (ref_name, stream) in ref_names.iter().zip(&streams) {
            if lines.len() != stream.len() {
                return Err(InputError::LineCount {
                    hyp_name: if matches!(hyps, HypInput::Stdin(_)) && systems.len() == 1 {
                        STDIN_NAME.to_owned()
                    } else {
                        name.clone()
                    },
                    hyp_lines: lines.len(),
                    ref_name: ref_name.clone(),
                    ref_lines: stream.len(),
                });
            }
        }
    }
    Ok(Corpus {
        systems,
        refs: streams,
        ref_names,
    })
}

/// Token ids of many segments laid end to end: segment `i` is `ids[offsets[i]..offsets[i+1]]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segments {
    pub ids: Vec<u32>,
    pub offsets: Vec<usize>,
}

impl Segments {
    /// Number of segments.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Whether there is no segment.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of segment `i` (panics if `i >= len()`).
    pub fn get(&self, i: usize) -> &[u32] {
        &self.ids[self.offsets[i]..self.offsets[i + 1]]
    }
}

/// Interns token strings into dense `u32` ids: equal ids iff equal strings.
#[derive(Debug, Default)]
struct Interner {
    map: FxHashMap<Box<str>, u32>,
}

impl Interner {
    fn with_capacity(n: usize) -> Self {
        Self {
            map: FxHashMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    fn id(&mut self, token: &str) -> u32 {
        if let Some(&id) = self.map.get(token) {
            return id;
        }
        let id = self.map.len() as u32;
        self.map.insert(token.into(), id);
        id
    }
}

/// The id of a reference token that occurs in no hypothesis (see [`TokenizedCorpus::new`]).
pub const REF_ONLY: u32 = u32::MAX;

/// Segments of at least this many lines are tokenized on rayon's pool.
const PARALLEL_MIN_LINES: usize = 2048;

/// Tokenizes reference `lines` into the ids of `vocab` ([`REF_ONLY`] for unknown tokens),
/// appending to `out`.
fn lookup_chunk(
    lines: &[&str],
    tok: Tokenizer,
    lowercase: bool,
    vocab: &Interner,
    buf: &mut TokenizeBuffer,
    out: &mut Segments,
) {
    if out.offsets.is_empty() {
        out.offsets.push(out.ids.len());
    }
    let bytes: usize = lines.iter().map(|l| l.len()).sum();
    out.ids.reserve(bytes / 5 + 16);
    out.offsets.reserve(lines.len());
    for line in lines {
        for token in buf.tokenize(line, tok, lowercase) {
            out.ids
                .push(vocab.map.get(token).copied().unwrap_or(REF_ONLY));
        }
        out.offsets.push(out.ids.len());
    }
}

/// Tokenizes `lines` into chunk-local ids (one interner per chunk), appending to `out`.
fn tokenize_chunk(
    lines: &[&str],
    tok: Tokenizer,
    lowercase: bool,
    interner: &mut Interner,
    buf: &mut TokenizeBuffer,
    out: &mut Segments,
) {
    if out.offsets.is_empty() {
        out.offsets.push(out.ids.len());
    }
    // About one token per 5 bytes of English text: reserve once instead of doubling.
    let bytes: usize = lines.iter().map(|l| l.len()).sum();
    out.ids.reserve(bytes / 5 + 16);
    out.offsets.reserve(lines.len());
    for line in lines {
        for token in buf.tokenize(line, tok, lowercase) {
            out.ids.push(interner.id(token));
        }
        out.offsets.push(out.ids.len());
    }
}

/// Every system and reference stream of a [`Corpus`], tokenized as sacrebleu's BLEU does
/// (`lowercase`, then the tokenizer on the `rstrip()`ped line, then `str.split()`) and interned
/// into one id space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedCorpus {
    /// `systems[s]`: the hypotheses of system `s`.
    pub systems: Vec<Segments>,
    /// `refs[r]`: reference stream `r`.
    pub refs: Vec<Segments>,
}

impl TokenizedCorpus {
    /// Tokenizes every line of `corpus`: first the hypotheses, interned into dense ids, then the
    /// references, whose tokens are only looked up: a reference token that occurs in no
    /// hypothesis gets [`REF_ONLY`] (it can match nothing, so it needs no id of its own).
    ///
    /// Large corpora are cut into chunks tokenized on rayon's pool: hypothesis chunks with their
    /// own interners, merged afterwards (exact: ids are renumbered, never hashed); reference
    /// chunks against the finished, shared vocabulary.
    pub fn new(corpus: &Corpus<'_>, tok: Tokenizer, lowercase: bool) -> Self {
        let systems: Vec<&[&str]> = corpus
            .systems
            .iter()
            .map(|(_, lines)| lines.as_slice())
            .collect();
        let refs: Vec<&[&str]> = corpus.refs.iter().map(Vec::as_slice).collect();
        let total_lines: usize = systems.iter().chain(&refs).map(|s| s.len()).sum();
        if total_lines >= PARALLEL_MIN_LINES && rayon::current_num_threads() > 1 {
            let (systems, vocab) = tokenize_parallel(&systems, tok, lowercase);
            let refs = lookup_parallel(&refs, tok, lowercase, &vocab);
            return TokenizedCorpus { systems, refs };
        }
        let mut interner = Interner::default();
        let mut buf = TokenizeBuffer::default();
        let systems = systems
            .iter()
            .map(|lines| {
                let mut seg = Segments::default();
                tokenize_chunk(lines, tok, lowercase, &mut interner, &mut buf, &mut seg);
                seg
            })
            .collect();
        let refs = refs
            .iter()
            .map(|lines| {
                let mut seg = Segments::default();
                lookup_chunk(lines, tok, lowercase, &interner, &mut buf, &mut seg);
                seg
            })
            .collect();
        TokenizedCorpus { systems, refs }
    }

    /// Number of segments.
    pub fn len(&self) -> usize {
        self.refs.first().map_or(0, Segments::len)
    }

    /// Whether there is no segment.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The references of every segment laid out flat: segment `i` is
    /// `[i * R .. (i + 1) * R]` with `R = refs.len()`.
    fn ref_table(&self) -> Vec<&[u32]> {
        let n = self.len();
        let r = self.refs.len();
        let mut table = Vec::with_capacity(n * r);
        for i in 0..n {
            for stream in &self.refs {
                table.push(stream.get(i));
            }
        }
        table
    }

    /// Per-segment statistics of system `system` (sacrebleu's segment statistics), orders
    /// `1..=max_order`. Panics if `system` is out of range.
    pub fn segment_stats(&self, system: usize, max_order: usize) -> Vec<BleuStats> {
        let hyps = &self.systems[system];
        let table = self.ref_table();
        let r = self.refs.len();
        let mut counter = StatsCounter::new(max_order);
        (0..self.len())
            .map(|i| counter.segment(hyps.get(i), &table[i * r..(i + 1) * r]))
            .collect()
    }

    /// Summed statistics of system `system`, orders `1..=max_order` (counted on rayon's pool
    /// for large corpora). Panics if `system` is out of range.
    pub fn stats_sum(&self, system: usize, max_order: usize) -> BleuStats {
        use rayon::prelude::*;
        let hyps = &self.systems[system];
        let table = self.ref_table();
        let r = self.refs.len().max(1);
        let n = self.len();
        let count = |range: std::ops::Range<usize>| {
            let mut counter = StatsCounter::new(max_order);
            let mut total = BleuStats::zeros(max_order);
            for i in range {
                counter.add_segment(hyps.get(i), &table[i * r..(i + 1) * r], &mut total);
            }
            total
        };
        let threads = rayon::current_num_threads();
        if n < PARALLEL_MIN_LINES || threads < 2 {
            return count(0..n);
        }
        let chunk = n.div_ceil(2 * threads).max(256);
        (0..n.div_ceil(chunk))
            .into_par_iter()
            .map(|c| count(c * chunk..((c + 1) * chunk).min(n)))
            .reduce(|| BleuStats::zeros(max_order), |a, b| a + b)
    }
}

/// Parallel tokenization: every stream is cut into chunks; each chunk is tokenized with its own
/// interner; the chunk vocabularies are then merged into one id space in order, and each
/// chunk's ids renumbered.
fn tokenize_parallel(
    streams: &[&[&str]],
    tok: Tokenizer,
    lowercase: bool,
) -> (Vec<Segments>, Interner) {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads();
    let total: usize = streams.iter().map(|s| s.len()).sum();
    let chunk_lines = total.div_ceil(2 * threads).max(512);
    // (stream, line range) per chunk, in order.
    let mut jobs = Vec::new();
    for (s, lines) in streams.iter().enumerate() {
        let mut start = 0;
        while start < lines.len() {
            let end = (start + chunk_lines).min(lines.len());
            jobs.push((s, start, end));
            start = end;
        }
    }
    let chunks: Vec<(Segments, Vec<Box<str>>)> = jobs
        .par_iter()
        .map(|&(s, start, end)| {
            let mut interner = Interner::with_capacity(4096);
            let mut buf = TokenizeBuffer::default();
            let mut seg = Segments::default();
            tokenize_chunk(
                &streams[s][start..end],
                tok,
                lowercase,
                &mut interner,
                &mut buf,
                &mut seg,
            );
            // The chunk's tokens by id (ids are dense: 0..len).
            let mut vocab: Vec<Box<str>> = vec![Box::from(""); interner.map.len()];
            for (token, id) in interner.map {
                vocab[id as usize] = token;
            }
            (seg, vocab)
        })
        .collect();
    let mut global = Interner::with_capacity(8192);
    let mut out: Vec<Segments> = streams
        .iter()
        .map(|lines| Segments {
            ids: Vec::new(),
            offsets: Vec::with_capacity(lines.len() + 1),
        })
        .collect();
    for (&(s, _, _), (seg, vocab)) in jobs.iter().zip(chunks) {
        let remap: Vec<u32> = vocab.iter().map(|t| global.id(t)).collect();
        let dst = &mut out[s];
        let base = dst.ids.len();
        if dst.offsets.is_empty() {
            dst.offsets.push(0);
        }
        dst.ids.extend(seg.ids.iter().map(|&id| remap[id as usize]));
        dst.offsets
            .extend(seg.offsets.iter().skip(1).map(|&o| base + o));
    }
    for seg in &mut out {
        if seg.offsets.is_empty() {
            seg.offsets.push(0);
        }
    }
    (out, global)
}

/// [`lookup_chunk`] on rayon's pool: every stream cut into chunks, all reading `vocab`.
fn lookup_parallel(
    streams: &[&[&str]],
    tok: Tokenizer,
    lowercase: bool,
    vocab: &Interner,
) -> Vec<Segments> {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads();
    let total: usize = streams.iter().map(|s| s.len()).sum();
    let chunk_lines = total.div_ceil(2 * threads).max(512);
    streams
        .iter()
        .map(|lines| {
            let chunks: Vec<Segments> = lines
                .par_chunks(chunk_lines)
                .map(|chunk| {
                    let mut buf = TokenizeBuffer::default();
                    let mut seg = Segments::default();
                    lookup_chunk(chunk, tok, lowercase, vocab, &mut buf, &mut seg);
                    seg
                })
                .collect();
            let mut out = Segments {
                ids: Vec::with_capacity(chunks.iter().map(|c| c.ids.len()).sum()),
                offsets: Vec::with_capacity(lines.len() + 1),
            };
            out.offsets.push(0);
            for seg in chunks {
                let base = out.ids.len();
                out.ids.extend_from_slice(&seg.ids);
                out.offsets
                    .extend(seg.offsets.iter().skip(1).map(|&o| base + o));
            }
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_lines_split_on_newline_only_and_rstrip() {
        let lines = file_lines("f", b"a b \r\nc\rd\t\n\n e\xc2\xa0").unwrap();
        assert_eq!(lines, ["a b", "c\rd", "", " e"]);
        assert!(file_lines("f", b"").unwrap().is_empty());
        assert_eq!(file_lines("f", b"\n").unwrap(), [""]);
    }

    #[test]
    fn invalid_utf8_names_the_line() {
        let err = file_lines("hyp.txt", b"ok\nok\nbad \xff\n").unwrap_err();
        assert_eq!(
            err,
            InputError::InvalidUtf8 {
                name: "hyp.txt".into(),
                line: 3,
                offset: 10
            }
        );
        assert!(err.to_string().contains("hyp.txt: line 3"));
    }

    #[test]
    fn stdin_universal_newlines_and_tabs() {
        let systems = stdin_systems(b"a\tb \r\nc \td\re\tf\n").unwrap();
        assert_eq!(systems, [vec!["a", "c", "e"], vec!["b", "d", "f"]]);
        assert!(matches!(
            stdin_systems(b"a\tb\nc\n"),
            Err(InputError::StdinFields {
                line: 2,
                expected: 2,
                found: 1
            })
        ));
        assert!(matches!(stdin_systems(b""), Err(InputError::Empty { .. })));
        assert_eq!(stdin_systems(b"\n").unwrap(), [vec![""]]);
    }

    #[test]
    fn num_refs_split() {
        let refs = split_num_refs("r", &["a\tb", "c\td\te"], 2).unwrap();
        assert_eq!(refs, [vec!["a", "c"], vec!["b", "d\te"]]);
        assert!(matches!(
            split_num_refs("r", &["a\tb", "c"], 2),
            Err(InputError::RefFields {
                line: 2,
                found: 1,
                ..
            })
        ));
    }

    #[test]
    fn read_corpus_checks_lengths() {
        let refs = [Source {
            name: "ref",
            bytes: b"a\nb\n",
        }];
        let hyps = [Source {
            name: "hyp",
            bytes: b"a\n",
        }];
        let err = read_corpus(&refs, HypInput::Files(&hyps), 1).unwrap_err();
        assert!(matches!(
            err,
            InputError::LineCount {
                hyp_lines: 1,
                ref_lines: 2,
                ..
            }
        ));
        let hyps = [Source {
            name: "hyp",
            bytes: b"",
        }];
        assert!(matches!(
            read_corpus(&refs, HypInput::Files(&hyps), 1),
            Err(InputError::Empty { .. })
        ));
    }

    #[test]
    fn parallel_and_serial_tokenization_agree() {
        let text: String = (0..5000)
            .map(|i| format!("w{} x{} , the {}\n", i % 97, i % 13, i % 7))
            .collect();
        // References with tokens of their own (`y..`, `z`): REF_ONLY ids.
        let ref_text: String = (0..5000)
            .map(|i| format!("w{} y{} , the {} z\n", i % 89, i % 11, i % 7))
            .collect();
        let refs = [Source {
            name: "ref",
            bytes: ref_text.as_bytes(),
        }];
        let hyps = [Source {
            name: "hyp",
            bytes: text.as_bytes(),
        }];
        let corpus = read_corpus(&refs, HypInput::Files(&hyps), 1).unwrap();
        let (par, vocab) = tokenize_parallel(&[&corpus.systems[0].1], Tokenizer::V13a, false);
        let par_refs = lookup_parallel(&[&corpus.refs[0]], Tokenizer::V13a, false, &vocab);
        let mut interner = Interner::default();
        let mut buf = TokenizeBuffer::default();
        let mut serial = Segments::default();
        tokenize_chunk(
            &corpus.systems[0].1,
            Tokenizer::V13a,
            false,
            &mut interner,
            &mut buf,
            &mut serial,
        );
        let mut serial_refs = Segments::default();
        lookup_chunk(
            &corpus.refs[0],
            Tokenizer::V13a,
            false,
            &interner,
            &mut buf,
            &mut serial_refs,
        );
        assert_eq!(par, [serial]);
        assert_eq!(par_refs, [serial_refs]);
        assert!(par_refs[0].ids.contains(&REF_ONLY));
        let tc = TokenizedCorpus::new(&corpus, Tokenizer::V13a, false);
        let sum = tc.stats_sum(0, 4);
        let segs: BleuStats = tc.segment_stats(0, 4).iter().sum();
        assert_eq!(sum, segs);
        // The same statistics from the tokens as strings.
        let tokens = |l: &str| super::super::tokenize::tokenize(l, Tokenizer::V13a, false);
        let hyps: Vec<Vec<String>> = corpus.systems[0].1.iter().map(|l| tokens(l)).collect();
        let refs: Vec<Vec<Vec<String>>> = corpus.refs[0].iter().map(|l| vec![tokens(l)]).collect();
        assert_eq!(
            sum,
            super::super::corpus_stats_sum(&hyps, &refs, 4).unwrap()
        );
    }
}
