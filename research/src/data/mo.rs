//! A reader for GNU gettext's compiled message catalogues (`.mo` files).
//!
//! A `.mo` file maps each original string (`msgid`) of a program to its translation
//! (`msgstr`). The format (GNU gettext manual, "The Format of GNU MO Files"):
//!
//! ```text
//! offset  field (u32 each, in the file's byte order)
//!      0  magic 0x950412de (read in the file's byte order; 0xde120495 read the other way)
//!      4  revision: major << 16 | minor
//!      8  N: number of static strings
//!     12  O: offset of the originals' table  (N × {length, offset})
//!     16  T: offset of the translations' table (N × {length, offset})
//!     20  S: size of the hash table, 24  H: its offset (a lookup structure; not read here)
//!     -- minor revision 1 only --
//!     28  number of system-dependent segments, 32  offset of the segments' table
//!     36  number of system-dependent strings,  40  offset of the originals' table
//!     44  offset of the translations' table
//! ```
//!
//! Every string is followed by a NUL byte that its length does not count. Within a string:
//! a plural entry is `msgid\0msgid_plural` with `msgstr[0]\0msgstr[1]\0…` as translation, a
//! message with a context is `msgctxt\x04msgid`, and the entry with the empty `msgid` is the
//! header (`Content-Type: text/plain; charset=UTF-8`, `Plural-Forms: …`).
//!
//! **Revisions.** Major revision 0 or 1 with minor revision 0 or 1 is read, what GNU msgfmt
//! writes and libintl loads; any other revision is an error. Major revision 1 only marks a file
//! whose system-dependent strings use glibc's `I` flag (msgfmt writes it then; the layout is the
//! same). Minor revision 1 adds *system-dependent* strings: messages
//! such as `"%" PRIdMAX " bytes copied"` whose format directives depend on the platform's
//! `<inttypes.h>`. They are stored as static pieces and references to named segments
//! (`PRIdMAX`, `PRIu64`, `I`, …), and libintl expands each segment when it loads the file. This
//! reader **expands them** the way libintl does on x86_64 Linux (glibc, LP64), with the values
//! of [`sysdep_segment_value`]: `"%<PRIdMAX> bytes copied"` becomes `"%ld bytes copied"`. A
//! string that names a segment libintl does not know is skipped, as libintl skips it, and
//! counted in [`MoStats::sysdep_unsupported`]; expanded ones are counted in
//! [`MoStats::sysdep_expanded`].
//!
//! **Charsets.** `msgstr`s are decoded with the charset the header declares (`charset=` in
//! `Content-Type`), through `encoding_rs` (EUC-KR, ISO-8859-1, …; `ASCII` is read as UTF-8,
//! its superset; no header or no `charset=` means UTF-8). A `msgid` is decoded as UTF-8 and, if
//! that fails, with the declared charset. A message whose bytes are not valid in its charset is
//! dropped and counted in [`MoStats::undecodable`]. A charset that `encoding_rs` does not know
//! (including the template's literal `CHARSET`) makes the file an error
//! ([`MoErrorKind::UnsupportedCharset`]), since none of its translations could be trusted.
//!
//! **Errors.** A malformed file (too short, wrong magic, unknown revision, a table or string
//! outside the file, a string without its terminating NUL, a bad system-dependent table) is a
//! [`MoError`] naming the file, the field and the byte offset. The reader never panics and never
//! allocates more than the file's size suggests: every count is checked against the file
//! length before it is used.
//!
//! ```
//! use candle_bleu_research::data::mo::{MoFile, MoWriter};
//!
//! let bytes = MoWriter::new()
//!     .header("Content-Type: text/plain; charset=UTF-8\n")
//!     .message("Open file", "Datei öffnen")
//!     .to_bytes();
//! let mo = MoFile::parse(&bytes, "example.mo")?;
//! assert_eq!(mo.charset, "UTF-8");
//! assert_eq!(mo.messages[0].msgid, "Open file");
//! assert_eq!(mo.messages[0].msgstr, ["Datei öffnen"]);
//! # Ok::<(), candle_bleu_research::data::mo::MoError>(())
//! ```

use std::fmt;
use std::path::Path;

/// The magic number, read in the file's byte order.
pub const MAGIC: u32 = 0x9504_12de;

/// Terminates a system-dependent string's segment list (`SEGMENTS_END` in gettext).
const SEGMENTS_END: u32 = u32::MAX;

/// Byte order of a `.mo` file (from its magic number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ByteOrder {
    /// Little-endian (`de 12 04 95` on disk).
    Little,
    /// Big-endian (`95 04 12 de` on disk).
    Big,
}

/// What is wrong with a `.mo` file.
#[derive(Debug)]
pub enum MoErrorKind {
    /// The file could not be read.
    Io(std::io::Error),
    /// The first four bytes are neither byte order's magic number.
    BadMagic {
        /// The first four bytes, read little-endian.
        found: u32,
    },
    /// A revision other than major 0 or 1, minor 0 or 1.
    UnsupportedRevision {
        /// Major revision (high 16 bits).
        major: u16,
        /// Minor revision (low 16 bits).
        minor: u16,
    },
    /// A field's bytes (a header field, a table, a string) lie outside the file.
    OutOfBounds {
        /// The field, e.g. `originals table`, `translation #12`.
        field: String,
        /// Where the field starts.
        offset: u64,
        /// How many bytes it needs.
        len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A string is not followed by the NUL byte the format requires.
    MissingNul {
        /// The string, e.g. `original #3`.
        field: String,
        /// Where the NUL should be.
        offset: u64,
    },
    /// A system-dependent string or segment is malformed.
    BadSysdep {
        /// The string or segment, e.g. `system-dependent original #2`.
        field: String,
        /// Offset of the offending bytes.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The header declares a charset that `encoding_rs` does not know.
    UnsupportedCharset {
        /// The declared label, e.g. `CHARSET`.
        label: String,
    },
}

/// An error reading a `.mo` file: which file and what is wrong where.
#[derive(Debug)]
pub struct MoError {
    /// The file's path or name, as given to the reader.
    pub file: String,
    /// What is wrong.
    pub kind: MoErrorKind,
}

impl fmt::Display for MoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file)?;
        match &self.kind {
            MoErrorKind::Io(e) => write!(f, "cannot read: {e}"),
            MoErrorKind::BadMagic { found } => write!(
                f,
                "not a .mo file: magic at offset 0 is {found:#010x}, expected {MAGIC:#010x} in either byte order"
            ),
            MoErrorKind::UnsupportedRevision { major, minor } => write!(
                f,
                "unsupported format revision {major}.{minor} at offset 4 (major 0 or 1, minor 0 or 1 are read)"
            ),
            MoErrorKind::OutOfBounds {
                field,
                offset,
                len,
                file_len,
            } => write!(
                f,
                "{field} at offset {offset} ({len} bytes) lies outside the file ({file_len} bytes)"
            ),
            MoErrorKind::MissingNul { field, offset } => {
                write!(f, "{field} is not NUL-terminated (offset {offset})")
            }
            MoErrorKind::BadSysdep {
                field,
                offset,
                reason,
            } => write!(f, "{field} at offset {offset}: {reason}"),
            MoErrorKind::UnsupportedCharset { label } => {
                write!(f, "the header declares charset {label:?}, which encoding_rs does not know")
            }
        }
    }
}

impl std::error::Error for MoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            MoErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// One message of a catalogue (the header excluded), decoded to UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `msgctxt`, when the message has one.
    pub context: Option<String>,
    /// The original string.
    pub msgid: String,
    /// `msgid_plural`, for a plural entry.
    pub msgid_plural: Option<String>,
    /// The translations: one for an ordinary message, one per plural form for a plural entry.
    pub msgstr: Vec<String>,
    /// Whether the message was a system-dependent string (expanded, see the module docs).
    pub system_dependent: bool,
}

/// Counts of what the reader saw, per file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MoStats {
    /// Static strings in the file (`N`, the header included).
    pub static_strings: usize,
    /// System-dependent strings in the file (minor revision 1).
    pub sysdep_strings: usize,
    /// System-dependent strings expanded into messages.
    pub sysdep_expanded: usize,
    /// System-dependent strings skipped because they name a segment libintl does not know.
    pub sysdep_unsupported: usize,
    /// Messages dropped because their bytes are not valid in the declared charset.
    pub undecodable: usize,
}

/// A parsed `.mo` catalogue.
#[derive(Debug, Clone)]
pub struct MoFile {
    /// The file's byte order.
    pub byte_order: ByteOrder,
    /// Format revision `(major, minor)`.
    pub revision: (u16, u16),
    /// The header (the translation of the empty `msgid`), decoded; `None` without one.
    pub header: Option<String>,
    /// The charset the messages were decoded with: `encoding_rs`'s name (`UTF-8`, `EUC-KR`,
    /// `windows-1252` for ISO-8859-1, which WHATWG maps to it).
    pub charset: String,
    /// The `charset=` label as the header declares it, if any.
    pub declared_charset: Option<String>,
    /// Every message but the header, in file order (static strings, then system-dependent).
    pub messages: Vec<Message>,
    /// What the reader counted.
    pub stats: MoStats,
}

/// A raw string pair before decoding.
struct RawEntry {
    msgid: Vec<u8>,
    msgstr: Vec<u8>,
    system_dependent: bool,
}

/// Bounds-checked little/big-endian reads over the file's bytes.
struct Reader<'a> {
    data: &'a [u8],
    order: ByteOrder,
    file: &'a str,
}

impl<'a> Reader<'a> {
    fn err(&self, kind: MoErrorKind) -> MoError {
        MoError {
            file: self.file.to_string(),
            kind,
        }
    }

    fn bytes(
        &self,
        field: &dyn Fn() -> String,
        offset: u64,
        len: u64,
    ) -> Result<&'a [u8], MoError> {
        let file_len = self.data.len() as u64;
        match offset.checked_add(len) {
            Some(end) if end <= file_len => Ok(&self.data[offset as usize..end as usize]),
            _ => Err(self.err(MoErrorKind::OutOfBounds {
                field: field(),
                offset,
                len,
                file_len,
            })),
        }
    }

    fn u32_at(&self, field: &dyn Fn() -> String, offset: u64) -> Result<u32, MoError> {
        let b: [u8; 4] = self
            .bytes(field, offset, 4)?
            .try_into()
            .expect("bytes() returned 4 bytes");
        Ok(match self.order {
            ByteOrder::Little => u32::from_le_bytes(b),
            ByteOrder::Big => u32::from_be_bytes(b),
        })
    }

    /// The string `index` of the `{length, offset}` table at `table` (length excludes the NUL).
    fn table_string(&self, what: &str, table: u64, index: u64) -> Result<&'a [u8], MoError> {
        let entry = table + 8 * index;
        let field = || format!("{what} #{index} table entry");
        let len = self.u32_at(&field, entry)? as u64;
        let offset = self.u32_at(&field, entry + 4)? as u64;
        let s = self.bytes(&|| format!("{what} #{index}"), offset, len)?;
        let nul = offset + len;
        if self.data.get(nul as usize) != Some(&0) {
            return Err(self.err(MoErrorKind::MissingNul {
                field: format!("{what} #{index}"),
                offset: nul,
            }));
        }
        Ok(s)
    }
}

impl MoFile {
    /// Reads and parses the `.mo` file at `path` (errors name the path).
    pub fn read(path: impl AsRef<Path>) -> Result<MoFile, MoError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let data = std::fs::read(path).map_err(|e| MoError {
            file: name.clone(),
            kind: MoErrorKind::Io(e),
        })?;
        MoFile::parse(&data, &name)
    }

    /// Parses the bytes of a `.mo` file; `file` names it in errors.
    pub fn parse(data: &[u8], file: &str) -> Result<MoFile, MoError> {
        let mut r = Reader {
            data,
            order: ByteOrder::Little,
            file,
        };
        let magic = r.u32_at(&|| "magic number".to_string(), 0)?;
        r.order = if magic == MAGIC {
            ByteOrder::Little
        } else if magic.swap_bytes() == MAGIC {
            ByteOrder::Big
        } else {
            return Err(r.err(MoErrorKind::BadMagic { found: magic }));
        };
        let revision = r.u32_at(&|| "revision".to_string(), 4)?;
        let (major, minor) = ((revision >> 16) as u16, (revision & 0xffff) as u16);
        if major > 1 || minor > 1 {
            return Err(r.err(MoErrorKind::UnsupportedRevision { major, minor }));
        }
        let header_field = |name: &'static str| move || format!("header field `{name}`");
        let n = r.u32_at(&header_field("number of strings"), 8)? as u64;
        let orig_tab = r.u32_at(&header_field("offset of originals table"), 12)? as u64;
        let trans_tab = r.u32_at(&header_field("offset of translations table"), 16)? as u64;
        // The hash table (20, 24) is a lookup structure; a reader of all messages ignores it.
        r.bytes(&header_field("hash table"), 20, 8)?;
        // Check both tables fit before reserving anything for N entries.
        r.bytes(&|| "originals table".to_string(), orig_tab, 8 * n)?;
        r.bytes(&|| "translations table".to_string(), trans_tab, 8 * n)?;

        let mut stats = MoStats {
            static_strings: n as usize,
            ..MoStats::default()
        };
        let mut raw = Vec::with_capacity(n as usize);
        for i in 0..n {
            raw.push(RawEntry {
                msgid: r.table_string("original", orig_tab, i)?.to_vec(),
                msgstr: r.table_string("translation", trans_tab, i)?.to_vec(),
                system_dependent: false,
            });
        }
        if minor >= 1 {
            read_sysdep(&r, &mut raw, &mut stats)?;
        }

        // The header: the translation of the empty msgid (no context).
        let header_bytes = raw
            .iter()
            .find(|e| e.msgid.is_empty())
            .map(|e| e.msgstr.clone());
        let declared_charset = header_bytes.as_deref().and_then(charset_label);
        let encoding = match declared_charset.as_deref() {
            None => encoding_rs::UTF_8,
            Some(label) if is_ascii_label(label) => encoding_rs::UTF_8,
            Some(label) => encoding_rs::Encoding::for_label(label.as_bytes()).ok_or_else(|| {
                r.err(MoErrorKind::UnsupportedCharset {
                    label: label.to_string(),
                })
            })?,
        };
        let decode = |bytes: &[u8]| -> Option<String> {
            encoding
                .decode_without_bom_handling_and_without_replacement(bytes)
                .map(|s| s.into_owned())
        };
        let header = header_bytes.as_deref().and_then(decode);

        let mut messages = Vec::with_capacity(raw.len());
        for e in raw {
            if e.msgid.is_empty() {
                continue; // the header
            }
            let msgid = std::str::from_utf8(&e.msgid)
                .ok()
                .map(str::to_string)
                .or_else(|| decode(&e.msgid));
            let (Some(msgid), Some(msgstr)) = (msgid, decode(&e.msgstr)) else {
                stats.undecodable += 1;
                continue;
            };
            let (context, msgid) = match msgid.split_once('\u{4}') {
                Some((ctx, id)) => (Some(ctx.to_string()), id.to_string()),
                None => (None, msgid),
            };
            let (msgid, msgid_plural) = match msgid.split_once('\0') {
                Some((id, plural)) => (id.to_string(), Some(plural.to_string())),
                None => (msgid, None),
            };
            messages.push(Message {
                context,
                msgid,
                msgid_plural,
                msgstr: msgstr.split('\0').map(str::to_string).collect(),
                system_dependent: e.system_dependent,
            });
        }
        Ok(MoFile {
            byte_order: r.order,
            revision: (major, minor),
            header,
            charset: encoding.name().to_string(),
            declared_charset,
            messages,
            stats,
        })
    }

    /// The header's `Plural-Forms` value, e.g. `nplurals=2; plural=(n != 1);`.
    pub fn plural_forms(&self) -> Option<&str> {
        self.header
            .as_deref()
            .and_then(|h| header_value(h, "Plural-Forms"))
    }
}

/// `ASCII` and its aliases: read as UTF-8 (strict), not as WHATWG's windows-1252 mapping.
fn is_ascii_label(label: &str) -> bool {
    matches!(
        label.to_ascii_lowercase().as_str(),
        "ascii" | "us-ascii" | "ansi_x3.4-1968"
    )
}

/// The value of `Key:` in a header (keys compare case-insensitively).
fn header_value<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    header.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case(key).then(|| v.trim())
    })
}

/// `charset=…` from the raw header's `Content-Type` line (the header is ASCII up to there).
fn charset_label(header: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(header);
    let content_type = header_value(&text, "Content-Type")?;
    let lower = content_type.to_ascii_lowercase();
    let start = lower.find("charset=")? + "charset=".len();
    let label: String = content_type[start..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ';')
        .collect();
    (!label.is_empty()).then_some(label)
}

/// The value libintl substitutes for a system-dependent segment on x86_64 Linux (glibc, LP64):
/// `PRI` + conversion (`d i o u x X`) + width (`8 16 32 64`, `LEAST…`, `FAST…`, `MAX`, `PTR`)
/// gives the `<inttypes.h>` macro's value (`PRIdMAX` → `ld`, `PRIu32` → `u`, `PRIxFAST16` →
/// `lx`), and `I` (glibc's locale-digits flag) gives `I`. Any other name gives `None`, and
/// libintl then skips the string.
///
/// ```
/// use candle_bleu_research::data::mo::sysdep_segment_value;
/// assert_eq!(sysdep_segment_value("PRIdMAX").as_deref(), Some("ld"));
/// assert_eq!(sysdep_segment_value("PRIu32").as_deref(), Some("u"));
/// assert_eq!(sysdep_segment_value("I").as_deref(), Some("I"));
/// assert_eq!(sysdep_segment_value("PRIq64"), None);
/// ```
pub fn sysdep_segment_value(name: &str) -> Option<String> {
    if name == "I" {
        return Some("I".to_string());
    }
    let rest = name.strip_prefix("PRI")?;
    let mut chars = rest.chars();
    let conversion = chars.next().filter(|c| "diouxX".contains(*c))?;
    let width = chars.as_str();
    let long = match width {
        "8" | "16" | "32" | "LEAST8" | "LEAST16" | "LEAST32" | "FAST8" => false,
        "64" | "LEAST64" | "FAST16" | "FAST32" | "FAST64" | "MAX" | "PTR" => true,
        _ => return None,
    };
    Some(format!("{}{conversion}", if long { "l" } else { "" }))
}

/// Reads the system-dependent tables of a minor-revision-1 file, appending the expanded
/// string pairs to `raw`.
fn read_sysdep(
    r: &Reader<'_>,
    raw: &mut Vec<RawEntry>,
    stats: &mut MoStats,
) -> Result<(), MoError> {
    let field = |name: &'static str| move || format!("header field `{name}`");
    let n_segments = r.u32_at(&field("number of system-dependent segments"), 28)? as u64;
    let segments_tab = r.u32_at(&field("offset of system-dependent segments"), 32)? as u64;
    let n_strings = r.u32_at(&field("number of system-dependent strings"), 36)? as u64;
    let orig_tab = r.u32_at(&field("offset of system-dependent originals"), 40)? as u64;
    let trans_tab = r.u32_at(&field("offset of system-dependent translations"), 44)? as u64;
    stats.sysdep_strings = n_strings as usize;
    if n_strings == 0 {
        return Ok(());
    }
    r.bytes(
        &|| "system-dependent segments table".to_string(),
        segments_tab,
        8 * n_segments,
    )?;
    r.bytes(
        &|| "system-dependent originals table".to_string(),
        orig_tab,
        4 * n_strings,
    )?;
    r.bytes(
        &|| "system-dependent translations table".to_string(),
        trans_tab,
        4 * n_strings,
    )?;

    let mut values = Vec::with_capacity(n_segments as usize);
    for i in 0..n_segments {
        let what = || format!("system-dependent segment #{i}");
        let len = r.u32_at(&what, segments_tab + 8 * i)? as u64;
        let offset = r.u32_at(&what, segments_tab + 8 * i + 4)? as u64;
        let name = r.bytes(&what, offset, len)?;
        // The stored length counts the NUL (gettext's loader requires it).
        let Some((&0, name)) = name.split_last() else {
            return Err(r.err(MoErrorKind::BadSysdep {
                field: what(),
                offset,
                reason: format!("the name ({len} bytes) does not end with NUL"),
            }));
        };
        values.push(
            std::str::from_utf8(name)
                .ok()
                .and_then(sysdep_segment_value),
        );
    }

    for i in 0..n_strings {
        let msgid = expand_sysdep(r, "system-dependent original", orig_tab, i, &values)?;
        let msgstr = expand_sysdep(r, "system-dependent translation", trans_tab, i, &values)?;
        match (msgid, msgstr) {
            (Some(msgid), Some(msgstr)) => {
                stats.sysdep_expanded += 1;
                raw.push(RawEntry {
                    msgid,
                    msgstr,
                    system_dependent: true,
                });
            }
            _ => stats.sysdep_unsupported += 1,
        }
    }
    Ok(())
}

/// Expands system-dependent string `index` of the table at `table`: `Ok(None)` when it names
/// a segment with no known value.
fn expand_sysdep(
    r: &Reader<'_>,
    what: &str,
    table: u64,
    index: u64,
    values: &[Option<String>],
) -> Result<Option<Vec<u8>>, MoError> {
    let field = || format!("{what} #{index}");
    let at = r.u32_at(&field, table + 4 * index)? as u64;
    let mut static_offset = r.u32_at(&field, at)? as u64;
    let mut pair = at + 4;
    let mut out = Vec::new();
    let mut supported = true;
    loop {
        let segsize = r.u32_at(&field, pair)? as u64;
        let sysdepref = r.u32_at(&field, pair + 4)?;
        pair += 8;
        out.extend_from_slice(r.bytes(&field, static_offset, segsize)?);
        static_offset += segsize;
        if sysdepref == SEGMENTS_END {
            break;
        }
        match values.get(sysdepref as usize) {
            None => {
                return Err(r.err(MoErrorKind::BadSysdep {
                    field: field(),
                    offset: pair - 4,
                    reason: format!(
                        "segment reference {sysdepref} but the file has {} segments",
                        values.len()
                    ),
                }))
            }
            Some(Some(value)) => out.extend_from_slice(value.as_bytes()),
            Some(None) => supported = false,
        }
    }
    // The last static piece carries the string's terminating NUL.
    if out.pop() != Some(0) {
        return Err(r.err(MoErrorKind::MissingNul {
            field: field(),
            offset: static_offset,
        }));
    }
    Ok(supported.then_some(out))
}

/// Writes `.mo` files: for tests, fixtures and examples (GNU msgfmt's layout, without the
/// hash table, which libintl needs to look messages up in minor-revision-1 files but a reader
/// of all messages does not). Strings are sorted by `msgid` bytes as msgfmt sorts them; the
/// revision is 0.0, or 0.1 with system-dependent strings (an `I` segment does not set major
/// revision 1 as msgfmt does).
///
/// ```
/// use candle_bleu_research::data::mo::{ByteOrder, MoFile, MoWriter};
/// let bytes = MoWriter::new()
///     .byte_order(ByteOrder::Big)
///     .plural("%d file", "%d files", &["%d Datei", "%d Dateien"])
///     .context("menu", "Open", "Öffnen")
///     .to_bytes();
/// let mo = MoFile::parse(&bytes, "t.mo")?;
/// assert_eq!(mo.byte_order, ByteOrder::Big);
/// assert_eq!(mo.messages.len(), 2);
/// # Ok::<(), candle_bleu_research::data::mo::MoError>(())
/// ```
#[derive(Debug, Clone)]
pub struct MoWriter {
    order: ByteOrder,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    sysdep: Vec<SysdepEntry>,
    revision1: bool,
}

/// A system-dependent string pair for [`MoWriter::sysdep`]: pieces of text and segment names.
#[derive(Debug, Clone)]
struct SysdepEntry {
    msgid: Vec<SysdepPiece>,
    msgstr: Vec<SysdepPiece>,
}

/// A piece of a system-dependent string: literal text or a segment name such as `PRIdMAX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SysdepPiece {
    /// Literal bytes.
    Text(Vec<u8>),
    /// A named segment, expanded by the reader (e.g. `PRIdMAX`).
    Segment(String),
}

impl Default for MoWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl MoWriter {
    /// An empty little-endian catalogue.
    pub fn new() -> Self {
        MoWriter {
            order: ByteOrder::Little,
            entries: Vec::new(),
            sysdep: Vec::new(),
            revision1: false,
        }
    }

    /// Sets the byte order.
    pub fn byte_order(mut self, order: ByteOrder) -> Self {
        self.order = order;
        self
    }

    /// Adds the header (the translation of the empty `msgid`).
    pub fn header(self, header: &str) -> Self {
        self.raw(b"", header.as_bytes())
    }

    /// Adds an ordinary message.
    pub fn message(self, msgid: &str, msgstr: &str) -> Self {
        self.raw(msgid.as_bytes(), msgstr.as_bytes())
    }

    /// Adds a message with a context (`msgctxt\x04msgid`).
    pub fn context(self, context: &str, msgid: &str, msgstr: &str) -> Self {
        self.raw(
            format!("{context}\u{4}{msgid}").as_bytes(),
            msgstr.as_bytes(),
        )
    }

    /// Adds a plural entry (`msgid\0msgid_plural`, `msgstr[0]\0msgstr[1]…`).
    pub fn plural(self, msgid: &str, msgid_plural: &str, msgstr: &[&str]) -> Self {
        self.raw(
            format!("{msgid}\0{msgid_plural}").as_bytes(),
            msgstr.join("\0").as_bytes(),
        )
    }

    /// Adds a string pair as raw bytes (e.g. a translation in a legacy charset).
    pub fn raw(mut self, msgid: &[u8], msgstr: &[u8]) -> Self {
        self.entries.push((msgid.to_vec(), msgstr.to_vec()));
        self
    }

    /// Adds a system-dependent string pair; the file becomes minor revision 1.
    pub fn sysdep(mut self, msgid: &[SysdepPiece], msgstr: &[SysdepPiece]) -> Self {
        self.sysdep.push(SysdepEntry {
            msgid: msgid.to_vec(),
            msgstr: msgstr.to_vec(),
        });
        self
    }

    /// Writes minor revision 1 (with empty system-dependent tables if none were added).
    pub fn revision1(mut self) -> Self {
        self.revision1 = true;
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let u32b = |v: u32| match self.order {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        };
        let mut entries = self.entries.clone();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let sysdep = &self.sysdep;
        let revision1 = self.revision1 || !sysdep.is_empty();
        let n = entries.len() as u32;
        let header_len: u32 = if revision1 { 48 } else { 28 };
        let orig_tab = header_len;
        let trans_tab = orig_tab + 8 * n;

        // Segment names, deduplicated in first-use order.
        let mut segments: Vec<String> = Vec::new();
        for e in sysdep {
            for piece in e.msgid.iter().chain(&e.msgstr) {
                if let SysdepPiece::Segment(s) = piece {
                    if !segments.contains(s) {
                        segments.push(s.clone());
                    }
                }
            }
        }
        let segments_tab = trans_tab + 8 * n;
        let sysdep_orig_tab = segments_tab + 8 * segments.len() as u32;
        let sysdep_trans_tab = sysdep_orig_tab + 4 * sysdep.len() as u32;
        // Each sysdep string descriptor: static offset + (segsize, ref) pairs.
        let descriptor_len = |pieces: &[SysdepPiece]| -> u32 {
            let refs = pieces
                .iter()
                .filter(|p| matches!(p, SysdepPiece::Segment(_)))
                .count() as u32;
            4 + 8 * (refs + 1)
        };
        let mut descriptors_at = sysdep_trans_tab + 4 * sysdep.len() as u32;
        let mut strings_at = descriptors_at;
        for e in sysdep {
            strings_at += descriptor_len(&e.msgid) + descriptor_len(&e.msgstr);
        }

        let mut out = Vec::new();
        out.extend(u32b(MAGIC));
        out.extend(u32b(if revision1 { 1 } else { 0 }));
        out.extend(u32b(n));
        out.extend(u32b(orig_tab));
        out.extend(u32b(trans_tab));
        out.extend(u32b(0));
        out.extend(u32b(0));
        if revision1 {
            out.extend(u32b(segments.len() as u32));
            out.extend(u32b(segments_tab));
            out.extend(u32b(sysdep.len() as u32));
            out.extend(u32b(sysdep_orig_tab));
            out.extend(u32b(sysdep_trans_tab));
        }
        // Tables first, then the string data after every table and descriptor.
        let mut data: Vec<u8> = Vec::new();
        let place = |bytes: &[u8], data: &mut Vec<u8>| -> u32 {
            let at = strings_at + data.len() as u32;
            data.extend_from_slice(bytes);
            data.push(0);
            at
        };
        let mut orig = Vec::new();
        let mut trans = Vec::new();
        for (id, s) in &entries {
            orig.push((id.len() as u32, place(id, &mut data)));
            trans.push((s.len() as u32, place(s, &mut data)));
        }
        for (len, at) in orig.iter().chain(&trans) {
            out.extend(u32b(*len));
            out.extend(u32b(*at));
        }
        if revision1 {
            for s in &segments {
                let at = place(s.as_bytes(), &mut data);
                out.extend(u32b(s.len() as u32 + 1));
                out.extend(u32b(at));
            }
            let mut descriptors: Vec<u8> = Vec::new();
            let mut offsets = [Vec::new(), Vec::new()];
            for (side, offsets) in offsets.iter_mut().enumerate() {
                for e in sysdep {
                    let pieces = if side == 0 { &e.msgid } else { &e.msgstr };
                    offsets.push(descriptors_at);
                    // Static bytes: the text pieces concatenated; sizes split at segments.
                    let mut statics = Vec::new();
                    let mut pairs = Vec::new();
                    let mut run = 0u32;
                    for p in pieces {
                        match p {
                            SysdepPiece::Text(t) => {
                                statics.extend_from_slice(t);
                                run += t.len() as u32;
                            }
                            SysdepPiece::Segment(name) => {
                                let index = segments.iter().position(|s| s == name).unwrap_or(0);
                                pairs.push((run, index as u32));
                                run = 0;
                            }
                        }
                    }
                    pairs.push((run + 1, SEGMENTS_END)); // the last piece carries the NUL
                    let at = place(&statics, &mut data);
                    descriptors.extend(u32b(at));
                    for (size, index) in pairs {
                        descriptors.extend(u32b(size));
                        descriptors.extend(u32b(index));
                    }
                    descriptors_at += descriptor_len(pieces);
                }
            }
            for off in offsets.iter().flatten() {
                out.extend(u32b(*off));
            }
            out.extend(descriptors);
        }
        debug_assert_eq!(out.len() as u32, strings_at);
        out.extend(data);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysdep_values_follow_glibc_lp64() {
        for (name, value) in [
            ("PRId8", "d"),
            ("PRIi16", "i"),
            ("PRIu32", "u"),
            ("PRIx64", "lx"),
            ("PRIXMAX", "lX"),
            ("PRIoPTR", "lo"),
            ("PRIdLEAST8", "d"),
            ("PRIdLEAST64", "ld"),
            ("PRIdFAST8", "d"),
            ("PRIuFAST16", "lu"),
            ("PRIuFAST32", "lu"),
            ("I", "I"),
        ] {
            assert_eq!(sysdep_segment_value(name).as_deref(), Some(value), "{name}");
        }
        for bad in [
            "",
            "PRI",
            "PRId",
            "PRIq8",
            "PRId7",
            "PRIdLEAST",
            "J",
            "PRIdMAXX",
        ] {
            assert_eq!(sysdep_segment_value(bad), None, "{bad}");
        }
    }

    #[test]
    fn charset_label_from_content_type() {
        let h = b"Project-Id-Version: x\nContent-Type: text/plain; charset=EUC-KR\nPlural-Forms: nplurals=1; plural=0;\n";
        assert_eq!(charset_label(h).as_deref(), Some("EUC-KR"));
        assert_eq!(
            charset_label(b"content-type: text/plain; CHARSET=utf-8\n").as_deref(),
            Some("utf-8")
        );
        assert_eq!(charset_label(b"Content-Type: text/plain\n"), None);
        assert_eq!(charset_label(b"Content-Type: text/plain; charset=\n"), None);
    }
}
