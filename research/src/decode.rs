//! Search over a [`Transformer`]'s incremental decoder: greedy, beam search with a length
//! penalty, and ancestral sampling, batched over sources with a key/value cache.
//!
//! Decoding picks discrete tokens, so each step reads the step's scores to the host (one
//! `[N, V]` copy per step); nothing here is on a training path's autograd graph.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor, D};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::transformer::{Memory, Transformer};

/// The special tokens decoding needs.
#[derive(Debug, Clone, Copy)]
pub struct Specials {
    /// The first decoder input.
    pub bos: u32,
    /// Ends a hypothesis (not part of the returned tokens).
    pub eos: u32,
    /// Source padding.
    pub pad: u32,
}

/// The longest output for a source of `source_len` tokens: `a · source_len + b`, capped by
/// the model's positions.
#[derive(Debug, Clone, Copy)]
pub struct MaxLength {
    /// `a`.
    pub per_source_token: f64,
    /// `b`.
    pub extra: usize,
}

impl Default for MaxLength {
    fn default() -> Self {
        Self {
            per_source_token: 1.5,
            extra: 10,
        }
    }
}

impl MaxLength {
    fn of(&self, source_len: usize, model_max: usize) -> usize {
        let len = (self.per_source_token * source_len as f64).ceil() as usize + self.extra;
        // The decoder's inputs are BOS and the tokens so far: at most `model_max` positions.
        len.min(model_max.saturating_sub(1)).max(1)
    }
}

/// Source lengths (tokens before padding) of u32 `[B, Ts]` ids.
fn source_lengths(src: &Tensor, pad: u32) -> Result<Vec<usize>> {
    Ok(src
        .to_vec2::<u32>()?
        .iter()
        .map(|row| row.iter().take_while(|&&t| t != pad).count())
        .collect())
}

/// Logits of decoder states `[N, D]` with PAD and BOS, which no output may contain, at
/// -1e9.
fn allowed_logits(model: &Transformer, states: &Tensor, specials: Specials) -> Result<Tensor> {
    let logits = model.logits(states)?;
    let vocab = logits.dim(1)?;
    let mut bias = vec![0f32; vocab];
    for id in [specials.pad, specials.bos] {
        if let Some(b) = bias.get_mut(id as usize) {
            *b = -1e9;
        }
    }
    Ok(logits.broadcast_add(&Tensor::from_vec(bias, vocab, logits.device())?)?)
}

/// `log_softmax` of decoder states `[N, D]` as host rows (PAD and BOS excluded).
fn log_probs(model: &Transformer, states: &Tensor, specials: Specials) -> Result<Vec<Vec<f32>>> {
    let logits = allowed_logits(model, states, specials)?;
    Ok(candle_nn::ops::log_softmax(&logits, D::Minus1)?.to_vec2::<f32>()?)
}

/// Greedy decoding of u32 `[B, Ts]` sources. Returns each output's tokens without BOS/EOS.
pub fn greedy(
    model: &Transformer,
    src: &Tensor,
    specials: Specials,
    max_length: MaxLength,
) -> Result<Vec<Vec<u32>>> {
    let device = src.device().clone();
    let memory = model.encode(src, specials.pad, None)?;
    let lengths = source_lengths(src, specials.pad)?;
    let limits: Vec<usize> = lengths
        .iter()
        .map(|&l| max_length.of(l, model.config().max_len))
        .collect();
    let longest = limits.iter().copied().max().unwrap_or(1);
    let b = lengths.len();
    let mut cache = model.start(&memory, 1)?;
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); b];
    let mut done = vec![false; b];
    let mut inputs = vec![specials.bos; b];
    for _ in 0..longest {
        let states = model.step(&Tensor::new(inputs.as_slice(), &device)?, &mut cache)?;
        let next = allowed_logits(model, &states, specials)?
            .argmax(D::Minus1)?
            .to_vec1::<u32>()?;
        for i in 0..b {
            if done[i] {
                inputs[i] = specials.eos;
                continue;
            }
            if next[i] == specials.eos {
                done[i] = true;
            } else {
                out[i].push(next[i]);
                done[i] = out[i].len() >= limits[i];
            }
            inputs[i] = next[i];
        }
        if done.iter().all(|&d| d) {
            break;
        }
    }
    Ok(out)
}

/// Beam search settings.
#[derive(Debug, Clone, Copy)]
pub struct BeamConfig {
    /// Beam width `K` (>= 1).
    pub beam: usize,
    /// Length penalty `α`: a finished hypothesis scores `log p(y|x) / |y|^α`, `|y|` counting
    /// EOS (fairseq's `--lenpen`; 0 = raw log-probability, which favours short outputs).
    pub length_penalty: f64,
    /// The longest output.
    pub max_length: MaxLength,
}

impl Default for BeamConfig {
    fn default() -> Self {
        Self {
            beam: 5,
            length_penalty: 1.0,
            max_length: MaxLength::default(),
        }
    }
}

/// A finished hypothesis of one source.
#[derive(Debug, Clone)]
struct Finished {
    tokens: Vec<u32>,
    score: f64,
}

/// Beam search of u32 `[B, Ts]` sources: `K` hypotheses per source expand by their top
/// tokens; a hypothesis that emits EOS is finished with its length-normalised score; a source
/// is done when it has `K` finished hypotheses or reaches its length limit, and its best
/// finished hypothesis (or, if none finished, its best open one) is returned.
pub fn beam_search(
    model: &Transformer,
    src: &Tensor,
    specials: Specials,
    cfg: BeamConfig,
) -> Result<Vec<Vec<u32>>> {
    if cfg.beam == 0 {
        bail!("beam must be >= 1");
    }
    let k = cfg.beam;
    let device: Device = src.device().clone();
    let memory = model.encode(src, specials.pad, None)?;
    let lengths = source_lengths(src, specials.pad)?;
    let b = lengths.len();
    let limits: Vec<usize> = lengths
        .iter()
        .map(|&l| cfg.max_length.of(l, model.config().max_len))
        .collect();
    let longest = limits.iter().copied().max().unwrap_or(1);
    let normalise = |score: f64, len: usize| score / (len as f64).powf(cfg.length_penalty);
    // Rows b·K + j. At the start only beam 0 of each source is open (the others would repeat it).
    let mut cache = model.start(&memory, k)?;
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); b * k];
    let mut scores: Vec<f64> = (0..b * k)
        .map(|r| if r % k == 0 { 0.0 } else { f64::NEG_INFINITY })
        .collect();
    let mut inputs = vec![specials.bos; b * k];
    let mut finished: Vec<Vec<Finished>> = vec![Vec::new(); b];
    let mut done = vec![false; b];
    for step in 0..longest {
        let states = model.step(&Tensor::new(inputs.as_slice(), &device)?, &mut cache)?;
        let rows = log_probs(model, &states, specials)?;
        let mut order: Vec<u32> = Vec::with_capacity(b * k);
        let mut next_tokens = vec![Vec::new(); b * k];
        let mut next_scores = vec![f64::NEG_INFINITY; b * k];
        let mut next_inputs = vec![specials.eos; b * k];
        for source in 0..b {
            let base = source * k;
            if done[source] {
                for j in 0..k {
                    order.push((base + j) as u32);
                }
                continue;
            }
            // The 2K best (beam, token) expansions: at most K of them end in EOS, so K open
            // ones remain.
            let mut best: Vec<(f64, usize, u32)> = Vec::with_capacity(2 * k + 1);
            for j in 0..k {
                let row = base + j;
                if scores[row] == f64::NEG_INFINITY {
                    continue;
                }
                for (token, &lp) in rows[row].iter().enumerate() {
                    let s = scores[row] + f64::from(lp);
                    if best.len() < 2 * k || s > best[best.len() - 1].0 {
                        let at = best.partition_point(|e| e.0 >= s);
                        best.insert(at, (s, j, token as u32));
                        best.truncate(2 * k);
                    }
                }
            }
            let at_limit = step + 1 >= limits[source];
            let mut open = 0;
            for (rank, &(s, j, token)) in best.iter().enumerate() {
                let row = base + j;
                // As fairseq: an EOS expansion is finished only if it ranks among the top K;
                // a lower-ranked one is dropped (finishing it would end the search with a
                // hypothesis worse than K open ones).
                if token == specials.eos && rank >= k {
                    continue;
                }
                if token == specials.eos || at_limit {
                    // At the length limit every expansion is finished as if it ended there.
                    let mut hyp = tokens[row].clone();
                    if token != specials.eos {
                        hyp.push(token);
                    }
                    let len = hyp.len() + 1;
                    if finished[source].len() < k {
                        finished[source].push(Finished {
                            tokens: hyp,
                            score: normalise(s, len),
                        });
                    }
                } else if open < k {
                    let target = base + open;
                    let mut hyp = tokens[row].clone();
                    hyp.push(token);
                    next_tokens[target] = hyp;
                    next_scores[target] = s;
                    next_inputs[target] = token;
                    order.push(row as u32);
                    open += 1;
                }
                if finished[source].len() >= k && (open >= k || at_limit) {
                    break;
                }
            }
            for _ in open..k {
                order.push(base as u32);
            }
            if finished[source].len() >= k || at_limit || open == 0 {
                done[source] = true;
            }
        }
        tokens = next_tokens;
        scores = next_scores;
        inputs = next_inputs;
        if done.iter().all(|&d| d) {
            break;
        }
        cache = cache.select(&Tensor::new(order.as_slice(), &device)?)?;
    }
    Ok((0..b)
        .map(|source| {
            let best = finished[source]
                .iter()
                .max_by(|a, b| a.score.total_cmp(&b.score));
            match best {
                Some(f) => f.tokens.clone(),
                None => {
                    let base = source * k;
                    let j = (0..k)
                        .max_by(|&x, &y| scores[base + x].total_cmp(&scores[base + y]))
                        .unwrap_or(0);
                    tokens[base + j].clone()
                }
            }
        })
        .collect())
}

/// Ancestral sampling settings.
#[derive(Debug, Clone, Copy)]
pub struct SampleConfig {
    /// Samples drawn per source.
    pub copies: usize,
    /// The longest output.
    pub max_length: MaxLength,
    /// The seed of the sampler's random numbers.
    pub seed: u64,
}

impl Default for SampleConfig {
    fn default() -> Self {
        Self {
            copies: 1,
            max_length: MaxLength::default(),
            seed: 0,
        }
    }
}

/// `cfg.copies` samples per source of u32 `[B, Ts]` sources from the model's distribution
/// (ancestral sampling at temperature 1), drawn from `cfg.seed`. Returns `B · copies` outputs,
/// those of one source adjacent, without BOS/EOS.
pub fn sample(
    model: &Transformer,
    src: &Tensor,
    specials: Specials,
    cfg: SampleConfig,
) -> Result<Vec<Vec<u32>>> {
    let SampleConfig {
        copies,
        max_length,
        seed,
    } = cfg;
    let device = src.device().clone();
    let memory: Memory = model.encode(src, specials.pad, None)?;
    let lengths = source_lengths(src, specials.pad)?;
    let n = lengths.len() * copies;
    let limits: Vec<usize> = (0..n)
        .map(|r| max_length.of(lengths[r / copies], model.config().max_len))
        .collect();
    let longest = limits.iter().copied().max().unwrap_or(1);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cache = model.start(&memory, copies)?;
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut done = vec![false; n];
    let mut inputs = vec![specials.bos; n];
    for _ in 0..longest {
        let states = model.step(&Tensor::new(inputs.as_slice(), &device)?, &mut cache)?;
        let rows = log_probs(model, &states, specials)?;
        for r in 0..n {
            if done[r] {
                inputs[r] = specials.eos;
                continue;
            }
            let u: f64 = rng.gen();
            let mut acc = 0.0;
            let mut token = rows[r].len() - 1;
            for (v, &lp) in rows[r].iter().enumerate() {
                acc += f64::from(lp).exp();
                if acc > u {
                    token = v;
                    break;
                }
            }
            let token = token as u32;
            if token == specials.eos {
                done[r] = true;
            } else {
                out[r].push(token);
                if out[r].len() >= limits[r] {
                    done[r] = true;
                }
            }
            inputs[r] = token;
        }
        if done.iter().all(|&d| d) {
            break;
        }
    }
    Ok(out)
}
