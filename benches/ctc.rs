//! Speed of the CTC loss, forward + backward from logits (the log-softmax included), one JSON
//! line per row, for `benches/ctc_vs_torch.sh` to set against PyTorch (`benches/torch_ctc.py`).
//!
//! ```text
//! cargo bench --bench ctc                                   # every row
//! cargo bench --bench ctc -- --rows ctc_from_logits         # some rows (comma-separated)
//! cargo bench --bench ctc -- --runs 9 --shape 32,128,8000,48
//! RAYON_NUM_THREADS=2 cargo bench --bench ctc               # the issue's 2 threads
//! cargo bench --bench ctc -- --alternate --runs 15 --rows ctc_from_logits,ctc_on_crate_log_softmax
//! ```
//!
//! With `--alternate` the rows named in `--rows` run in turn, one run of each per round, and
//! each row's line adds its time over the first row's in every round and their median: on a
//! shared machine a change of load then falls on every row alike.
//!
//! Rows (each a name, the shape it runs at, and one forward + backward):
//!
//! | row | what |
//! |---|---|
//! | `ctc_from_logits` | `ctc_loss_from_logits` (the fused CPU kernel), `Mean`, at the shape (default `[B, T', V, L] = [32, 128, 8000, 48]`) |
//! | `ctc_from_logits_forward` | the same, forward only (no backward) |
//! | `ctc_on_log_softmax` | `ctc_loss(candle_nn::ops::log_softmax(logits))`: the kernel on candle-nn's composed log-softmax |
//! | `ctc_on_crate_log_softmax` | `ctc_loss(candle_bleu::loss::log_softmax(logits))`: the kernel on the crate's one-pass log-softmax op (PyTorch's idiom) |
//! | `ctc_composed_small` | `ctc_loss_from_logits_composed` at `[8, 32, 500, 10]` (the reference; slow by design) |
//! | `ctc_bleu4` | `ctc_bleu_loss_from_logits` (the BLEU loss on CTC outputs), 4-grams, corpus BLEU+1, the targets as references |
//! | `ctc_bleu_bon2` | the same, bag-of-2-grams (`max_order` 2, weights `[0, 1]`, no smoothing) |
//! | `ctc_plus_bleu4` | `ctc_loss_from_logits + ctc_bleu_loss_from_logits` (4-grams) on the same logits: a fine-tuning step's loss |
//! | `ctc_bleu4_t64`, `ctc_bleu4_t256` | `ctc_bleu4` at `T'` = 64 and 256 (with `ctc_bleu4` at 128: growth in the frames) |
//! | `ctc_bleu4_l24`, `ctc_bleu4_l96` | `ctc_bleu4` with references of 24 and 96 tokens (growth in the reference n-grams) |
//! | `ctc_bleu4_v64_l24`, `_l48`, `_l96` | the same at `V` = 64, where the vocabulary-sized passes are small and the n-gram programs show |
//!
//! A row is one entry of `ROWS`: add one there. Each row runs once to warm up, then `--runs`
//! times (default 5); its line holds the median, minimum and maximum in milliseconds and every
//! run. Inputs: logits N(0, 1) f32, every input length `T'`, every target `L` labels drawn
//! uniformly from `1..V` (blank 0), seeded.

use candle_bleu::loss::{
    ctc_bleu_loss_from_logits, ctc_loss, ctc_loss_from_logits, ctc_loss_from_logits_composed,
    log_softmax, BleuLossConfig, CtcConfig, LossSmoothing, References,
};
use candle_core::{DType, Device, Result, Tensor, Var, D};
use std::time::Instant;

/// The inputs of one shape.
struct Inputs {
    shape: [usize; 4],
    logits: Var,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    /// The targets as the BLEU rows' references.
    refs: References,
}

impl Inputs {
    fn new([batch, frames, vocab, length]: [usize; 4]) -> Result<Self> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(33);
        let device = Device::Cpu;
        // N(0, 1) by Box-Muller, seeded (candle's CPU randn takes no seed).
        let logits: Vec<f32> = (0..batch * frames * vocab)
            .map(|_| {
                let (u, v): (f32, f32) = (rng.gen_range(f32::EPSILON..1.0), rng.gen());
                (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
            })
            .collect();
        let logits = Tensor::from_vec(logits, (batch, frames, vocab), &device)?;
        let targets: Vec<u32> = (0..batch * length)
            .map(|_| rng.gen_range(1..vocab as u32))
            .collect();
        let targets = Tensor::from_vec(targets, (batch, length), &device)?;
        Ok(Self {
            shape: [batch, frames, vocab, length],
            logits: Var::from_tensor(&logits)?,
            refs: References::from_ids(&targets, 0)?,
            targets,
            input_lengths: Tensor::from_vec(vec![frames as u32; batch], batch, &device)?,
            target_lengths: Tensor::from_vec(vec![length as u32; batch], batch, &device)?,
        })
    }

    /// Forward + backward of `loss`; returns the loss (read, so the work is done).
    fn step(
        &self,
        loss: impl Fn(&Tensor, &Tensor, &Tensor, &Tensor, &CtcConfig) -> Result<Tensor>,
    ) -> Result<f32> {
        let x = self.logits.as_tensor();
        let loss = loss(
            x,
            &self.targets,
            &self.input_lengths,
            &self.target_lengths,
            &CtcConfig::default(),
        )?;
        let grads = loss.backward()?;
        let grad = grads.get(x).expect("a logits gradient");
        // Touch the gradient so that nothing is left lazy.
        let _ = grad.dims();
        loss.to_dtype(DType::F32)?.to_scalar::<f32>()
    }

    /// Forward + backward of the BLEU loss on CTC outputs under `cfg` (plus the CTC loss with
    /// `with_ctc`), the targets as references.
    fn bleu_step(&self, cfg: &BleuLossConfig, with_ctc: bool) -> Result<f32> {
        let x = self.logits.as_tensor();
        let mut loss =
            ctc_bleu_loss_from_logits(x, Some(&self.input_lengths), &self.refs, 0, cfg)?.loss;
        if with_ctc {
            let ctc = ctc_loss_from_logits(
                x,
                &self.targets,
                &self.input_lengths,
                &self.target_lengths,
                &CtcConfig::default(),
            )?;
            loss = (loss + ctc)?;
        }
        let grads = loss.backward()?;
        let _ = grads.get(x).expect("a logits gradient").dims();
        loss.to_dtype(DType::F32)?.to_scalar::<f32>()
    }
}

fn bon2() -> BleuLossConfig {
    BleuLossConfig {
        max_order: 2,
        weights: Some(vec![0.0, 1.0]),
        smoothing: LossSmoothing::None,
        ..Default::default()
    }
}

/// A row: its name, the shape it runs at (`None`: the bench's shape), one forward + backward.
struct Row {
    name: &'static str,
    shape: Option<[usize; 4]>,
    step: fn(&Inputs) -> Result<f32>,
}

const ROWS: &[Row] = &[
    Row {
        name: "ctc_from_logits",
        shape: None,
        step: |inputs| inputs.step(ctc_loss_from_logits),
    },
    Row {
        name: "ctc_from_logits_forward",
        shape: None,
        step: |inputs| {
            let loss = ctc_loss_from_logits(
                inputs.logits.as_tensor(),
                &inputs.targets,
                &inputs.input_lengths,
                &inputs.target_lengths,
                &CtcConfig::default(),
            )?;
            loss.to_scalar::<f32>()
        },
    },
    Row {
        name: "ctc_on_log_softmax",
        shape: None,
        step: |inputs| {
            inputs.step(|x, t, il, tl, cfg| {
                ctc_loss(&candle_nn::ops::log_softmax(x, D::Minus1)?, t, il, tl, cfg)
            })
        },
    },
    Row {
        name: "ctc_on_crate_log_softmax",
        shape: None,
        step: |inputs| inputs.step(|x, t, il, tl, cfg| ctc_loss(&log_softmax(x)?, t, il, tl, cfg)),
    },
    Row {
        name: "ctc_composed_small",
        shape: Some([8, 32, 500, 10]),
        step: |inputs| inputs.step(ctc_loss_from_logits_composed),
    },
    Row {
        name: "ctc_bleu4",
        shape: None,
        step: |inputs| inputs.bleu_step(&BleuLossConfig::default(), false),
    },
    Row {
        name: "ctc_bleu_bon2",
        shape: None,
        step: |inputs| inputs.bleu_step(&bon2(), false),
    },
    Row {
        name: "ctc_plus_bleu4",
        shape: None,
        step: |inputs| inputs.bleu_step(&BleuLossConfig::default(), true),
    },
    Row {
        name: "ctc_bleu4_t64",
        shape: Some([32, 64, 8000, 48]),
        step: |inputs| inputs.bleu_step(&BleuLossConfig::default(), false),
    },
    Row {
        name: "ctc_bleu4_t256",
        shape: Some([32, 256, 8000, 48]),
        step: |inputs| inputs.bleu_step(&BleuLossConfig::default(), false),
    },
    Row {
        name: "ctc_bleu4_l24",
        shape: Some([32, 128, 8000, 24]),
        step: |inputs| inputs.bleu_step(&BleuLossConfig::default(), false),
    },
    Row {
        name: "ctc_bleu4_l96",
        shape: Some([32, 128, 8000, 96]),
        step: |inputs| inputs.bleu_step(&BleuLossConfig::default(), false),
    },
    Row {
        name: "ctc_bleu4_v64_l24",
        shape: Some([32, 128, 64, 24]),
        step: |inputs| inputs.bleu_step(&BleuLossConfig::default(), false),
    },
    Row {
        name: "ctc_bleu4_v64_l48",
        shape: Some([32, 128, 64, 48]),
        step: |inputs| inputs.bleu_step(&BleuLossConfig::default(), false),
    },
    Row {
        name: "ctc_bleu4_v64_l96",
        shape: Some([32, 128, 64, 96]),
        step: |inputs| inputs.bleu_step(&BleuLossConfig::default(), false),
    },
];

fn args_have(flag: &str) -> bool {
    std::env::args().any(|a| a == flag)
}

/// `--alternate`: the rows run in turn, one run each per round (`A B C A B C …`), so that a
/// change of load on a shared machine falls on every row alike; each row's line as usual, then
/// one line per row with its ratio to the first row in each round and their median.
fn alternate(names: &[String], shape: [usize; 4], runs: usize, threads: usize) -> Result<()> {
    let rows: Vec<&Row> = names
        .iter()
        .map(|n| ROWS.iter().find(|r| r.name == n).expect("a known row"))
        .collect();
    let inputs = rows
        .iter()
        .map(|row| Inputs::new(row.shape.unwrap_or(shape)))
        .collect::<Result<Vec<_>>>()?;
    let mut losses = Vec::new();
    for (row, inputs) in rows.iter().zip(&inputs) {
        losses.push((row.step)(inputs)?); // warm-up
    }
    let mut times = vec![Vec::with_capacity(runs); rows.len()];
    for _ in 0..runs {
        for ((row, inputs), times) in rows.iter().zip(&inputs).zip(&mut times) {
            let start = Instant::now();
            (row.step)(inputs)?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let median = |v: &[f64]| {
        let mut sorted = v.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    for (i, row) in rows.iter().enumerate() {
        let ratios: Vec<f64> = times[i].iter().zip(&times[0]).map(|(t, b)| t / b).collect();
        println!(
            "{{\"row\":\"{}\",\"shape\":{:?},\"threads\":{threads},\"alternated\":true,\"loss\":{},\"median_ms\":{:.3},\"runs_ms\":{:?},\"ratio_to\":\"{}\",\"median_ratio\":{:.3},\"ratios\":{:?}}}",
            row.name,
            inputs[i].shape,
            losses[i],
            median(&times[i]),
            times[i].iter().map(|t| (t * 1e3).round() / 1e3).collect::<Vec<_>>(),
            rows[0].name,
            median(&ratios),
            ratios.iter().map(|r| (r * 1e3).round() / 1e3).collect::<Vec<_>>(),
        );
    }
    Ok(())
}

fn argument(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<()> {
    let runs: usize = argument("--runs").map_or(5, |r| r.parse().expect("--runs N"));
    let shape: [usize; 4] = match argument("--shape") {
        Some(s) => {
            let v: Vec<usize> = s
                .split(',')
                .map(|x| x.parse().expect("--shape B,T,V,L"))
                .collect();
            [v[0], v[1], v[2], v[3]]
        }
        None => [32, 128, 8000, 48],
    };
    let wanted: Option<Vec<String>> =
        argument("--rows").map(|r| r.split(',').map(str::to_string).collect());
    if let Some(wanted) = &wanted {
        for name in wanted {
            assert!(
                ROWS.iter().any(|row| row.name == name),
                "unknown row {name:?}; rows: {:?}",
                ROWS.iter().map(|r| r.name).collect::<Vec<_>>()
            );
        }
    }
    let threads = rayon::current_num_threads();
    if args_have("--alternate") {
        return alternate(
            &wanted.expect("--alternate needs --rows"),
            shape,
            runs,
            threads,
        );
    }
    for row in ROWS {
        if wanted
            .as_ref()
            .is_some_and(|w| !w.iter().any(|n| n == row.name))
        {
            continue;
        }
        let inputs = Inputs::new(row.shape.unwrap_or(shape))?;
        let loss = (row.step)(&inputs)?; // warm-up
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = Instant::now();
            (row.step)(&inputs)?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "{{\"row\":\"{}\",\"shape\":{:?},\"threads\":{threads},\"loss\":{loss},\"median_ms\":{:.3},\"min_ms\":{:.3},\"max_ms\":{:.3},\"runs_ms\":{:?}}}",
            row.name,
            inputs.shape,
            sorted[sorted.len() / 2],
            sorted[0],
            sorted[sorted.len() - 1],
            times.iter().map(|t| (t * 1e3).round() / 1e3).collect::<Vec<_>>(),
        );
    }
    Ok(())
}
