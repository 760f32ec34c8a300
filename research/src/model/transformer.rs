//! A pre-norm Transformer encoder–decoder (Vaswani et al. 2017) in candle, for training with
//! the BLEU loss and decoding with greedy, beam or sampled search.
//!
//! - **Dropout** on the embeddings and on every residual branch, with masks drawn from the
//!   caller's seeded generator ([`Dropout`]): candle's CPU random generator cannot be seeded,
//!   and a study needs runs that repeat.
//! - **Tied embeddings** (Press & Wolf 2017) when [`TransformerConfig::tie_all`] is set: one
//!   `[V, D]` matrix embeds source and target tokens and is the output projection, so the
//!   decoder's hidden states `[B, T, D]` and [`Transformer::output_projection`] are what the
//!   hidden-state losses of `candle_bleu::loss` take.
//! - **Incremental decoding** with a key/value cache ([`DecoderCache`]): one decoder step per
//!   output token instead of re-running the whole prefix; the cache's rows can be reordered
//!   ([`DecoderCache::select`]) for beam search.
//!
//! Only ops with a backward pass are used: candle-nn's fused `softmax_last_dim` and
//! `layer_norm` have none (the gradient stops silently), so attention uses
//! `ops::softmax(x, D::Minus1)` and the layer norm is composed from elementary ops.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::{Linear, VarBuilder, VarMap};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{layer_norm, seeded_init, Dense};

/// Sizes of the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransformerConfig {
    /// Source vocabulary (the joint vocabulary when `tie_all`).
    pub src_vocab: usize,
    /// Target vocabulary (the joint vocabulary when `tie_all`).
    pub tgt_vocab: usize,
    /// Model width `D` (a multiple of `heads`).
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Width of the feed-forward block.
    pub d_ff: usize,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// Decoder layers.
    pub decoder_layers: usize,
    /// Longest source or target sequence, BOS and EOS included (learned positions).
    pub max_len: usize,
    /// Dropout probability on embeddings and residual branches, in `[0, 1)`.
    pub dropout: f32,
    /// One embedding matrix for source, target and the output projection (needs
    /// `src_vocab == tgt_vocab`); otherwise separate embeddings and an output layer with bias.
    pub tie_all: bool,
}

impl TransformerConfig {
    fn check(&self) -> Result<()> {
        if self.d_model == 0 || self.heads == 0 || !self.d_model.is_multiple_of(self.heads) {
            bail!(
                "d_model ({}) must be a positive multiple of heads ({})",
                self.d_model,
                self.heads
            );
        }
        if self.src_vocab == 0 || self.tgt_vocab == 0 || self.max_len == 0 || self.d_ff == 0 {
            bail!("vocabularies, max_len and d_ff must be >= 1: {self:?}");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("dropout must be in [0, 1), got {}", self.dropout);
        }
        if self.tie_all && self.src_vocab != self.tgt_vocab {
            bail!(
                "tie_all needs one vocabulary: src_vocab {} != tgt_vocab {}",
                self.src_vocab,
                self.tgt_vocab
            );
        }
        Ok(())
    }
}

/// Dropout masks from a seeded generator: `x · m / (1 − p)` with `m ~ Bernoulli(1 − p)`.
///
/// `None` where a forward pass takes `Option<&mut Dropout>` means evaluation (no dropout).
pub struct Dropout {
    p: f32,
    rng: StdRng,
}

impl Dropout {
    /// Dropout with probability `p`, masks drawn from `seed`.
    pub fn new(p: f32, seed: u64) -> Self {
        Self {
            p,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// `x` with each element zeroed with probability `p` and the rest scaled by `1/(1 − p)`.
    pub fn apply(&mut self, x: &Tensor) -> Result<Tensor> {
        if self.p == 0.0 {
            return Ok(x.clone());
        }
        let keep = 1.0 / (1.0 - self.p);
        // One 32-bit draw per element against a threshold: no float per element.
        let threshold = (f64::from(self.p) * 4_294_967_296.0) as u64;
        let n = x.elem_count();
        let mut mask = Vec::with_capacity(n);
        while mask.len() < n {
            let bits: u64 = self.rng.gen();
            for half in [bits & 0xffff_ffff, bits >> 32] {
                if mask.len() < n {
                    mask.push(if half < threshold { 0.0 } else { keep });
                }
            }
        }
        let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        Ok((x * mask)?)
    }
}

/// `x` through `dropout` when there is one (training), unchanged otherwise (evaluation).
pub(crate) fn drop(x: Tensor, dropout: &mut Option<&mut Dropout>) -> Result<Tensor> {
    match dropout {
        Some(d) => d.apply(&x),
        None => Ok(x),
    }
}

struct Attention {
    query: Dense,
    key: Dense,
    value: Dense,
    out: Dense,
    heads: usize,
}

impl Attention {
    fn new(d: usize, heads: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            query: Dense::new(d, d, vb.pp("q"))?,
            key: Dense::new(d, d, vb.pp("k"))?,
            value: Dense::new(d, d, vb.pp("v"))?,
            out: Dense::new(d, d, vb.pp("o"))?,
            heads,
        })
    }

    /// `[B, T, D]` → `[B, H, T, D/H]`.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        Ok(x.reshape((b, t, self.heads, d / self.heads))?
            .transpose(1, 2)?
            .contiguous()?)
    }

    fn keys_values(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            self.split_heads(&self.key.forward(x)?)?,
            self.split_heads(&self.value.forward(x)?)?,
        ))
    }

    /// Queries `[B, Tq, D]` attend to split keys and values `[B, H, Tk, D/H]`; `mask` is
    /// additive and broadcasts to `[B, H, Tq, Tk]`.
    fn attend(
        &self,
        queries: &Tensor,
        keys: &Tensor,
        values: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, tq, d) = queries.dims3()?;
        let q = self.split_heads(&self.query.forward(queries)?)?;
        let scale = 1.0 / ((d / self.heads) as f64).sqrt();
        let mut scores = (q.matmul(&keys.t()?.contiguous()?)? * scale)?;
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask)?;
        }
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let context = weights
            .matmul(values)?
            .transpose(1, 2)?
            .reshape((b, tq, d))?;
        self.out.forward(&context)
    }

    fn forward(&self, queries: &Tensor, keys: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (k, v) = self.keys_values(keys)?;
        self.attend(queries, &k, &v, mask)
    }
}

struct FeedForward {
    up: Dense,
    down: Dense,
}

impl FeedForward {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.down.forward(&self.up.forward(x)?.relu()?)
    }
}

struct EncoderLayer {
    attention: Attention,
    ff: FeedForward,
}

struct DecoderLayer {
    self_attention: Attention,
    cross_attention: Attention,
    ff: FeedForward,
}

/// The encoder's output for a batch of sources.
#[derive(Clone)]
pub struct Memory {
    /// `[B, Ts, D]`.
    pub states: Tensor,
    /// `[B, 1, 1, Ts]`: 0 at source tokens, -1e9 at padding.
    pub mask: Tensor,
}

/// What incremental decoding keeps between steps, for `N` rows (sources × beams or samples).
///
/// Decoding is not differentiated, so the cache holds *detached* tensors: the model's weights
/// are `Var`s, and a tensor computed from them keeps the graph of everything it came from
/// alive. Without the detach every step's activations (logits included) stayed reachable
/// from the growing keys and values until the batch ended — 11 GB for a beam-5 batch of 100
/// sources in the translate study.
#[derive(Clone)]
pub struct DecoderCache {
    /// `[N, 1, 1, Ts]`.
    memory_mask: Tensor,
    /// Per decoder layer: the cross-attention keys and values of the memory, `[N, H, Ts, D/H]`.
    cross: Vec<(Tensor, Tensor)>,
    /// Per decoder layer: the self-attention keys and values so far, `[N, H, t, D/H]`.
    past: Vec<Option<(Tensor, Tensor)>>,
    /// Tokens decoded so far (the next position).
    position: usize,
}

impl DecoderCache {
    /// Rows `N`.
    pub fn rows(&self) -> usize {
        self.memory_mask.dim(0).unwrap_or(0)
    }

    /// The cache of the rows `indices` (u32 `[M]`, each `< N`), in that order: beam search's
    /// reordering after each step.
    pub fn select(&self, indices: &Tensor) -> Result<Self> {
        let pick = |t: &Tensor| -> Result<Tensor> { Ok(t.index_select(indices, 0)?) };
        Ok(Self {
            memory_mask: pick(&self.memory_mask)?,
            cross: self
                .cross
                .iter()
                .map(|(k, v)| Ok((pick(k)?, pick(v)?)))
                .collect::<Result<_>>()?,
            past: self
                .past
                .iter()
                .map(|kv| match kv {
                    Some((k, v)) => Ok(Some((pick(k)?, pick(v)?))),
                    None => Ok(None),
                })
                .collect::<Result<_>>()?,
            position: self.position,
        })
    }
}

/// The encoder–decoder.
pub struct Transformer {
    pub(crate) src_embedding: Tensor,
    tgt_embedding: Tensor,
    positions: Tensor,
    encoder: Vec<EncoderLayer>,
    decoder: Vec<DecoderLayer>,
    output: Linear,
    config: TransformerConfig,
    device: Device,
}

impl Transformer {
    /// Builds the model in `varmap` and initialises every weight from `seed`: linear weights
    /// uniform in `±1/sqrt(fan_in)`, embeddings normal with sd `1/sqrt(D)`, biases 0.
    pub fn new(
        config: TransformerConfig,
        varmap: &VarMap,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        config.check()?;
        let vb = VarBuilder::from_varmap(varmap, DType::F32, device);
        let d = config.d_model;
        let init = candle_nn::Init::Const(0.0);
        let attention = |vb: VarBuilder| Attention::new(d, config.heads, vb);
        let ff = |vb: VarBuilder| -> Result<FeedForward> {
            Ok(FeedForward {
                up: Dense::new(d, config.d_ff, vb.pp("up"))?,
                down: Dense::new(config.d_ff, d, vb.pp("down"))?,
            })
        };
        let encoder = (0..config.encoder_layers)
            .map(|i| {
                let vb = vb.pp(format!("encoder.{i}"));
                Ok(EncoderLayer {
                    attention: attention(vb.pp("attention"))?,
                    ff: ff(vb.pp("ff"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let decoder = (0..config.decoder_layers)
            .map(|i| {
                let vb = vb.pp(format!("decoder.{i}"));
                Ok(DecoderLayer {
                    self_attention: attention(vb.pp("self_attention"))?,
                    cross_attention: attention(vb.pp("cross_attention"))?,
                    ff: ff(vb.pp("ff"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let positions = vb.get_with_hints((config.max_len, d), "positions", init)?;
        let (src_embedding, tgt_embedding, output) = if config.tie_all {
            let shared = vb.get_with_hints((config.tgt_vocab, d), "embedding", init)?;
            let output = Linear::new(shared.clone(), None);
            (shared.clone(), shared, output)
        } else {
            let src = vb.get_with_hints((config.src_vocab, d), "src_embedding", init)?;
            let tgt = vb.get_with_hints((config.tgt_vocab, d), "tgt_embedding", init)?;
            let weight = vb.get_with_hints((config.tgt_vocab, d), "output.weight", init)?;
            let bias = vb.get_with_hints(config.tgt_vocab, "output.bias", init)?;
            (src, tgt, Linear::new(weight, Some(bias)))
        };
        let model = Self {
            src_embedding,
            tgt_embedding,
            positions,
            encoder,
            decoder,
            output,
            config,
            device: device.clone(),
        };
        seeded_init(varmap, seed)?;
        Ok(model)
    }

    /// The model's sizes.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// The device its weights are on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The output layer: `hidden [.., D] → logits [.., V]`. With tied embeddings its weight is
    /// the embedding matrix and it has no bias. This is the `proj` of the BLEU loss's
    /// hidden-state entry points.
    pub fn output_projection(&self) -> &Linear {
        &self.output
    }

    /// `embedding[ids] · sqrt(D) + positions[offset..offset + T]`, `ids` u32 `[B, T]`.
    pub(crate) fn embed(&self, table: &Tensor, ids: &Tensor, offset: usize) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if offset + t > self.config.max_len {
            bail!(
                "a sequence of {} tokens exceeds the model's max_len {}",
                offset + t,
                self.config.max_len
            );
        }
        let d = self.config.d_model;
        let tokens = table
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, d))?;
        let positions = self.positions.narrow(0, offset, t)?.unsqueeze(0)?;
        let scale = (d as f64).sqrt();
        Ok((tokens * scale)?.broadcast_add(&positions)?)
    }

    /// Encodes u32 `[B, Ts]` source ids (right-padded with `pad`). `dropout`: `None` to
    /// evaluate.
    pub fn encode(
        &self,
        src: &Tensor,
        pad: u32,
        mut dropout: Option<&mut Dropout>,
    ) -> Result<Memory> {
        let (b, ts) = src.dims2()?;
        let mask = (src.eq(pad)?.to_dtype(DType::F32)? * -1e9)?.reshape((b, 1, 1, ts))?;
        let mut x = drop(self.embed(&self.src_embedding, src, 0)?, &mut dropout)?;
        for layer in &self.encoder {
            let h = layer_norm(&x)?;
            x = (&x + drop(layer.attention.forward(&h, &h, Some(&mask))?, &mut dropout)?)?;
            let h = layer_norm(&x)?;
            x = (&x + drop(layer.ff.forward(&h)?, &mut dropout)?)?;
        }
        Ok(Memory {
            states: layer_norm(&x)?,
            mask,
        })
    }

    /// Teacher-forced decoder states f32 `[B, T, D]` (after the final layer norm) for decoder
    /// inputs u32 `[B, T]`: the logits are `output_projection().forward(states)`.
    pub fn decode(
        &self,
        dec_in: &Tensor,
        memory: &Memory,
        mut dropout: Option<&mut Dropout>,
    ) -> Result<Tensor> {
        let (_, t) = dec_in.dims2()?;
        let causal: Vec<f32> = (0..t)
            .flat_map(|i| (0..t).map(move |j| if j > i { -1e9 } else { 0.0 }))
            .collect();
        let causal = Tensor::from_vec(causal, (1, 1, t, t), &self.device)?;
        let x = drop(self.embed(&self.tgt_embedding, dec_in, 0)?, &mut dropout)?;
        self.decoder_states(x, memory, &causal, &mut dropout)
    }

    /// The decoder layers and the final layer norm over input embeddings `x` f32 `[B, T, D]`:
    /// states f32 `[B, T, D]`. `self_mask` is additive and broadcasts to `[B, H, T, T]` (the
    /// causal mask here; the non-autoregressive decoder's key-padding mask in
    /// [`super::nat`]).
    pub(crate) fn decoder_states(
        &self,
        mut x: Tensor,
        memory: &Memory,
        self_mask: &Tensor,
        dropout: &mut Option<&mut Dropout>,
    ) -> Result<Tensor> {
        for layer in &self.decoder {
            let h = layer_norm(&x)?;
            let a = layer.self_attention.forward(&h, &h, Some(self_mask))?;
            x = (&x + drop(a, dropout)?)?;
            let h = layer_norm(&x)?;
            let a = layer
                .cross_attention
                .forward(&h, &memory.states, Some(&memory.mask))?;
            x = (&x + drop(a, dropout)?)?;
            let h = layer_norm(&x)?;
            x = (&x + drop(layer.ff.forward(&h)?, dropout)?)?;
        }
        layer_norm(&x)
    }

    /// Logits `[.., V]` of decoder states `[.., D]`.
    pub fn logits(&self, states: &Tensor) -> Result<Tensor> {
        let d = self.config.d_model;
        let dims = states.dims().to_vec();
        let rows = states.elem_count() / d;
        let flat = states.reshape((rows, d))?;
        let logits = candle_core::Module::forward(&self.output, &flat)?;
        let mut out_dims = dims;
        *out_dims.last_mut().expect("rank >= 1") = self.config.tgt_vocab;
        Ok(logits.reshape(out_dims)?)
    }

    /// A decoder cache for incremental decoding of `memory`'s sources, each repeated
    /// `copies` times (rows `b·copies + c`): beams or samples of one source are adjacent.
    pub fn start(&self, memory: &Memory, copies: usize) -> Result<DecoderCache> {
        let (b, ts, d) = memory.states.dims3()?;
        let repeat = |t: &Tensor| -> Result<Tensor> {
            let index: Vec<u32> = (0..b as u32)
                .flat_map(|i| std::iter::repeat_n(i, copies))
                .collect();
            Ok(t.index_select(&Tensor::from_vec(index, b * copies, &self.device)?, 0)?)
        };
        let states = repeat(&memory.states)?;
        let cross = self
            .decoder
            .iter()
            .map(|layer| {
                let (k, v) = layer.cross_attention.keys_values(&states)?;
                Ok((k.detach(), v.detach()))
            })
            .collect::<Result<Vec<_>>>()?;
        debug_assert_eq!(states.dims(), &[b * copies, ts, d]);
        Ok(DecoderCache {
            memory_mask: repeat(&memory.mask)?.detach(),
            cross,
            past: vec![None; self.decoder.len()],
            position: 0,
        })
    }

    /// One decoder step for every row of `cache`: `tokens` u32 `[N]` are the inputs at the
    /// cache's position (BOS first). Returns the decoder states `[N, D]`; the cache grows by
    /// one position.
    pub fn step(&self, tokens: &Tensor, cache: &mut DecoderCache) -> Result<Tensor> {
        let n = tokens.dim(0)?;
        let mut x = self.embed(
            &self.tgt_embedding,
            &tokens.reshape((n, 1))?,
            cache.position,
        )?;
        for (i, layer) in self.decoder.iter().enumerate() {
            let h = layer_norm(&x)?;
            let (k, v) = layer.self_attention.keys_values(&h)?;
            let (k, v) = match cache.past[i].take() {
                Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
                None => (k, v),
            };
            let a = layer.self_attention.attend(&h, &k, &v, None)?;
            // Detached: see `DecoderCache`.
            cache.past[i] = Some((k.detach(), v.detach()));
            x = (&x + a)?;
            let h = layer_norm(&x)?;
            let (ck, cv) = &cache.cross[i];
            let a = layer
                .cross_attention
                .attend(&h, ck, cv, Some(&cache.memory_mask))?;
            x = (&x + a)?;
            let h = layer_norm(&x)?;
            x = (&x + layer.ff.forward(&h)?)?;
        }
        cache.position += 1;
        layer_norm(&x.squeeze(1)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weights are `Var`s, so a step's own output is part of a graph; what the cache
    /// keeps between steps must not be, or every step's activations stay alive.
    #[test]
    fn the_decoder_cache_keeps_no_autograd_graph() -> Result<()> {
        let config = TransformerConfig {
            src_vocab: 20,
            tgt_vocab: 20,
            d_model: 8,
            heads: 2,
            d_ff: 16,
            encoder_layers: 1,
            decoder_layers: 2,
            max_len: 8,
            dropout: 0.0,
            tie_all: true,
        };
        let device = Device::Cpu;
        let model = Transformer::new(config, &VarMap::new(), 3, &device)?;
        let src = Tensor::new(&[[4u32, 5, 6, 2], [7, 8, 2, 0]], &device)?;
        let memory = model.encode(&src, 0, None)?;
        let mut cache = model.start(&memory, 2)?;
        let mut states = None;
        for token in [1u32, 9] {
            states = Some(model.step(&Tensor::new(&[token; 4], &device)?, &mut cache)?);
        }
        assert!(states.expect("two steps ran").track_op());
        let cache = cache.select(&Tensor::new(&[1u32, 0, 3, 2], &device)?)?;
        let mut kept = vec![&cache.memory_mask];
        for (k, v) in &cache.cross {
            kept.extend([k, v]);
        }
        for (k, v) in cache.past.iter().flatten() {
            kept.extend([k, v]);
        }
        assert_eq!(kept.len(), 1 + 2 * 2 + 2 * 2);
        for tensor in kept {
            assert!(
                !tensor.track_op(),
                "a cached tensor {:?} holds a graph",
                tensor.dims()
            );
        }
        Ok(())
    }
}
