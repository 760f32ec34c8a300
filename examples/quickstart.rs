//! Quickstart: the differentiable BLEU loss in three steps.
//!
//! 1. `-log BLEU` of logits against padded reference ids, with its statistics and gradient;
//! 2. one training loop with `cross-entropy + λ · BLEU loss` and `AdamW`, both losses from one
//!    fused pass over the logits (`ce_bleu_from_logits`);
//! 3. the data-parallel recipe: sum each worker's statistics (an all-reduce), score the sums
//!    with `loss_from_stats`, and get exactly the full-batch corpus loss.
//!
//! ```text
//! cargo run --release --example quickstart
//! cargo run --release --features cuda --example quickstart   # on CUDA device 0 (`-- --cpu`: CPU)
//! ```
//!
//! Take logits (`bleu_loss_from_logits` fuses the softmax), or probabilities from
//! `candle_nn::ops::softmax(x, D::Minus1)`: `candle_nn::ops::softmax_last_dim` has no backward
//! and would give no gradient at all.

use anyhow::Result;
use candle_bleu::loss::{
    bleu_loss_from_logits, ce_bleu_from_logits, loss_from_stats, BleuLossConfig, BleuStats,
    CrossEntropyConfig, References, TrainingLossConfig, TrainingTargets,
};
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use rand::{rngs::StdRng, Rng, SeedableRng};

const PAD: u32 = 0;

/// A seeded tensor of values uniform in `[-2, 2)`, on `device`.
fn uniform(rng: &mut StdRng, dims: &[usize], device: &Device) -> Result<Tensor> {
    let data: Vec<f32> = (0..dims.iter().product())
        .map(|_| rng.gen_range(-2.0..2.0))
        .collect();
    Ok(Tensor::from_vec(data, dims, device)?)
}

fn scalar(t: &Tensor) -> Result<f32> {
    Ok(t.to_scalar::<f32>()?)
}

fn main() -> Result<()> {
    // `--cpu`: the CPU even in a GPU build (the only flag); otherwise CUDA device 0 when the
    // binary was built with `cuda` and one is there.
    let device = if std::env::args().skip(1).any(|a| a == "--cpu") {
        Device::Cpu
    } else {
        Device::cuda_if_available(0)?
    };
    println!("device: {:?}", device.location());
    // With `cuda-unverified`: keep freed memory in the CUDA memory pool between steps (as
    // PyTorch's caching allocator does), said here rather than set silently.
    #[cfg(feature = "cuda-unverified")]
    if device.is_cuda() {
        let previous = candle_bleu::cuda_pool::set_pool_release_threshold(&device, u64::MAX)?;
        println!("CUDA memory pool: release threshold {previous} -> max");
    }
    let mut rng = StdRng::seed_from_u64(0);
    let (batch, seq, vocab) = (4, 6, 10);
    // References [B, R, T]: up to two per sentence; trailing PAD is padding, and a row of
    // padding only is no reference.
    let ref_ids = Tensor::new(
        &[
            [[1u32, 2, 3, 4, 5, 6], [1, 2, 3, 7, 0, 0]],
            [[8, 9, 2, 3, 4, 1], [0, 0, 0, 0, 0, 0]],
            [[5, 6, 7, 8, 9, 2], [5, 6, 7, 0, 0, 0]],
            [[3, 4, 5, 6, 1, 2], [0, 0, 0, 0, 0, 0]],
        ],
        &device,
    )?;
    let refs = References::from_ids(&ref_ids, PAD)?;
    let cfg = BleuLossConfig::default(); // 4-grams, Expected form, corpus BLEU, BLEU+1 smoothing

    // 1. Loss, statistics and gradient. `None`: every hypothesis has all `seq` positions.
    let logits = Var::from_tensor(&uniform(&mut rng, &[batch, seq, vocab], &device)?)?;
    let out = bleu_loss_from_logits(logits.as_tensor(), None, &refs, &cfg)?;
    let loss = scalar(&out.loss)?;
    println!(
        "loss = -log BLEU = {loss:.6}   soft BLEU = {:.2}",
        100.0 * (-loss).exp()
    );
    // The differentiable statistics: [B, N] soft clipped matches m_n and totals t_n, [B]
    // hypothesis and reference lengths.
    let (matches, totals) = (
        out.stats.matches.to_vec2::<f32>()?,
        out.stats.totals.to_vec2::<f32>()?,
    );
    println!(
        "sentence 0: matches {:.3?}  totals {:?}",
        matches[0], totals[0]
    );
    let grads = out.loss.backward()?;
    let norm = grads
        .get(&logits)
        .expect("a gradient")
        .sqr()?
        .sum_all()?
        .sqrt()?;
    println!("gradient norm = {:.6}", scalar(&norm)?);

    // 2. Training: a linear layer over fixed features, CE on the first reference + λ · BLEU.
    let features = uniform(&mut rng, &[batch, seq, 16], &device)?;
    let targets = ref_ids.narrow(1, 0, 1)?.squeeze(1)?; // first references, [B, S]
                                                        // PyTorch's `ignore_index`: padding positions add nothing to the cross-entropy.
    let ce_cfg = CrossEntropyConfig {
        pad_id: Some(PAD),
        label_smoothing: 0.0,
        ..Default::default()
    };
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let model = candle_nn::linear(16, vocab, vb)?;
    let params = ParamsAdamW {
        lr: 0.05,
        ..Default::default()
    };
    let mut opt = AdamW::new(varmap.all_vars(), params)?;
    // loss = CE + λ·BLEU with λ = 0.5; the BLEU side as configured above.
    let step_cfg = TrainingLossConfig {
        bleu_weight: 0.5,
        ce: ce_cfg,
        bleu: cfg.clone(),
    };
    for step in 0..=30 {
        let logits = model.forward(&features)?;
        // loss = CE + λ · (-log BLEU): the logits are read once, one gradient is written.
        let out = ce_bleu_from_logits(&logits, &TrainingTargets::new(&targets, &refs), &step_cfg)?;
        opt.backward_step(&out.loss)?;
        if step % 10 == 0 {
            let (ce, bleu) = (scalar(&out.cross_entropy)?, scalar(&out.bleu.loss)?);
            println!("step {step:2}: cross-entropy {ce:.4}  -log BLEU {bleu:.4}");
        }
    }

    // 3. Data parallel: each worker sums its shard's statistics, the sums are all-reduced
    //    (here: added), and every worker scores the same totals with `loss_from_stats`.
    //    The corpus loss depends on the batch only through these sums.
    let logits = Var::from_tensor(&uniform(&mut rng, &[batch, seq, vocab], &device)?)?;
    let full = bleu_loss_from_logits(logits.as_tensor(), None, &refs, &cfg)?;
    let worker = |start: usize, len: usize| -> Result<BleuStats> {
        let shard_refs = References::from_ids(&ref_ids.narrow(0, start, len)?, PAD)?;
        let shard = logits.as_tensor().narrow(0, start, len)?;
        let s = bleu_loss_from_logits(&shard, None, &shard_refs, &cfg)?.stats;
        Ok(BleuStats {
            matches: s.matches.sum_keepdim(0)?,
            totals: s.totals.sum_keepdim(0)?,
            hyp_len: s.hyp_len.sum_keepdim(0)?,
            ref_len: s.ref_len.sum_keepdim(0)?,
        })
    };
    let all_reduce = |a: &BleuStats, b: &BleuStats| -> candle_core::Result<BleuStats> {
        Ok(BleuStats {
            matches: (&a.matches + &b.matches)?,
            totals: (&a.totals + &b.totals)?,
            hyp_len: (&a.hyp_len + &b.hyp_len)?,
            ref_len: (&a.ref_len + &b.ref_len)?,
        })
    };
    let (w0, w1) = (worker(0, 2)?, worker(2, 2)?);
    let reduced = scalar(&loss_from_stats(&all_reduce(&w0, &w1)?, &cfg)?)?;
    let full_loss = scalar(&full.loss)?;
    println!("data parallel: all-reduced loss {reduced:.6}, full-batch loss {full_loss:.6}");
    assert!((reduced - full_loss).abs() <= 1e-6 * full_loss.abs().max(1.0));
    // Gradients: worker 0 receives the other shard's sums as constants (detached) and
    // backpropagates into its own shard only: its slice of the full-batch gradient.
    let w1_detached = BleuStats {
        matches: w1.matches.detach(),
        totals: w1.totals.detach(),
        hyp_len: w1.hyp_len.detach(),
        ref_len: w1.ref_len.detach(),
    };
    let worker_loss = loss_from_stats(&all_reduce(&w0, &w1_detached)?, &cfg)?;
    let shard0_grad = |loss: &Tensor| -> Result<Tensor> {
        Ok(loss
            .backward()?
            .get(&logits)
            .expect("a gradient")
            .narrow(0, 0, 2)?)
    };
    let diff = (shard0_grad(&worker_loss)? - shard0_grad(&full.loss)?)?;
    let diff = scalar(&diff.abs()?.max_all()?)?;
    println!("data parallel: worker 0 gradient vs full-batch gradient, max abs diff {diff:.2e}");
    assert!(diff <= 1e-6);
    Ok(())
}
