//! What each option of the cross-entropy costs (issue 35): one forward + backward of
//! `cross_entropy_from_logits` and of `cross_entropy_from_hidden` with every option off, and
//! with one option on at a time — the z-loss (and its value), the token accuracy, soft-capping,
//! class weights — on the CPU, alternated within one run (off, z, accuracy, softcap, weights,
//! off, …) so that the
//! machine's drift falls on every variant alike. Prints each variant's median and spread over
//! the rounds and its ratio to the option-off median of the same path.
//!
//! ```text
//! cargo bench --bench ce_options            # [16, 64] rows, V = 8000, D = 256; 7 rounds
//! cargo bench --bench ce_options -- --quick # a smaller shape, 3 rounds
//! ```

use candle_bleu::loss::{
    cross_entropy_from_hidden, cross_entropy_from_logits, CrossEntropyConfig, HiddenConfig,
};
use candle_core::{Device, Module, Result, Tensor, Var};
use candle_nn::Linear;
use std::time::Instant;

/// Deterministic values in `[-scale, scale)`.
fn values(count: usize, scale: f64, phase: f64) -> Vec<f32> {
    (0..count)
        .map(|i| (scale * (2.0 * ((i as f64 * 0.618_033_988_75 + phase) % 1.0) - 1.0)) as f32)
        .collect()
}

fn variants(vocab: usize) -> Vec<(&'static str, CrossEntropyConfig)> {
    let base = CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: 0.1,
        ..Default::default()
    };
    let with = |f: &dyn Fn(&mut CrossEntropyConfig)| {
        let mut cfg = base.clone();
        f(&mut cfg);
        cfg
    };
    // Class weights in [0.5, 1.5), deterministic.
    let weights: Vec<f64> = (0..vocab)
        .map(|v| 0.5 + (v as f64 * 0.618_033_988_75) % 1.0)
        .collect();
    vec![
        ("off", base.clone()),
        ("z_loss 1e-4", with(&|c| c.z_loss = 1e-4)),
        ("token_accuracy", with(&|c| c.token_accuracy = true)),
        ("softcap 30", with(&|c| c.softcap = Some(30.0))),
        (
            "class_weights",
            with(&|c| c.class_weights = Some(weights.clone().into())),
        ),
    ]
}

/// One forward + backward, the reported metrics read as a training loop that logs them would.
fn step(
    from_hidden: bool,
    hidden: &Var,
    proj: &Linear,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
) -> Result<()> {
    let out = if from_hidden {
        cross_entropy_from_hidden(
            hidden.as_tensor(),
            proj,
            targets,
            cfg,
            &HiddenConfig::default(),
        )?
    } else {
        let logits = proj.forward(hidden.as_tensor())?;
        cross_entropy_from_logits(&logits, targets, cfg)?
    };
    for metric in out.z_loss.iter().chain(&out.token_accuracy) {
        std::hint::black_box(metric.to_scalar::<f32>()?);
    }
    std::hint::black_box(out.loss.backward()?);
    Ok(())
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (batch, seq, dim, vocab, rounds) = if quick {
        (4, 32, 64, 2000, 3)
    } else {
        (16, 64, 256, 8000, 7)
    };
    let dev = Device::Cpu;
    let hidden = Var::from_tensor(&Tensor::from_vec(
        values(batch * seq * dim, 1.0, 0.1),
        (batch, seq, dim),
        &dev,
    )?)?;
    let weight = Tensor::from_vec(values(vocab * dim, 0.3, 0.4), (vocab, dim), &dev)?;
    let proj = Linear::new(
        weight,
        Some(Tensor::from_vec(values(vocab, 0.5, 0.7), vocab, &dev)?),
    );
    let ids: Vec<u32> = (0..batch * seq)
        .map(|i| {
            if i % 11 == 10 {
                0
            } else {
                ((i * 7919 + 13) % (vocab - 1) + 1) as u32
            }
        })
        .collect();
    let targets = Tensor::from_vec(ids, (batch, seq), &dev)?;
    println!(
        "ce_options: [B, S] = [{batch}, {seq}], D = {dim}, V = {vocab}, f32, pad every 11th, ε = 0.1, {} threads, {rounds} rounds alternated",
        rayon::current_num_threads()
    );
    let variants = variants(vocab);
    for from_hidden in [false, true] {
        let path = if from_hidden {
            "from hidden"
        } else {
            "from logits"
        };
        // Warm-up: every variant once.
        for (_, cfg) in &variants {
            step(from_hidden, &hidden, &proj, &targets, cfg)?;
        }
        let mut times = vec![Vec::with_capacity(rounds); variants.len()];
        for _ in 0..rounds {
            for (k, (_, cfg)) in variants.iter().enumerate() {
                let start = Instant::now();
                step(from_hidden, &hidden, &proj, &targets, cfg)?;
                times[k].push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        let median = |t: &mut Vec<f64>| {
            t.sort_by(f64::total_cmp);
            (t[t.len() / 2], t[0], t[t.len() - 1])
        };
        let off = median(&mut times[0].clone()).0;
        for ((name, _), t) in variants.iter().zip(&mut times) {
            let (m, lo, hi) = median(t);
            println!(
                "{path:<12} {name:<15} median {m:8.2} ms  (min {lo:8.2}, max {hi:8.2})  {:.3}× off",
                m / off
            );
        }
    }
    Ok(())
}
