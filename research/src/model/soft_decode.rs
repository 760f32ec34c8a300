//! The model's own decode as a differentiable function of its weights: an incremental
//! (key/value-cached) view of the seq2seq example's Transformer that feeds back, at every step,
//! the embedding of its own output distribution instead of a reference token.
//!
//! [`SoftDecoder`] reads the weights of a [`Transformer`] with separate embeddings out of its
//! `VarMap` by name, so it computes exactly what [`Transformer::decode`] and
//! [`Transformer::logits`] compute for the same inputs (a test checks this) while the optimizer keeps updating the same variables. Feedback modes:
//! - [`Feedback::Expected`]: the next input is the expected embedding `Σ_v p_v E_v` of the
//!   step's softmax `p` (Casas et al.'s soft decode); every step is differentiable;
//! - [`Feedback::Gumbel`]: a straight-through Gumbel-softmax sample: the forward feeds the
//!   one-hot `argmax((logits + g) / τ)`, the backward uses the gradient of
//!   `softmax((logits + g) / τ)`;
//! - [`Feedback::Argmax`]: greedy decoding (the one-hot of the argmax), for evaluation.
//!
//! [`SoftDecoder::unroll`] returns the `[B, S, V]` logits of `S` steps; their softmax is the
//! distribution matrix the BLEU loss scores (with `LengthModel::SoftEos`, which reads the
//! hypothesis length off the EOS probabilities), and autograd carries its gradient back
//! through all `S` steps, the fed-back embeddings included.

use anyhow::{anyhow, bail, Result};
use candle_core::{DType, Tensor, D};
use candle_nn::VarMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

use crate::data::{BOS, EOS, PAD};
#[cfg(doc)]
use crate::model::transformer::Transformer;
use crate::model::transformer::{layer_norm, TransformerConfig};

/// What the decoder feeds back after each step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Feedback {
    /// The expected embedding `Σ_v p_v E_v` of the step's distribution.
    Expected,
    /// A straight-through Gumbel-softmax sample at temperature `tau`, noise drawn from `seed`.
    Gumbel {
        /// Temperature.
        tau: f64,
        /// Seed of the noise.
        seed: u64,
    },
    /// The embedding of the argmax token (greedy decoding; not differentiable).
    Argmax,
}

/// A linear layer's weight `[D_out, D_in]` and bias `[1, D_out]`.
struct Dense {
    weight: Tensor,
    bias: Tensor,
}

impl Dense {
    /// `x` `[N, D_in]` → `[N, D_out]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.weight.t()?)?.broadcast_add(&self.bias)?)
    }

    /// `x` `[B, T, D_in]` → `[B, T, D_out]`.
    fn forward3(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        Ok(self.forward(&x.reshape((b * t, d))?)?.reshape((b, t, ()))?)
    }
}

struct Attention {
    query: Dense,
    key: Dense,
    value: Dense,
    out: Dense,
}

struct FeedForward {
    up: Dense,
    down: Dense,
}

impl FeedForward {
    fn forward3(&self, x: &Tensor) -> Result<Tensor> {
        self.down.forward3(&self.up.forward3(x)?.relu()?)
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

/// The encoder output of a batch, with each decoder layer's cross-attention keys and values
/// computed once.
pub struct SoftMemory {
    /// `[B, 1, 1, Ts]`: 0 at source tokens, -1e9 at padding.
    mask: Tensor,
    /// Per decoder layer: keys and values `[B, H, Ts, D/H]`.
    cross: Vec<(Tensor, Tensor)>,
}

/// The seq2seq model's weights, read for incremental decoding.
pub struct SoftDecoder {
    src_embedding: Tensor,
    tgt_embedding: Tensor,
    positions: Tensor,
    encoder: Vec<EncoderLayer>,
    decoder: Vec<DecoderLayer>,
    output: Dense,
    config: TransformerConfig,
}

/// Weights by name, as [`Transformer::new`] names them in its `VarMap`.
pub type Weights = HashMap<String, Tensor>;

/// The tensors of `varmap` by name: the variables themselves (the optimizer's updates show
/// through, and gradients reach them), or detached copies for evaluation.
pub fn weights_of(varmap: &VarMap, detached: bool) -> Weights {
    let data = varmap
        .data()
        .lock()
        .expect("the VarMap lock is never poisoned");
    data.iter()
        .map(|(name, var)| {
            let tensor = var.as_tensor();
            let tensor = if detached {
                tensor.detach()
            } else {
                tensor.clone()
            };
            (name.clone(), tensor)
        })
        .collect()
}

impl SoftDecoder {
    /// The decoder over `weights` (names as in [`Transformer::new`] with separate embeddings),
    /// in the weights' dtype.
    pub fn new(weights: &Weights, config: TransformerConfig) -> Result<Self> {
        let get = |name: &str| {
            weights
                .get(name)
                .cloned()
                .ok_or_else(|| anyhow!("soft decoder: no weight named `{name}`"))
        };
        let dense = |prefix: &str| -> Result<Dense> {
            Ok(Dense {
                weight: get(&format!("{prefix}.weight"))?,
                bias: get(&format!("{prefix}.bias"))?,
            })
        };
        let attention = |prefix: &str| -> Result<Attention> {
            Ok(Attention {
                query: dense(&format!("{prefix}.q"))?,
                key: dense(&format!("{prefix}.k"))?,
                value: dense(&format!("{prefix}.v"))?,
                out: dense(&format!("{prefix}.o"))?,
            })
        };
        let ff = |prefix: &str| -> Result<FeedForward> {
            Ok(FeedForward {
                up: dense(&format!("{prefix}.up"))?,
                down: dense(&format!("{prefix}.down"))?,
            })
        };
        let encoder = (0..config.encoder_layers)
            .map(|i| {
                Ok(EncoderLayer {
                    attention: attention(&format!("encoder.{i}.attention"))?,
                    ff: ff(&format!("encoder.{i}.ff"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let decoder = (0..config.decoder_layers)
            .map(|i| {
                Ok(DecoderLayer {
                    self_attention: attention(&format!("decoder.{i}.self_attention"))?,
                    cross_attention: attention(&format!("decoder.{i}.cross_attention"))?,
                    ff: ff(&format!("decoder.{i}.ff"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            src_embedding: get("src_embedding")?,
            tgt_embedding: get("tgt_embedding")?,
            positions: get("positions")?,
            encoder,
            decoder,
            output: dense("output")?,
            config,
        })
    }

    fn dtype(&self) -> DType {
        self.tgt_embedding.dtype()
    }

    fn heads(&self) -> usize {
        self.config.heads
    }

    /// `[B, T, D]` → `[B, H, T, D/H]`.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        let h = self.heads();
        Ok(x.reshape((b, t, h, d / h))?.transpose(1, 2)?.contiguous()?)
    }

    /// `[B, H, T, D/H]` → `[B, T, D]`.
    fn merge_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, h, t, dh) = x.dims4()?;
        Ok(x.transpose(1, 2)?.reshape((b, t, h * dh))?)
    }

    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let dh = q.dim(3)?;
        let scores = (q.matmul(&k.t()?.contiguous()?)? * (1.0 / (dh as f64).sqrt()))?;
        let scores = match mask {
            Some(mask) => scores.broadcast_add(mask)?,
            None => scores,
        };
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        self.merge_heads(&weights.matmul(v)?)
    }

    /// Encodes u32 `[B, Ts]` sources (right-padded with `PAD`).
    pub fn encode(&self, src: &Tensor) -> Result<SoftMemory> {
        let (b, ts) = src.dims2()?;
        if ts > self.config.max_len {
            bail!(
                "source of {ts} tokens exceeds the model's max_len {}",
                self.config.max_len
            );
        }
        let dtype = self.dtype();
        let mask = (src.eq(PAD)?.to_dtype(dtype)? * -1e9)?.reshape((b, 1, 1, ts))?;
        let scale = (self.config.d_model as f64).sqrt();
        let embedded = self
            .src_embedding
            .index_select(&src.flatten_all()?, 0)?
            .reshape((b, ts, ()))?;
        let positions = self.positions.narrow(0, 0, ts)?.unsqueeze(0)?;
        let mut x = (embedded * scale)?.broadcast_add(&positions)?;
        for layer in &self.encoder {
            let h = layer_norm(&x)?;
            let q = self.split_heads(&layer.attention.query.forward3(&h)?)?;
            let k = self.split_heads(&layer.attention.key.forward3(&h)?)?;
            let v = self.split_heads(&layer.attention.value.forward3(&h)?)?;
            let context = self.attend(&q, &k, &v, Some(&mask))?;
            x = (x + layer.attention.out.forward3(&context)?)?;
            let h = layer_norm(&x)?;
            x = (&x + layer.ff.forward3(&h)?)?;
        }
        let states = layer_norm(&x)?;
        let cross = self
            .decoder
            .iter()
            .map(|layer| {
                Ok((
                    self.split_heads(&layer.cross_attention.key.forward3(&states)?)?,
                    self.split_heads(&layer.cross_attention.value.forward3(&states)?)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SoftMemory { mask, cross })
    }

    /// One decoder step. `input` `[B, D]` is the step's input embedding (before the scale
    /// and position); `cache` holds each layer's self-attention keys and values of the
    /// earlier steps and is extended. Returns the step's logits `[B, V]`.
    pub fn step(
        &self,
        input: &Tensor,
        position: usize,
        memory: &SoftMemory,
        cache: &mut Vec<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        if position >= self.config.max_len {
            bail!(
                "decoder position {position} exceeds the model's max_len {}",
                self.config.max_len
            );
        }
        let scale = (self.config.d_model as f64).sqrt();
        let position_embedding = self.positions.narrow(0, position, 1)?;
        let mut x = (input * scale)?
            .broadcast_add(&position_embedding)?
            .unsqueeze(1)?;
        for (l, layer) in self.decoder.iter().enumerate() {
            let h = layer_norm(&x)?;
            let q = self.split_heads(&layer.self_attention.query.forward3(&h)?)?;
            let k = self.split_heads(&layer.self_attention.key.forward3(&h)?)?;
            let v = self.split_heads(&layer.self_attention.value.forward3(&h)?)?;
            let (k, v) = match cache.get(l) {
                Some((past_k, past_v)) => (
                    Tensor::cat(&[past_k, &k], 2)?,
                    Tensor::cat(&[past_v, &v], 2)?,
                ),
                None => (k, v),
            };
            let context = self.attend(&q, &k, &v, None)?;
            if l < cache.len() {
                cache[l] = (k, v);
            } else {
                cache.push((k, v));
            }
            x = (x + layer.self_attention.out.forward3(&context)?)?;
            let h = layer_norm(&x)?;
            let q = self.split_heads(&layer.cross_attention.query.forward3(&h)?)?;
            let (mk, mv) = &memory.cross[l];
            let context = self.attend(&q, mk, mv, Some(&memory.mask))?;
            x = (x + layer.cross_attention.out.forward3(&context)?)?;
            let h = layer_norm(&x)?;
            x = (&x + layer.ff.forward3(&h)?)?;
        }
        self.output.forward(&layer_norm(&x)?.squeeze(1)?)
    }

    /// The embedding rows of u32 ids `[B]`: `[B, D]`.
    fn embed_ids(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(self.tgt_embedding.index_select(ids, 0)?)
    }

    /// One-hot rows `[B, V]` (the decoder's dtype) of u32 ids `[B]`, built on the device.
    fn one_hot(&self, ids: &Tensor) -> Result<Tensor> {
        let v = self.config.tgt_vocab as u32;
        let vocab = Tensor::arange(0u32, v, ids.device())?.unsqueeze(0)?;
        Ok(vocab
            .broadcast_eq(&ids.unsqueeze(1)?)?
            .to_dtype(self.dtype())?)
    }

    /// Runs `steps` decoder steps from BOS, feeding back per `feedback`. Returns the logits
    /// `[B, steps, V]` (differentiable through every step for `Expected` and `Gumbel`).
    pub fn unroll(&self, memory: &SoftMemory, steps: usize, feedback: Feedback) -> Result<Tensor> {
        let b = memory.mask.dim(0)?;
        let device = memory.mask.device();
        let mut input = self.embed_ids(&Tensor::full(BOS, b, device)?)?;
        let mut cache = Vec::with_capacity(self.decoder.len());
        let mut rng = match feedback {
            Feedback::Gumbel { seed, .. } => Some(StdRng::seed_from_u64(seed)),
            _ => None,
        };
        let mut all = Vec::with_capacity(steps);
        for t in 0..steps {
            let logits = self.step(&input, t, memory, &mut cache)?;
            if t + 1 < steps {
                input = match feedback {
                    Feedback::Expected => {
                        candle_nn::ops::softmax(&logits, D::Minus1)?.matmul(&self.tgt_embedding)?
                    }
                    Feedback::Gumbel { tau, .. } => {
                        let rng = rng.as_mut().expect("a Gumbel generator");
                        let v = self.config.tgt_vocab;
                        // Gumbel(0, 1) noise, drawn on the host from the seed (candle's CPU
                        // generator cannot be seeded).
                        let noise: Vec<f64> = (0..b * v)
                            .map(|_| {
                                let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
                                -(-u.ln()).ln()
                            })
                            .collect();
                        let noise =
                            Tensor::from_vec(noise, (b, v), device)?.to_dtype(self.dtype())?;
                        let soft =
                            candle_nn::ops::softmax(&((&logits + noise)? / tau)?, D::Minus1)?;
                        let hard = self.one_hot(&soft.argmax(D::Minus1)?)?;
                        // Forward value: the one-hot; gradient: that of the soft sample.
                        let sample = ((hard - soft.detach())? + &soft)?;
                        sample.matmul(&self.tgt_embedding)?
                    }
                    Feedback::Argmax => self.embed_ids(&logits.argmax(D::Minus1)?)?,
                };
            }
            all.push(logits);
        }
        Ok(Tensor::stack(&all, 1)?)
    }

    /// Teacher-forced logits `[B, T, V]` for decoder inputs u32 `[B, T]` (`BOS y_1 ..`),
    /// step by step through the cache: what [`Transformer::decode`] computes in one pass (the
    /// check of this decoder in `research/tests/study.rs`).
    #[allow(dead_code)]
    pub fn teacher_forced(&self, memory: &SoftMemory, dec_in: &Tensor) -> Result<Tensor> {
        let (_, t) = dec_in.dims2()?;
        let mut cache = Vec::new();
        let mut all = Vec::with_capacity(t);
        for i in 0..t {
            let ids = dec_in.narrow(1, i, 1)?.squeeze(1)?.contiguous()?;
            all.push(self.step(&self.embed_ids(&ids)?, i, memory, &mut cache)?);
        }
        Ok(Tensor::stack(&all, 1)?)
    }

    /// Greedy decoding of u32 `[B, Ts]` sources with the key/value cache: at most `max_len`
    /// tokens each, stopping when every row has produced EOS. Returns ids without EOS.
    pub fn greedy(&self, src: &Tensor, max_len: usize) -> Result<Vec<Vec<u32>>> {
        let memory = self.encode(src)?;
        let b = src.dim(0)?;
        let max_len = max_len.min(self.config.max_len - 1);
        let mut input = self.embed_ids(&Tensor::full(BOS, b, src.device())?)?;
        let mut cache = Vec::with_capacity(self.decoder.len());
        let mut out = vec![Vec::new(); b];
        let mut done = vec![false; b];
        for t in 0..max_len {
            let next = self
                .step(&input, t, &memory, &mut cache)?
                .argmax(D::Minus1)?;
            for (i, &token) in next.to_vec1::<u32>()?.iter().enumerate() {
                if !done[i] {
                    if token == EOS {
                        done[i] = true;
                    } else {
                        out[i].push(token);
                    }
                }
            }
            if done.iter().all(|&d| d) {
                break;
            }
            input = self.embed_ids(&next)?;
        }
        Ok(out)
    }
}
