//! The `.mo` reader: GNU msgfmt's own output (committed fixtures from `tests/data/*.po`, see
//! `tests/data/generate.sh`), files the test writes itself (both byte orders, both revisions,
//! plurals, contexts, multi-line messages, system-dependent strings, legacy charsets), and
//! malformed files — truncated at every length, garbled at random bytes, with absurd counts —
//! each of which must be an error naming the file and the field, never a panic.

use candle_bleu_research::data::mo::{
    sysdep_segment_value, ByteOrder, Message, MoError, MoErrorKind, MoFile, MoWriter, SysdepPiece,
};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn msg(msgid: &str, msgstr: &str) -> Message {
    Message {
        context: None,
        msgid: msgid.into(),
        msgid_plural: None,
        msgstr: vec![msgstr.into()],
        system_dependent: false,
    }
}

/// The messages of `tests/data/de.po` as libintl on x86_64 Linux would load them.
fn de_messages() -> Vec<Message> {
    vec![
        Message {
            msgid: "%d file was removed".into(),
            msgid_plural: Some("%d files were removed".into()),
            msgstr: vec![
                "%d Datei wurde entfernt".into(),
                "%d Dateien wurden entfernt".into(),
            ],
            ..msg("", "")
        },
        msg("Cannot open file %s", "Datei %s kann nicht geöffnet werden"),
        msg(
            "Usage: prog [OPTION]...\nDo something.\n",
            "Aufruf: prog [OPTION]...\nEtwas tun.\n",
        ),
        Message {
            context: Some("menu".into()),
            ..msg("Open the file", "Die Datei öffnen")
        },
        Message {
            system_dependent: true,
            ..msg("%ld bytes copied in %s", "%ld Bytes kopiert in %s")
        },
        Message {
            system_dependent: true,
            ..msg("offset %lu is beyond %x", "Versatz %lu liegt hinter %x")
        },
        Message {
            system_dependent: true,
            ..msg("%d items left", "%Id Elemente übrig")
        },
    ]
}

#[test]
fn msgfmt_revision1_little_and_big_endian() {
    for (file, order) in [
        ("de.le.mo", ByteOrder::Little),
        ("de.be.mo", ByteOrder::Big),
    ] {
        let mo = MoFile::parse(&fixture(file), file).unwrap();
        assert_eq!(mo.byte_order, order, "{file}");
        // Major revision 1: a translation uses glibc's `I` flag (`%Id`).
        assert_eq!(mo.revision, (1, 1), "{file}");
        assert_eq!(mo.charset, "UTF-8");
        assert_eq!(mo.declared_charset.as_deref(), Some("UTF-8"));
        assert_eq!(mo.plural_forms(), Some("nplurals=2; plural=(n != 1);"));
        assert!(mo
            .header
            .as_deref()
            .unwrap()
            .starts_with("Project-Id-Version: fixture 1.0\n"));
        assert_eq!(mo.messages, de_messages(), "{file}");
        assert_eq!(mo.stats.static_strings, 5); // header, plural, two plain, context
        assert_eq!(mo.stats.sysdep_strings, 3);
        assert_eq!(mo.stats.sysdep_expanded, 3);
        assert_eq!(mo.stats.sysdep_unsupported, 0);
        assert_eq!(mo.stats.undecodable, 0);
    }
}

#[test]
fn msgfmt_revision0_euc_kr() {
    let mo = MoFile::parse(&fixture("ko.euc-kr.mo"), "ko.euc-kr.mo").unwrap();
    assert_eq!(mo.revision, (0, 0));
    assert_eq!(mo.byte_order, ByteOrder::Little);
    assert_eq!(mo.declared_charset.as_deref(), Some("EUC-KR"));
    assert_eq!(mo.charset, "EUC-KR");
    assert_eq!(
        mo.messages,
        vec![
            msg("Cannot open file %s", "파일 %s을(를) 열 수 없습니다"),
            msg("Memory exhausted", "메모리가 바닥났습니다"),
        ]
    );
}

#[test]
fn writer_matches_msgfmt_reading() {
    // The writer (used by the corpus tests) and msgfmt give files that read the same.
    let pieces = |parts: &[&str]| -> Vec<SysdepPiece> {
        parts
            .iter()
            .map(|p| match p.strip_prefix('<') {
                Some(name) => SysdepPiece::Segment(name.trim_end_matches('>').into()),
                None => SysdepPiece::Text(p.as_bytes().to_vec()),
            })
            .collect()
    };
    for order in [ByteOrder::Little, ByteOrder::Big] {
        let bytes = MoWriter::new()
            .byte_order(order)
            .header(
                "Project-Id-Version: fixture 1.0\nLanguage: de\nMIME-Version: 1.0\n\
                 Content-Type: text/plain; charset=UTF-8\nContent-Transfer-Encoding: 8bit\n\
                 Plural-Forms: nplurals=2; plural=(n != 1);\n",
            )
            .message("Cannot open file %s", "Datei %s kann nicht geöffnet werden")
            .context("menu", "Open the file", "Die Datei öffnen")
            .plural(
                "%d file was removed",
                "%d files were removed",
                &["%d Datei wurde entfernt", "%d Dateien wurden entfernt"],
            )
            .message(
                "Usage: prog [OPTION]...\nDo something.\n",
                "Aufruf: prog [OPTION]...\nEtwas tun.\n",
            )
            .sysdep(
                &pieces(&["%", "<PRIdMAX>", " bytes copied in %s"]),
                &pieces(&["%", "<PRIdMAX>", " Bytes kopiert in %s"]),
            )
            .sysdep(
                &pieces(&["offset %", "<PRIu64>", " is beyond %", "<PRIx32>"]),
                &pieces(&["Versatz %", "<PRIu64>", " liegt hinter %", "<PRIx32>"]),
            )
            .sysdep(
                &pieces(&["%d items left"]),
                &pieces(&["%", "<I>", "d Elemente übrig"]),
            )
            .to_bytes();
        let mine = MoFile::parse(&bytes, "written.mo").unwrap();
        assert_eq!(mine.byte_order, order);
        assert_eq!(mine.revision, (0, 1));
        assert_eq!(mine.messages, de_messages());
        assert_eq!(
            mine.header,
            MoFile::parse(&fixture("de.le.mo"), "de").unwrap().header
        );
    }
}

#[test]
fn revision0_and_empty_revision1_both_byte_orders() {
    for order in [ByteOrder::Little, ByteOrder::Big] {
        for rev1 in [false, true] {
            let mut w = MoWriter::new()
                .byte_order(order)
                .header("Content-Type: text/plain; charset=UTF-8\n")
                .message("Save the file", "Die Datei speichern");
            if rev1 {
                w = w.revision1();
            }
            let mo = MoFile::parse(&w.to_bytes(), "t.mo").unwrap();
            assert_eq!(mo.byte_order, order);
            assert_eq!(mo.revision, (0, rev1 as u16));
            assert_eq!(
                mo.messages,
                vec![msg("Save the file", "Die Datei speichern")]
            );
            assert_eq!(mo.stats.sysdep_strings, 0);
        }
    }
}

#[test]
fn unknown_sysdep_segment_is_skipped_and_counted() {
    let bytes = MoWriter::new()
        .sysdep(
            &[
                SysdepPiece::Text(b"value %".to_vec()),
                SysdepPiece::Segment("PRIq64".into()),
            ],
            &[
                SysdepPiece::Text(b"Wert %".to_vec()),
                SysdepPiece::Segment("PRIq64".into()),
            ],
        )
        .sysdep(
            &[
                SysdepPiece::Text(b"size %".to_vec()),
                SysdepPiece::Segment("PRIuPTR".into()),
            ],
            &[
                SysdepPiece::Text(b"Gr\xc3\xb6\xc3\x9fe %".to_vec()),
                SysdepPiece::Segment("PRIuPTR".into()),
            ],
        )
        .to_bytes();
    let mo = MoFile::parse(&bytes, "t.mo").unwrap();
    assert_eq!(mo.stats.sysdep_strings, 2);
    assert_eq!(mo.stats.sysdep_unsupported, 1);
    assert_eq!(mo.stats.sysdep_expanded, 1);
    assert_eq!(mo.messages.len(), 1);
    assert_eq!(mo.messages[0].msgid, "size %lu");
    assert_eq!(mo.messages[0].msgstr, ["Größe %lu"]);
    assert_eq!(sysdep_segment_value("PRIuPTR").as_deref(), Some("lu"));
}

#[test]
fn legacy_charsets_decode_and_bad_bytes_are_counted() {
    let (euc, _, bad) = encoding_rs::EUC_KR.encode("열 수 없습니다");
    assert!(!bad);
    let bytes = MoWriter::new()
        .header("Content-Type: text/plain; charset=EUC-KR\n")
        .raw(b"cannot open", &euc)
        .raw(b"broken translation", b"\xff\xff\xff") // not EUC-KR
        .to_bytes();
    let mo = MoFile::parse(&bytes, "ko.mo").unwrap();
    assert_eq!(mo.charset, "EUC-KR");
    assert_eq!(mo.messages, vec![msg("cannot open", "열 수 없습니다")]);
    assert_eq!(mo.stats.undecodable, 1);

    // ISO-8859-1 (WHATWG reads it as windows-1252, its superset for printable text).
    let bytes = MoWriter::new()
        .header("Content-Type: text/plain; charset=ISO-8859-1\n")
        .raw(b"Open file", b"Datei \xf6ffnen")
        .to_bytes();
    let mo = MoFile::parse(&bytes, "de.mo").unwrap();
    assert_eq!(mo.declared_charset.as_deref(), Some("ISO-8859-1"));
    assert_eq!(mo.charset, "windows-1252");
    assert_eq!(mo.messages[0].msgstr, ["Datei öffnen"]);

    // ASCII is read as strict UTF-8; no header means UTF-8; invalid UTF-8 is counted.
    for header in [Some("Content-Type: text/plain; charset=ASCII\n"), None] {
        let mut w = MoWriter::new();
        if let Some(h) = header {
            w = w.header(h);
        }
        let mo = MoFile::parse(
            &w.raw(b"ok message", b"gute Nachricht")
                .raw(b"bad message", b"\xc3\x28")
                .to_bytes(),
            "a.mo",
        )
        .unwrap();
        assert_eq!(mo.charset, "UTF-8");
        assert_eq!(mo.messages, vec![msg("ok message", "gute Nachricht")]);
        assert_eq!(mo.stats.undecodable, 1);
    }
}

#[test]
fn unknown_charset_is_an_error_naming_the_file_and_label() {
    let bytes = MoWriter::new()
        .header("Content-Type: text/plain; charset=CHARSET\n")
        .message("a b c", "x y z")
        .to_bytes();
    let err = MoFile::parse(&bytes, "template.mo").unwrap_err();
    assert!(matches!(&err.kind, MoErrorKind::UnsupportedCharset { label } if label == "CHARSET"));
    assert_eq!(
        err.to_string(),
        "template.mo: the header declares charset \"CHARSET\", which encoding_rs does not know"
    );
}

#[test]
fn header_errors_name_field_and_offset() {
    let err = MoFile::parse(b"\x00\x01", "short.mo").unwrap_err();
    assert_eq!(
        err.to_string(),
        "short.mo: magic number at offset 0 (4 bytes) lies outside the file (2 bytes)"
    );
    let mut bytes = MoWriter::new().message("a", "b").to_bytes();
    bytes[0] ^= 1;
    let err = MoFile::parse(&bytes, "bad.mo").unwrap_err();
    assert!(
        matches!(err.kind, MoErrorKind::BadMagic { found: 0x950412df }),
        "{err}"
    );
    assert!(err
        .to_string()
        .starts_with("bad.mo: not a .mo file: magic at offset 0 is 0x950412df"));

    for (revision, major, minor) in [(0x0000_0002u32, 0, 2), (0x0002_0000, 2, 0)] {
        let mut bytes = MoWriter::new().message("a", "b").to_bytes();
        bytes[4..8].copy_from_slice(&revision.to_le_bytes());
        let err = MoFile::parse(&bytes, "rev.mo").unwrap_err();
        assert!(
            matches!(err.kind, MoErrorKind::UnsupportedRevision { major: a, minor: b } if a == major && b == minor),
            "{err}"
        );
        assert!(err
            .to_string()
            .contains(&format!("revision {major}.{minor} at offset 4")));
    }
    // Major revision 1 (msgfmt's mark for the `I` flag) has the same layout.
    let mut bytes = MoWriter::new().message("a", "b").to_bytes();
    bytes[4..8].copy_from_slice(&0x0001_0000u32.to_le_bytes());
    assert_eq!(MoFile::parse(&bytes, "rev1.mo").unwrap().revision, (1, 0));

    // N = 2^32 - 1 strings: an error about the table, not a 32 GiB allocation.
    let mut bytes = MoWriter::new().message("a", "b").to_bytes();
    bytes[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = MoFile::parse(&bytes, "huge.mo").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "huge.mo: originals table at offset 28 ({} bytes) lies outside the file ({} bytes)",
            8 * u32::MAX as u64,
            bytes.len()
        )
    );
}

#[test]
fn string_errors_name_the_entry() {
    // One message: originals table at 28, translations at 36, strings from 44.
    let bytes = MoWriter::new().message("abc", "xyz").to_bytes();
    assert_eq!(&bytes[44..52], b"abc\0xyz\0");

    let mut b = bytes.clone();
    b[36..40].copy_from_slice(&1000u32.to_le_bytes()); // translation #0's length
    let err = MoFile::parse(&b, "len.mo").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "len.mo: translation #0 at offset 48 (1000 bytes) lies outside the file ({} bytes)",
            b.len()
        )
    );

    let mut b = bytes.clone();
    b[47] = b'!'; // the NUL after "abc"
    let err = MoFile::parse(&b, "nul.mo").unwrap_err();
    assert!(
        matches!(&err.kind, MoErrorKind::MissingNul { field, offset: 47 } if field == "original #0"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "nul.mo: original #0 is not NUL-terminated (offset 47)"
    );
}

#[test]
fn sysdep_errors_name_the_string() {
    let bytes = MoWriter::new()
        .sysdep(
            &[
                SysdepPiece::Text(b"n %".to_vec()),
                SysdepPiece::Segment("PRIu64".into()),
            ],
            &[
                SysdepPiece::Text(b"n %".to_vec()),
                SysdepPiece::Segment("PRIu64".into()),
            ],
        )
        .to_bytes();
    assert!(MoFile::parse(&bytes, "ok.mo").is_ok());
    // Layout: header 48, no static strings, segments table at 48 (8 bytes), originals table
    // at 56, translations at 60, descriptors from 64: {static offset, (3, 0), (1, END)}.
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    assert_eq!(u32_at(&bytes, 56), 64);
    assert_eq!(u32_at(&bytes, 72), 0); // segment reference of the original's first piece

    let mut b = bytes.clone();
    b[72..76].copy_from_slice(&7u32.to_le_bytes());
    let err = MoFile::parse(&b, "ref.mo").unwrap_err();
    assert_eq!(
        err.to_string(),
        "ref.mo: system-dependent original #0 at offset 72: segment reference 7 but the file has 1 segments"
    );

    let mut b = bytes.clone();
    b[48..52].copy_from_slice(&3u32.to_le_bytes()); // segment name length without its NUL
    let err = MoFile::parse(&b, "seg.mo").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("seg.mo: system-dependent segment #0 at offset "),
        "{err}"
    );
}

fn parse_no_panic(bytes: &[u8], what: &str) -> Result<MoFile, MoError> {
    std::panic::catch_unwind(|| MoFile::parse(bytes, "fuzz.mo"))
        .unwrap_or_else(|_| panic!("MoFile::parse panicked on {what}"))
}

/// A file exercising every table: static strings, plural, context, sysdep, big-endian.
fn rich_file(order: ByteOrder) -> Vec<u8> {
    MoWriter::new()
        .byte_order(order)
        .header(
            "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n != 1);\n",
        )
        .message("Cannot open file %s", "Datei %s kann nicht geöffnet werden")
        .context("menu", "Open", "Öffnen")
        .plural("%d file", "%d files", &["%d Datei", "%d Dateien"])
        .sysdep(
            &[
                SysdepPiece::Text(b"%".to_vec()),
                SysdepPiece::Segment("PRIdMAX".into()),
                SysdepPiece::Text(b" bytes".to_vec()),
            ],
            &[
                SysdepPiece::Text(b"%".to_vec()),
                SysdepPiece::Segment("PRIdMAX".into()),
                SysdepPiece::Text(b" Bytes".to_vec()),
            ],
        )
        .to_bytes()
}

#[test]
fn every_truncation_is_an_error() {
    for order in [ByteOrder::Little, ByteOrder::Big] {
        let bytes = rich_file(order);
        assert_eq!(MoFile::parse(&bytes, "full.mo").unwrap().messages.len(), 4);
        for len in 0..bytes.len() {
            let err = parse_no_panic(&bytes[..len], &format!("a {len}-byte prefix"))
                .expect_err(&format!("a {len}-byte prefix parsed"));
            assert!(err.to_string().starts_with("fuzz.mo: "), "{err}");
        }
    }
    for name in ["de.le.mo", "de.be.mo", "ko.euc-kr.mo"] {
        let bytes = fixture(name);
        for len in 0..bytes.len() {
            parse_no_panic(&bytes[..len], &format!("{name} cut at {len}"))
                .expect_err(&format!("{name} cut at {len} parsed"));
        }
    }
}

#[test]
fn garbled_bytes_never_panic() {
    // xorshift64*: a fixed pseudo-random sequence, no dependency.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let sources = [
        rich_file(ByteOrder::Little),
        rich_file(ByteOrder::Big),
        fixture("de.le.mo"),
        fixture("ko.euc-kr.mo"),
    ];
    let (mut ok, mut err) = (0, 0);
    for round in 0..4000 {
        let mut bytes = sources[round % sources.len()].clone();
        let flips = 1 + next() % 4;
        for _ in 0..flips {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = match next() % 3 {
                0 => next() as u8,
                1 => 0xff,
                _ => 0,
            };
        }
        match parse_no_panic(&bytes, &format!("garbled round {round}")) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(e.to_string().starts_with("fuzz.mo: "));
                err += 1
            }
        }
    }
    // Both outcomes occur (flips in string text still parse; flips in tables do not).
    assert!(ok > 100 && err > 100, "ok {ok}, err {err}");
}

#[test]
fn read_names_the_path() {
    let err = MoFile::read("/nonexistent/dir/x.mo").unwrap_err();
    assert!(matches!(err.kind, MoErrorKind::Io(_)));
    assert!(
        err.to_string()
            .starts_with("/nonexistent/dir/x.mo: cannot read: "),
        "{err}"
    );
    let path = format!("{}/tests/data/de.be.mo", env!("CARGO_MANIFEST_DIR"));
    assert_eq!(MoFile::read(&path).unwrap().messages, de_messages());
}
