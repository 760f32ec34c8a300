//! A small pre-norm Transformer encoder–decoder built from candle-nn parts (the `seq2seq` and
//! `study` examples' model), its greedy decoding, and in [`soft_decode`] an incremental view of
//! it that decodes softly and differentiably.
//!
//! Training passes may apply seeded dropout ([`Seq2Seq::encode_with`], [`Seq2Seq::decode_with`]
//! with a [`transformer::Dropout`]) on the embeddings and on every residual branch, as the
//! Transformer of [`transformer`] does; evaluation ([`Seq2Seq::encode`], [`Seq2Seq::decode`],
//! greedy decoding and the soft decoder) never drops.
//!
//! Only ops with a backward pass are used: candle-nn's fused `softmax_last_dim` and
//! `ops::layer_norm` (which `candle_nn::LayerNorm` takes for contiguous inputs) have none, and
//! would silently stop the gradient, so attention uses `ops::softmax(x, D::Minus1)` and the
//! layer norm below is composed from elementary ops.

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{Embedding, Module, VarBuilder, VarMap};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::data::tokens::Vocab;
use crate::data::{source_tensor, Encoded, BOS, EOS, PAD};
use transformer::{drop, Dropout};

pub mod nat;
pub mod soft_decode;
pub mod transformer;

/// Sizes of the model.
#[derive(Debug, Clone, Copy)]
pub struct ModelConfig {
    /// Source vocabulary size.
    pub src_vocab: usize,
    /// Target vocabulary size.
    pub tgt_vocab: usize,
    /// Model width `D`.
    pub d_model: usize,
    /// Attention heads (`d_model` must be a multiple).
    pub heads: usize,
    /// Width of the feed-forward block.
    pub d_ff: usize,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// Decoder layers.
    pub decoder_layers: usize,
    /// Longest source or target sequence (learned positions).
    pub max_len: usize,
}

/// A linear layer on `[B, T, D_in]`, computed as one `[B*T, D_in]` matmul.
///
/// Written out rather than `candle_nn::Linear` for speed on CPU: `Linear` broadcasts its
/// weight to `[B, D_in, D_out]` for 3-D inputs, and the backward of a broadcast over leading
/// dimensions is a strided reduction (two integer divisions per element) that cost more than
/// all the matmuls of this model. Here the bias is added as `ones[B*T, 1] · bias[1, D_out]`,
/// so its gradient is a matmul too.
struct Dense {
    weight: Tensor,
    bias: Tensor,
}

impl Dense {
    fn new(d_in: usize, d_out: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get_with_hints(
                (d_out, d_in),
                "weight",
                candle_nn::init::DEFAULT_KAIMING_NORMAL,
            )?,
            bias: vb.get_with_hints((1, d_out), "bias", candle_nn::Init::Const(0.0))?,
        })
    }

    /// `x` `[.., D_in]` → `[.., D_out]`, as one 2-D matmul over the flattened rows.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let d_in = *dims.last().expect("rank >= 1");
        let rows = x.elem_count() / d_in;
        let flat = x.reshape((rows, d_in))?;
        let ones = Tensor::ones((rows, 1), x.dtype(), x.device())?;
        let y = (flat.matmul(&self.weight.t()?)? + ones.matmul(&self.bias)?)?;
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
fn layer_norm(x: &Tensor) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let variance = centered.sqr()?.mean_keepdim(D::Minus1)?;
    Ok(centered.broadcast_div(&(variance + 1e-5)?.sqrt()?)?)
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

    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        Ok(x.reshape((b, t, self.heads, d / self.heads))?
            .transpose(1, 2)?
            .contiguous()?)
    }

    /// `queries` `[B, Tq, D]` attend to `keys` `[B, Tk, D]`; `mask` is additive and
    /// broadcasts to `[B, H, Tq, Tk]`.
    fn forward(&self, queries: &Tensor, keys: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, tq, d) = queries.dims3()?;
        let q = self.split_heads(&self.query.forward(queries)?)?;
        let k = self.split_heads(&self.key.forward(keys)?)?;
        let v = self.split_heads(&self.value.forward(keys)?)?;
        let scale = 1.0 / ((d / self.heads) as f64).sqrt();
        let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(mask)?;
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let context = weights.matmul(&v)?.transpose(1, 2)?.reshape((b, tq, d))?;
        self.out.forward(&context)
    }
}

struct FeedForward {
    up: Dense,
    down: Dense,
}

impl FeedForward {
    fn new(d: usize, d_ff: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            up: Dense::new(d, d_ff, vb.pp("up"))?,
            down: Dense::new(d_ff, d, vb.pp("down"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.down.forward(&self.up.forward(x)?.relu()?)
    }
}

struct EncoderLayer {
    attention: Attention,
    ff: FeedForward,
}

impl EncoderLayer {
    fn forward(
        &self,
        x: &Tensor,
        mask: &Tensor,
        dropout: &mut Option<&mut Dropout>,
    ) -> Result<Tensor> {
        let h = layer_norm(x)?;
        let x = (x + drop(self.attention.forward(&h, &h, mask)?, dropout)?)?;
        let h = layer_norm(&x)?;
        Ok((&x + drop(self.ff.forward(&h)?, dropout)?)?)
    }
}

struct DecoderLayer {
    self_attention: Attention,
    cross_attention: Attention,
    ff: FeedForward,
}

impl DecoderLayer {
    fn forward(
        &self,
        x: &Tensor,
        memory: &Tensor,
        self_mask: &Tensor,
        memory_mask: &Tensor,
        dropout: &mut Option<&mut Dropout>,
    ) -> Result<Tensor> {
        let h = layer_norm(x)?;
        let x = (x + drop(self.self_attention.forward(&h, &h, self_mask)?, dropout)?)?;
        let h = layer_norm(&x)?;
        let x = (&x
            + drop(
                self.cross_attention.forward(&h, memory, memory_mask)?,
                dropout,
            )?)?;
        let h = layer_norm(&x)?;
        Ok((&x + drop(self.ff.forward(&h)?, dropout)?)?)
    }
}

/// The encoder's output for a batch of sources.
pub struct Memory {
    /// f32 `[B, Ts, D]`.
    states: Tensor,
    /// f32 `[B, 1, 1, Ts]`: 0 at real source tokens, -1e9 at padding.
    mask: Tensor,
}

/// The encoder–decoder.
pub struct Seq2Seq {
    src_embedding: Embedding,
    tgt_embedding: Embedding,
    positions: Embedding,
    encoder: Vec<EncoderLayer>,
    decoder: Vec<DecoderLayer>,
    output: Dense,
    config: ModelConfig,
    device: Device,
}

impl Seq2Seq {
    /// Builds the model in `varmap` and initialises every weight from `seed` (candle's CPU
    /// random generator cannot be seeded, so the initial values are drawn here).
    pub fn new(config: ModelConfig, varmap: &VarMap, seed: u64, device: &Device) -> Result<Self> {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, device);
        let d = config.d_model;
        let encoder = (0..config.encoder_layers)
            .map(|i| {
                let vb = vb.pp(format!("encoder.{i}"));
                Ok(EncoderLayer {
                    attention: Attention::new(d, config.heads, vb.pp("attention"))?,
                    ff: FeedForward::new(d, config.d_ff, vb.pp("ff"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let decoder = (0..config.decoder_layers)
            .map(|i| {
                let vb = vb.pp(format!("decoder.{i}"));
                Ok(DecoderLayer {
                    self_attention: Attention::new(d, config.heads, vb.pp("self_attention"))?,
                    cross_attention: Attention::new(d, config.heads, vb.pp("cross_attention"))?,
                    ff: FeedForward::new(d, config.d_ff, vb.pp("ff"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let model = Self {
            src_embedding: candle_nn::embedding(config.src_vocab, d, vb.pp("src_embedding"))?,
            tgt_embedding: candle_nn::embedding(config.tgt_vocab, d, vb.pp("tgt_embedding"))?,
            positions: candle_nn::embedding(config.max_len + 1, d, vb.pp("positions"))?,
            encoder,
            decoder,
            output: Dense::new(d, config.tgt_vocab, vb.pp("output"))?,
            config,
            device: device.clone(),
        };
        seeded_init(varmap, seed)?;
        Ok(model)
    }

    fn embed(&self, embedding: &Embedding, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if t > self.config.max_len + 1 {
            anyhow::bail!(
                "sequence of {t} tokens exceeds the model's max_len {}",
                self.config.max_len
            );
        }
        // Position ids `[B, T]` rather than a broadcast `[T, D]` add: the embedding's backward
        // is then an index-add, not a strided reduction over the batch.
        let positions = Tensor::arange(0u32, t as u32, &self.device)?
            .unsqueeze(0)?
            .broadcast_as((b, t))?
            .contiguous()?;
        let scale = (self.config.d_model as f64).sqrt();
        Ok(((embedding.forward(ids)? * scale)? + self.positions.forward(&positions)?)?)
    }

    /// Encodes u32 `[B, Ts]` source ids (right-padded with `PAD`), without dropout.
    pub fn encode(&self, src: &Tensor) -> Result<Memory> {
        self.encode_with(src, None)
    }

    /// [`Self::encode`] with `dropout` (training) on the embeddings and every residual branch,
    /// or none (`None`: evaluation).
    pub fn encode_with(&self, src: &Tensor, mut dropout: Option<&mut Dropout>) -> Result<Memory> {
        let (b, ts) = src.dims2()?;
        let mask = (src.eq(PAD)?.to_dtype(DType::F32)? * -1e9)?.reshape((b, 1, 1, ts))?;
        let mut x = drop(self.embed(&self.src_embedding, src)?, &mut dropout)?;
        for layer in &self.encoder {
            x = layer.forward(&x, &mask, &mut dropout)?;
        }
        Ok(Memory {
            states: layer_norm(&x)?,
            mask,
        })
    }

    /// Teacher-forced decoder logits f32 `[B, T, V]` for decoder inputs u32 `[B, T]`, without
    /// dropout.
    pub fn decode(&self, dec_in: &Tensor, memory: &Memory) -> Result<Tensor> {
        self.decode_with(dec_in, memory, None)
    }

    /// [`Self::decode`] with `dropout` (training) on the embeddings and every residual branch,
    /// or none (`None`: evaluation).
    pub fn decode_with(
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
        let mut x = drop(self.embed(&self.tgt_embedding, dec_in)?, &mut dropout)?;
        for layer in &self.decoder {
            x = layer.forward(&x, &memory.states, &causal, &memory.mask, &mut dropout)?;
        }
        self.output.forward(&layer_norm(&x)?)
    }

    /// Greedy decoding of u32 `[B, Ts]` sources: at most `max_len` tokens each, stopping at
    /// EOS. Returns each hypothesis's ids without BOS and EOS.
    ///
    /// Each step reruns the decoder over the whole prefix (no key/value cache): simple and
    /// cheap for word-level sentences of ~20 tokens, but its cost grows with the cube of the
    /// output length, so character-level data with long lines decodes slowly.
    pub fn greedy(&self, src: &Tensor, max_len: usize) -> Result<Vec<Vec<u32>>> {
        let (b, _) = src.dims2()?;
        let memory = self.encode(src)?;
        let max_len = max_len.min(self.config.max_len);
        let mut prefix = vec![vec![BOS]; b];
        let mut done = vec![false; b];
        for _ in 0..max_len {
            let t = prefix[0].len();
            let flat: Vec<u32> = prefix.iter().flatten().copied().collect();
            let dec_in = Tensor::from_vec(flat, (b, t), &self.device)?;
            let logits = self.decode(&dec_in, &memory)?;
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
}

/// Overwrites every variable with values drawn from `seed`, in name order: linear weights
/// uniform in `±1/sqrt(fan_in)`, embeddings normal with sd `1/sqrt(D)`, biases 0.
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

/// Greedy decodes of `examples` (sources only) as target tokens, in batches of 250: the
/// model's [`Seq2Seq::greedy`] up to `max_len` tokens, each cut at its first EOS by
/// [`Vocab::decode`].
pub fn translate(
    model: &Seq2Seq,
    examples: &[Encoded],
    vocab: &Vocab,
    max_len: usize,
    device: &Device,
) -> Result<Vec<Vec<String>>> {
    let mut out = Vec::with_capacity(examples.len());
    for chunk in examples.chunks(250) {
        let refs: Vec<&Encoded> = chunk.iter().collect();
        let src = source_tensor(&refs, device)?;
        for ids in model.greedy(&src, max_len)? {
            out.push(vocab.decode(&ids)?);
        }
    }
    Ok(out)
}
