//! NumPy's random numbers, bit for bit: the `PCG64` generator as `np.random.default_rng(seed)`
//! seeds it (through `SeedSequence`), `Generator.choice` and `Generator.integers(2,
//! dtype=bool)`. sacrebleu draws its bootstrap resamples and randomization trials with them,
//! and [`super::bootstrap`] reproduces those draws.

/// NumPy's `PCG64` bit generator as `np.random.default_rng(seed)` creates it (seeded through
/// `SeedSequence`), with `next_uint32`'s half-word buffering. Bit-exact with NumPy >= 1.17.
#[derive(Debug, Clone)]
pub(crate) struct NumpyPcg64 {
    state: u128,
    inc: u128,
    has_u32: bool,
    u32_buf: u32,
}

const PCG_MULT: u128 = (2549297995355413924u128 << 64) | 4865540595714422341u128;

// SeedSequence constants (numpy/random/bit_generator.pyx).
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL_SIZE: usize = 4;

/// `SeedSequence(entropy).generate_state(n_words, np.uint32)` for the entropy given as 32-bit
/// words, least significant first (`_coerce_to_uint32_array`), no spawn key.
fn seed_sequence_state(entropy: &[u32], n_words: usize) -> Vec<u32> {
    let mut hash_const = INIT_A;
    let mut hashmix = |value: u32| {
        let mut v = value ^ hash_const;
        hash_const = hash_const.wrapping_mul(MULT_A);
        v = v.wrapping_mul(hash_const);
        v ^ (v >> XSHIFT)
    };
    let mix = |x: u32, y: u32| {
        let r = MIX_MULT_L
            .wrapping_mul(x)
            .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
        r ^ (r >> XSHIFT)
    };
    let mut pool = [0u32; POOL_SIZE];
    for (i, slot) in pool.iter_mut().enumerate() {
        *slot = hashmix(entropy.get(i).copied().unwrap_or(0));
    }
    for src in 0..POOL_SIZE {
        for dst in 0..POOL_SIZE {
            if src != dst {
                let h = hashmix(pool[src]);
                pool[dst] = mix(pool[dst], h);
            }
        }
    }
    for &word in entropy.iter().skip(POOL_SIZE) {
        for slot in pool.iter_mut() {
            let h = hashmix(word);
            *slot = mix(*slot, h);
        }
    }
    let mut hash_const = INIT_B;
    (0..n_words)
        .map(|i| {
            let mut v = pool[i % POOL_SIZE] ^ hash_const;
            hash_const = hash_const.wrapping_mul(MULT_B);
            v = v.wrapping_mul(hash_const);
            v ^ (v >> XSHIFT)
        })
        .collect()
}

impl NumpyPcg64 {
    /// `np.random.default_rng(seed)`.
    pub(crate) fn new(seed: u64) -> Self {
        let words: Vec<u32> = if seed >> 32 == 0 {
            vec![seed as u32]
        } else {
            vec![seed as u32, (seed >> 32) as u32]
        };
        Self::from_entropy(&words)
    }

    /// `np.random.default_rng(SeedSequence(entropy))` with the entropy as 32-bit words, least
    /// significant first (Python's `int` → `uint32` array conversion).
    fn from_entropy(entropy: &[u32]) -> Self {
        let words = seed_sequence_state(entropy, 8);
        let u64_at = |k: usize| words[2 * k] as u64 | (words[2 * k + 1] as u64) << 32;
        // pcg64_set_seed: the first uint64 is the high half.
        let init = (u64_at(0) as u128) << 64 | u64_at(1) as u128;
        let initseq = (u64_at(2) as u128) << 64 | u64_at(3) as u128;
        let mut rng = Self {
            state: 0,
            inc: (initseq << 1) | 1,
            has_u32: false,
            u32_buf: 0,
        };
        rng.step();
        rng.state = rng.state.wrapping_add(init);
        rng.step();
        rng
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    /// Next 64 random bits (PCG XSL-RR 128/64).
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.step();
        let hi = (self.state >> 64) as u64;
        let lo = self.state as u64;
        (hi ^ lo).rotate_right((hi >> 58) as u32)
    }

    /// NumPy's `next_uint32`: the low half of a 64-bit draw, then its high half.
    pub(crate) fn next_u32(&mut self) -> u32 {
        if self.has_u32 {
            self.has_u32 = false;
            return self.u32_buf;
        }
        let next = self.next_u64();
        self.has_u32 = true;
        self.u32_buf = (next >> 32) as u32;
        next as u32
    }

    /// One draw of `Generator.integers(0, n)` for `1 <= n <= 2^32` (NumPy's Lemire rejection
    /// on 32-bit words; `n == 1` draws nothing).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        debug_assert!((1..=1u64 << 32).contains(&n));
        let rng = (n - 1) as u32;
        if rng == 0 {
            return 0;
        }
        if rng == u32::MAX {
            return self.next_u32() as u64;
        }
        let rng_excl = rng + 1;
        let mut m = self.next_u32() as u64 * rng_excl as u64;
        let mut leftover = m as u32;
        if leftover < rng_excl {
            let threshold = (u32::MAX - rng) % rng_excl;
            while leftover < threshold {
                m = self.next_u32() as u64 * rng_excl as u64;
                leftover = m as u32;
            }
        }
        m >> 32
    }

    /// Fills `out` as one row of `Generator.choice(n, size=(B, out.len()), replace=True)`.
    pub(crate) fn choice_into(&mut self, n: u64, out: &mut [u32]) {
        for x in out {
            *x = self.below(n) as u32;
        }
    }
}

/// `Generator.integers(2, size=..., dtype=bool)`: one bit per draw from buffered 32-bit words.
#[derive(Debug, Clone, Default)]
pub(crate) struct NumpyBools {
    bcnt: u32,
    buf: u32,
}

impl NumpyBools {
    /// The next boolean from `rng`.
    pub(crate) fn next(&mut self, rng: &mut NumpyPcg64) -> bool {
        if self.bcnt == 0 {
            self.buf = rng.next_u32();
            self.bcnt = 31;
        } else {
            self.buf >>= 1;
            self.bcnt -= 1;
        }
        self.buf & 1 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcg64_matches_numpy_default_rng_12345() {
        // np.random.default_rng(12345).bit_generator.state
        let rng = NumpyPcg64::new(12345);
        assert_eq!(rng.state, 33261208707367790463622745601869196757);
        assert_eq!(rng.inc, 268209174141567072605526753992732310247);
        // np.random.default_rng(12345).integers(2**64, dtype=np.uint64, size=2)
        let mut rng = NumpyPcg64::new(12345);
        let first = rng.next_u64();
        assert_eq!(first, 4193609425186963869);
        assert_eq!(rng.next_u64(), 5843160025838961886);
        let mut again = NumpyPcg64::new(12345);
        assert_eq!(
            again.next_u32() as u64 | (again.next_u32() as u64) << 32,
            first
        );
    }

    #[test]
    fn choice_matches_numpy() {
        // np.random.default_rng(12345).choice(10, size=(2, 10))
        let mut rng = NumpyPcg64::new(12345);
        let mut row = [0u32; 10];
        rng.choice_into(10, &mut row);
        assert_eq!(row, [6, 2, 7, 3, 2, 7, 6, 6, 9, 3]);
        rng.choice_into(10, &mut row);
        assert_eq!(row, [8, 3, 5, 5, 2, 1, 2, 6, 6, 9]);
        // n == 1 draws nothing.
        let mut rng = NumpyPcg64::new(12345);
        assert_eq!(rng.below(1), 0);
        assert_eq!(rng.below(10), 6);
    }

    #[test]
    fn bools_match_numpy() {
        // np.random.default_rng(12345).integers(2, size=12, dtype=bool).astype(int)
        let mut rng = NumpyPcg64::new(12345);
        let mut bools = NumpyBools::default();
        let got: Vec<u8> = (0..12).map(|_| bools.next(&mut rng) as u8).collect();
        assert_eq!(got, [1, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0]);
    }
}
