//! The special tokens' ids, the same in every vocabulary of the library (BPE or token-level).

/// Padding id: never a real token, and the `pad_id` of the losses and `References::from_ids`.
pub const PAD: u32 = 0;
/// Start-of-sentence id, the decoder's first input.
pub const BOS: u32 = 1;
/// End-of-sentence id, the decoder's last target.
pub const EOS: u32 = 2;
/// Unknown-token id, for tokens missing from a vocabulary (byte-level BPE never needs it).
pub const UNK: u32 = 3;
/// The special tokens' strings, indexed by id.
pub const SPECIAL_TOKENS: [&str; 4] = ["<pad>", "<s>", "</s>", "<unk>"];
