//! The research examples' pre-norm Transformer encoder–decoder (Vaswani et al. 2017) in candle,
//! for training with the BLEU loss and decoding with greedy, beam or sampled search. One model
//! serves every study: translate and NAT with tied embeddings ([`TransformerConfig::tie_all`]),
//! seq2seq and study with separate ones ([`TransformerConfig::positions`] and
//! [`Transformer::greedy`] keep their committed results reproducible).
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
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{Linear, VarBuilder, VarMap};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::data::{BOS, EOS, PAD};

/// How [`Transformer`] adds the learned positions to the token embeddings. Both add the same
/// values; they differ only in the order in which the backward pass sums the positions'
/// gradient (over the batch, and over encoder and decoder, which share the table), and the two
/// orders round differently. Each study keeps the one it was trained with, so its committed
/// results and checkpoints reproduce bit for bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionAdd {
    /// The table's rows `offset..offset + T` broadcast over the batch: the gradient is summed
    /// over the batch, then added up per pass (translate, NAT).
    Broadcast,
    /// Looked up by position id for every token: each pass index-adds its tokens' gradients
    /// into one running sum, not a strided reduction over the batch (seq2seq, study).
    Lookup,
}

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
    /// How the positions join the token embeddings.
    pub positions: PositionAdd,
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

/// A linear layer on `[.., D_in]`, computed as one `[rows, D_in]` matmul.
///
/// Written out rather than `candle_nn::Linear` for speed on CPU: `Linear` broadcasts its
/// weight to `[B, D_in, D_out]` for non-contiguous 3-D inputs, and the backward of a broadcast
/// over leading dimensions is a strided reduction (two integer divisions per element) that cost
/// more than all the matmuls of this model. The bias, when there is one, is added as
/// `ones[rows, 1] · bias[1, D_out]`, so its gradient is a matmul too.
pub(crate) struct Dense {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Dense {
    pub(crate) fn new(d_in: usize, d_out: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get_with_hints(
                (d_out, d_in),
                "weight",
                candle_nn::init::DEFAULT_KAIMING_NORMAL,
            )?,
            bias: Some(vb.get_with_hints((1, d_out), "bias", candle_nn::Init::Const(0.0))?),
        })
    }

    /// `x` `[.., D_in]` → `[.., D_out]`, as one 2-D matmul over the flattened rows.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let d_in = *dims.last().expect("rank >= 1");
        let rows = x.elem_count() / d_in;
        let flat = x.reshape((rows, d_in))?;
        let mut y = flat.matmul(&self.weight.t()?)?;
        if let Some(bias) = &self.bias {
            let ones = Tensor::ones((rows, 1), x.dtype(), x.device())?;
            y = (y + ones.matmul(bias)?)?;
        }
        let mut out_dims = dims;
        *out_dims.last_mut().expect("rank >= 1") = y.dim(1)?;
        Ok(y.reshape(out_dims)?)
    }
}

/// Layer normalisation without its own scale and shift, from elementary ops.
///
/// candle-nn's `LayerNorm` takes the fused `ops::layer_norm` kernel for contiguous inputs,
/// which has no backward (the gradient stops silently). The scale and shift are left out
/// because every normalised tensor here feeds a `Dense` layer, which absorbs them (and their
/// broadcast gradients would be the slow strided reductions `Dense` avoids).
pub(crate) fn layer_norm(x: &Tensor) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let variance = centered.sqr()?.mean_keepdim(D::Minus1)?;
    Ok(centered.broadcast_div(&(variance + 1e-5)?.sqrt()?)?)
}

/// Overwrites every variable of `varmap` with values drawn from `seed`, in name order: linear
/// weights uniform in `±1/sqrt(fan_in)`, embeddings and positions normal with sd `1/sqrt(D)`,
/// biases 0. candle's CPU random generator cannot be seeded, so the values are drawn here.
fn seeded_init(varmap: &VarMap, seed: u64) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = varmap
        .data()
        .lock()
        .expect("the VarMap lock is never poisoned");
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for name in names {
        let var: &Var = &data[name];
        let dims = var.dims().to_vec();
        let n: usize = dims.iter().product();
        let values: Vec<f32> = if name.ends_with("bias") {
            vec![0.0; n]
        } else if name.contains("embedding") || name.starts_with("positions") {
            let sd = 1.0 / (dims[1] as f64).sqrt();
            (0..n).map(|_| (normal(&mut rng) * sd) as f32).collect()
        } else {
            let bound = 1.0 / (dims[1] as f64).sqrt();
            (0..n)
                .map(|_| rng.gen_range(-bound..bound) as f32)
                .collect()
        };
        var.set(&Tensor::from_vec(values, dims, var.device())?)?;
    }
    Ok(())
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
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
    output: Dense,
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
            let output = Dense {
                weight: shared.clone(),
                bias: None,
            };
            (shared.clone(), shared, output)
        } else {
            let src = vb.get_with_hints((config.src_vocab, d), "src_embedding", init)?;
            let tgt = vb.get_with_hints((config.tgt_vocab, d), "tgt_embedding", init)?;
            let output = Dense::new(d, config.tgt_vocab, vb.pp("output"))?;
            (src, tgt, output)
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
    /// hidden-state entry points (it shares the model's variables, so gradients reach them).
    pub fn output_projection(&self) -> Result<Linear> {
        let bias = match &self.output.bias {
            Some(bias) => Some(bias.squeeze(0)?),
            None => None,
        };
        Ok(Linear::new(self.output.weight.clone(), bias))
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
        let scale = (d as f64).sqrt();
        Ok(match self.config.positions {
            PositionAdd::Broadcast => {
                let positions = self.positions.narrow(0, offset, t)?.unsqueeze(0)?;
                (tokens * scale)?.broadcast_add(&positions)?
            }
            PositionAdd::Lookup => {
                let ids = Tensor::arange(offset as u32, (offset + t) as u32, &self.device)?
                    .unsqueeze(0)?
                    .broadcast_as((b, t))?
                    .contiguous()?;
                let positions = self
                    .positions
                    .index_select(&ids.flatten_all()?, 0)?
                    .reshape((b, t, d))?;
                ((tokens * scale)? + positions)?
            }
        })
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
        self.output.forward(states)
    }

    /// Greedy decoding of u32 `[B, Ts]` sources (padded with `PAD`): at most `max_len` tokens
    /// each, stopping at EOS. Returns each hypothesis's ids without BOS and EOS.
    ///
    /// Each step reruns the decoder over the whole prefix (no key/value cache): the seq2seq
    /// example's dev and test decode, kept because its committed results were decoded so (the
    /// cache's one-row matmuls can round differently). Cheap for word-level sentences of ~20
    /// tokens, but its cost grows with the cube of the output length; [`crate::decode::greedy`]
    /// decodes with the cache.
    pub fn greedy(&self, src: &Tensor, max_len: usize) -> Result<Vec<Vec<u32>>> {
        let (b, _) = src.dims2()?;
        let memory = self.encode(src, PAD, None)?;
        // BOS takes the first position.
        let max_len = max_len.min(self.config.max_len - 1);
        let mut prefix = vec![vec![BOS]; b];
        let mut done = vec![false; b];
        for _ in 0..max_len {
            let t = prefix[0].len();
            let flat: Vec<u32> = prefix.iter().flatten().copied().collect();
            let dec_in = Tensor::from_vec(flat, (b, t), &self.device)?;
            let logits = self.logits(&self.decode(&dec_in, &memory, None)?)?;
            let next = logits.narrow(1, t - 1, 1)?.squeeze(1)?.argmax(D::Minus1)?;
            let next = next.to_vec1::<u32>()?;
            for (i, &token) in next.iter().enumerate() {
                prefix[i].push(if done[i] { PAD } else { token });
                if token == EOS {
                    done[i] = true;
                }
            }
            if done.iter().all(|&d| d) {
                break;
            }
        }
        Ok(prefix
            .into_iter()
            .map(|p| {
                p.into_iter()
                    .skip(1)
                    .take_while(|&id| id != EOS && id != PAD)
                    .collect()
            })
            .collect())
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
            positions: PositionAdd::Broadcast,
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
