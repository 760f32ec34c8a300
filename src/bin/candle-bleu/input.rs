//! The input side of the `candle-bleu` binary: line-aligned text corpora read exactly as
//! sacrebleu 2.6.0's command line reads them, and tokenized into `u32` ids for fast scoring.
//!
//! Part of the binary, not of the library's API (its messages speak of `--num-refs` and
//! "System N"). The fuzz target `fuzz/fuzz_targets/cli_input.rs` includes this file with
//! `#[path]`, so it must depend on nothing but the `candle_bleu` library.
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
//! Tokenizing and counting are in the `count` module.

use std::fmt;

use candle_bleu::exact::tokenize::is_python_whitespace;

/// Python's `str.rstrip()`: drops trailing Python whitespace (sacrebleu strips every line it
/// reads).
fn python_rstrip(text: &str) -> &str {
    text.trim_end_matches(is_python_whitespace)
}

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
pub enum HypInput<'s, 'a> {
    /// One file per system (`-i A B ...`).
    Files(&'s [Source<'a>]),
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

/// Reads references then hypotheses as sacrebleu's command line does (see the module docs),
/// then checks them: at least one reference, no empty input, every system and every reference
/// stream of the same length.
///
/// `num_refs > 1` splits the single reference file on tabs (`--num-refs`); it is an error with
/// more than one reference file, as in sacrebleu. Systems read from files are named after them;
/// systems read from standard input are `System 1`, `System 2`, ... (sacrebleu's names).
pub fn read_corpus<'a>(
    refs: &[Source<'a>],
    hyps: HypInput<'_, 'a>,
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
}
