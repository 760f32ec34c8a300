//! Fuzzes `candle_bleu::exact::tokenize` on arbitrary UTF-8: no panic, every token non-empty and
//! free of Python whitespace, `TokenizeBuffer` and `tokenize` agree, the one-scan 13a/zh
//! tokenizers agree with the literal whole-line regex passes, and tokens are pieces of the input
//! (in order, for the tokenizers that never rewrite characters).
#![no_main]

use candle_bleu::exact::tokenize::{
    is_python_whitespace, tokenize, tokenize_reference, TokenizeBuffer, Tokenizer,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut buf = TokenizeBuffer::default();
    for tok in Tokenizer::ALL {
        for lowercase in [false, true] {
            let tokens = tokenize(text, tok, lowercase);
            for t in &tokens {
                assert!(!t.is_empty(), "{tok}: empty token in {text:?}");
                assert!(
                    !t.chars().any(is_python_whitespace),
                    "{tok}: whitespace in token {t:?} of {text:?}"
                );
            }
            let reused: Vec<&str> = buf.tokenize(text, tok, lowercase).collect();
            assert_eq!(reused, tokens, "{tok}: buffer differs on {text:?}");
            let literal = tokenize_reference(text, tok, lowercase);
            assert_eq!(literal, tokens, "{tok}: literal passes differ on {text:?}");

            // Every tokenizer keeps the characters (13a only drops `<skipped>`, `-\n` and
            // entities, so check it on text without `<`, `\n`, `&`): the concatenated tokens are
            // the (lowercased) text with its whitespace removed, i.e. the `none` tokens
            // concatenated (checked against a whitespace split below).
            let keeps_chars = tok != Tokenizer::V13a
                || !(text.contains('<') || text.contains('\n') || text.contains('&'));
            if keeps_chars {
                let expected: String = tokenize(text, Tokenizer::None, lowercase).concat();
                assert_eq!(tokens.concat(), expected, "{tok}: characters changed in {text:?}");
            }
            if tok == Tokenizer::None && !lowercase {
                let split: Vec<&str> = text.split(is_python_whitespace).filter(|s| !s.is_empty()).collect();
                assert_eq!(tokens, split, "none differs from a whitespace split on {text:?}");
            }
        }
    }
});
