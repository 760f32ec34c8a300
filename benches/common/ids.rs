//! The random reference and target ids the hidden-state benches draw (`benches/hidden.rs`,
//! `benches/cuda.rs`), shared so that both time the same batches.

use rand::{rngs::StdRng, Rng};

/// Ids for `b` elements of `s` positions over a vocabulary of `v` (0 is padding): each element
/// gets a length in `[s/2, s]`, that many target ids in `[1, v)` (padded to `[b, s]`) and
/// `min(length, t)` reference ids (padded to `[b, t]`). Returns `(ref_ids, target_ids,
/// lengths)`, drawn from `rng` in that order per element.
pub fn random_ids(rng: &mut StdRng, [b, s, t, v]: [usize; 4]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut ref_ids = vec![0u32; b * t];
    let mut target_ids = vec![0u32; b * s];
    let mut lengths = Vec::with_capacity(b);
    for e in 0..b {
        let length = rng.gen_range(s / 2..=s).max(1);
        lengths.push(length as u32);
        for i in 0..length.min(t) {
            ref_ids[e * t + i] = rng.gen_range(1..v as u32);
        }
        for i in 0..length {
            target_ids[e * s + i] = rng.gen_range(1..v as u32);
        }
    }
    (ref_ids, target_ids, lengths)
}
