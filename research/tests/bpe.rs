//! The byte-level BPE vocabulary: lossless round trips (Latin, Hangul, CJK, emoji, combining
//! marks, characters never seen in training, special-token strings as text), fixed special
//! ids, deterministic training (input order, thread count, a golden SHA-256 of the
//! `tokenizer.json` bytes), save/load, and errors.

use candle_bleu_research::data::bpe::{Bpe, BpeConfig, BOS, EOS, MIN_VOCAB_SIZE, PAD, UNK};
use candle_bleu_research::data::corpus::{corpus_from_files, CorpusConfig, Pair};
use candle_bleu_research::data::mo::MoWriter;
use sha2::{Digest, Sha256};

/// A small multilingual training set: German, French, Korean, Japanese, repeated with
/// variations so that merges have counts above 1.
fn training_texts() -> Vec<String> {
    let base = [
        "Cannot open file %s",
        "Datei %s kann nicht geöffnet werden",
        "Impossible d'ouvrir le fichier « %s »",
        "파일 %s을(를) 열 수 없습니다",
        "ファイル %s を開けません",
        "Remove the directory {name}",
        "Das Verzeichnis {name} entfernen",
        "Supprimer le répertoire {name}",
        "디렉터리 {name} 삭제",
        "%1$s: option requires an argument -- '%2$c'",
    ];
    let mut texts = Vec::new();
    for k in 0..20 {
        for b in base {
            texts.push(format!("{b} ({k})"));
        }
    }
    texts
}

fn config(vocab_size: usize) -> BpeConfig {
    BpeConfig {
        vocab_size,
        min_frequency: 2,
    }
}

fn train(texts: &[String], vocab_size: usize) -> Bpe {
    Bpe::train(texts.iter().map(String::as_str), &config(vocab_size)).unwrap()
}

#[test]
fn round_trip_is_lossless_including_unseen_characters() {
    let bpe = train(&training_texts(), 600);
    assert!(
        bpe.vocab_size() <= 600 && bpe.vocab_size() > MIN_VOCAB_SIZE,
        "{}",
        bpe.vocab_size()
    );
    let texts = [
        "Cannot open file %s",
        "Datei %s kann nicht geöffnet werden",
        "파일 %s을(를) 열 수 없습니다",
        "ファイル %s を開けません",
        // Never seen in training: other scripts, emoji, combining marks, rare punctuation.
        "Ошибка: не удалось открыть «файл»",
        "中文测试：无法打开文件。",
        "한국어 문장에 없는 음절: 뷁 똠 햏",
        "e\u{301}te\u{301} — naïve café 🚀 👍🏽",
        "tabs\tand  double  spaces, trailing space ",
        " leading space",
        "special strings <pad> <s> </s> <unk> stay text",
        "",
        "\u{feff}BOM and \u{200b}zero width",
    ];
    for text in texts {
        let ids = bpe.encode(text).unwrap();
        assert!(
            ids.iter().all(|&id| id > UNK),
            "{text:?} encoded to a special id: {ids:?}"
        );
        assert!(ids.iter().all(|&id| (id as usize) < bpe.vocab_size()));
        assert_eq!(bpe.decode(&ids).unwrap(), text);
    }
    // Merges happen: a frequent word is one token, an unseen Hangul syllable is its 3 bytes.
    assert_eq!(bpe.encode("Datei").unwrap().len(), 1);
    assert_eq!(bpe.encode("뷁").unwrap().len(), 3);
    // Batch encoding equals one-by-one encoding.
    let batch = bpe.encode_batch(&texts).unwrap();
    for (text, ids) in texts.iter().zip(&batch) {
        assert_eq!(&bpe.encode(text).unwrap(), ids);
    }
}

#[test]
fn special_ids_are_fixed_and_dropped_when_decoding() {
    let bpe = train(&training_texts(), 400);
    for (id, token) in [(PAD, "<pad>"), (BOS, "<s>"), (EOS, "</s>"), (UNK, "<unk>")] {
        assert_eq!(bpe.token_to_id(token), Some(id));
        assert_eq!(bpe.id_to_token(id).as_deref(), Some(token));
    }
    let ids = bpe.encode("Datei öffnen").unwrap();
    let mut framed = vec![BOS];
    framed.extend(&ids);
    framed.extend([EOS, PAD, PAD]);
    assert_eq!(bpe.decode(&framed).unwrap(), "Datei öffnen");
    assert_eq!(bpe.decode(&[]).unwrap(), "");
    let err = bpe.decode(&[5, bpe.vocab_size() as u32]).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "ids[1] = {} is outside the vocabulary (size {})",
            bpe.vocab_size(),
            bpe.vocab_size()
        )
    );
    // An invalid byte sequence (half a Hangul syllable) decodes to U+FFFD, not an error.
    let syllable = bpe.encode("뷁").unwrap();
    assert_eq!(bpe.decode(&syllable[..2]).unwrap(), "\u{fffd}");
}

#[test]
fn training_is_deterministic() {
    let texts = training_texts();
    let a = train(&texts, 500).to_json().unwrap();
    let mut reversed = texts.clone();
    reversed.reverse();
    let b = train(&reversed, 500).to_json().unwrap();
    assert_eq!(a, b, "input order changed the tokenizer");
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| train(&texts, 500).to_json().unwrap());
    assert_eq!(a, one_thread, "the thread count changed the tokenizer");
    // Same bytes on every machine with tokenizers 0.23 (Cargo.lock): a change here means the
    // vocabulary changed, and with it every subword id.
    let hex: String = Sha256::digest(a.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        hex,
        "6563ac96daa88093561eaa0ea62b30320ffb799bf3b2506e3647e596bedd902f"
    );
}

#[test]
fn save_and_load() {
    let bpe = train(&training_texts(), 450);
    let path = std::env::temp_dir().join(format!(
        "candle-bleu-research-bpe-{}.json",
        std::process::id()
    ));
    bpe.save(&path).unwrap();
    let loaded = Bpe::load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.to_json().unwrap(), bpe.to_json().unwrap());
    assert_eq!(loaded.vocab_size(), bpe.vocab_size());
    for text in training_texts().iter().take(10) {
        assert_eq!(loaded.encode(text).unwrap(), bpe.encode(text).unwrap());
    }
    // Special-token strings stay text after loading too.
    assert!(loaded.encode("</s>").unwrap().iter().all(|&id| id > UNK));

    // A tokenizer whose special tokens have other ids is refused.
    let swapped = bpe
        .to_json()
        .unwrap()
        .replacen("\"<pad>\":0", "\"<pad>\":9", 1);
    assert_ne!(swapped, bpe.to_json().unwrap());
    let err = Bpe::from_json(&swapped).unwrap_err();
    assert!(err.to_string().contains("\"<pad>\""), "{err}");
    let err = Bpe::load("/nonexistent/tokenizer.json").unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/tokenizer.json"),
        "{err}"
    );
}

#[test]
fn bad_configurations_are_errors() {
    let err = Bpe::train(["a b c"].into_iter(), &config(100)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "vocab_size 100 is below 260 (4 special tokens + 256 bytes)"
    );
    let err = Bpe::train(std::iter::empty(), &config(1000)).unwrap_err();
    assert_eq!(err.to_string(), "no texts to train the BPE model on");
    // The smallest vocabulary is the bytes: no merges, every byte a token, still lossless.
    let bytes_only = Bpe::train(["Datei öffnen"].into_iter(), &config(MIN_VOCAB_SIZE)).unwrap();
    assert_eq!(bytes_only.vocab_size(), MIN_VOCAB_SIZE);
    assert_eq!(bytes_only.encode("öffnen").unwrap().len(), "öffnen".len());
    assert_eq!(
        bytes_only
            .decode(&bytes_only.encode("öffnen").unwrap())
            .unwrap(),
        "öffnen"
    );
}

#[test]
fn whole_corpus_round_trip() {
    // A corpus built from catalogues the test writes: every pair of every split survives
    // encode → decode with a vocabulary trained on the training split only.
    let mut w = MoWriter::new().header("Content-Type: text/plain; charset=UTF-8\n");
    for (i, t) in training_texts().iter().enumerate() {
        w = w.message(&format!("message number {i} of the test"), t);
    }
    let corpus =
        corpus_from_files(&[("t.mo".into(), w.to_bytes())], &CorpusConfig::default()).unwrap();
    assert!(
        corpus.summary.pairs > 150 && !corpus.test.is_empty(),
        "{}",
        corpus.summary
    );
    let bpe = Bpe::train_on_pairs(&corpus.train, &config(700)).unwrap();
    let all: Vec<&Pair> = corpus
        .train
        .iter()
        .chain(&corpus.dev)
        .chain(&corpus.test)
        .collect();
    for p in all {
        for text in [&p.source, &p.target] {
            assert_eq!(&bpe.decode(&bpe.encode(text).unwrap()).unwrap(), text);
        }
    }
}
