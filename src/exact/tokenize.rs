//! sacrebleu's tokenizers. SKELETON: being written.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    None,
    V13a,
    Intl,
    Char,
    Zh,
}

pub fn tokenize(text: &str, tok: Tokenizer, lowercase: bool) -> Vec<String> {
    let _ = (text, tok, lowercase);
    todo!("exact::tokenize")
}
