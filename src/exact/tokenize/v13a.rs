//! sacrebleu's `13a` tokenizer (mteval-v13a.pl): the 13a-only rewrites (`<skipped>`, `-\n`, `\n`,
//! four HTML entities), followed by the `TokenizerRegexp` passes of module `regexp`, which it
//! shares with `zh`.

use super::regexp::{regexp_passes, PassBuffers};

/// The language-independent part of `Tokenizer13a.__call__`: delete `<skipped>`, delete `-\n`,
/// `\n` -> space, and unescape `&quot;` `&amp;` `&lt;` `&gt;` (in that order, only if the line
/// holds `&`: `&amp;lt;` becomes `<`, `&amp;quot;` becomes `&quot;`). Python's `str.replace` and
/// Rust's both replace non-overlapping occurrences left to right. Borrows `line` when nothing
/// changes.
pub(super) fn unescape_13a<'a>(line: &'a str, owned: &'a mut String) -> &'a str {
    // Single-byte searches first: a substring search costs more to set up than a short line.
    let bytes = line.as_bytes();
    let needs_skip = bytes.contains(&b'<') && line.contains("<skipped>");
    let needs_newline = bytes.contains(&b'\n');
    let needs_entities = bytes.contains(&b'&');
    if !(needs_skip || needs_newline || needs_entities) {
        return line;
    }
    let mut s = line.to_owned();
    if needs_skip {
        s = s.replace("<skipped>", "");
    }
    if needs_newline {
        s = s.replace("-\n", "").replace('\n', " ");
    }
    if s.contains('&') {
        s = s
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
    }
    *owned = s;
    owned
}

/// `Tokenizer13a.__call__` the slow, literal way ([`unescape_13a`], then [`regexp_passes`] on
/// `' ' + line + ' '`), on a line already lowercased (if asked) and right-stripped. The reference
/// that `regexp::regexp_spans` is tested against.
pub(super) fn tokenize_13a_reference<'b>(line: &str, bufs: &'b mut PassBuffers) -> &'b str {
    let mut owned = String::new();
    let line = unescape_13a(line, &mut owned);
    regexp_passes(line, true, bufs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str) -> String {
        let mut bufs = PassBuffers::default();
        tokenize_13a_reference(line, &mut bufs).to_owned()
    }

    #[test]
    fn matches_do_not_overlap() {
        // Python's re.sub output, spaces included (pass 1 triples every space): pass 2 splits
        // "a." only, pass 3 then splits both dots.
        assert_eq!(run("a..b"), "   a  .   . b   ");
        assert_eq!(run("1,000.50"), "   1,000.50   ");
        assert_eq!(run("&amp;lt;"), "    <    ");
    }
}
