//! Twenty forward + backward calls of one fused loss at a small shape, for an instruction count under
//! `valgrind --tool=callgrind` (repeatable on a shared machine, where wall times swing by ±30 %):
//! compare two builds of the crate, e.g. before and after a restructuring.
//!
//! ```text
//! cargo bench --no-run --bench callgrind
//! RAYON_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file=cg.out \
//!     target/release/deps/callgrind-<hash> expected
//! callgrind_annotate cg.out | head
//! ```
//!
//! The argument picks the call: `cross_entropy` (`cross_entropy_sum`, `cross_entropy_none`: the
//! other reductions; `cross_entropy_z`: with the z-loss, λ = 1e-4, and its value;
//! `cross_entropy_accuracy`: with the token accuracy; `cross_entropy_softcap`: logits capped at
//! 30), `expected`, `lower_bound`, `paired` (from logits), `hidden_cross_entropy` (and
//! `hidden_cross_entropy_softcap`, `hidden_cross_entropy_accuracy`), `hidden_expected` (from
//! hidden states `[4, 16, 64]`).

use candle_bleu::loss::{
    bleu_loss_from_hidden, bleu_loss_from_logits, cross_entropy_from_hidden,
    cross_entropy_from_logits, BleuLossConfig, CrossEntropyConfig, CrossEntropyReduction, Form,
    HiddenConfig, References,
};
use candle_core::{Device, Result, Tensor, Var};

/// Forward + backward calls per run.
const CALLS: usize = 20;

fn main() -> Result<()> {
    let which = std::env::args().nth(1).unwrap_or_else(|| "expected".into());
    let dev = Device::Cpu;
    let (batch, seq, refs_len, vocab) = (4, 16, 16, 2000);
    // Deterministic logits (the same in every build), in [-2, 2).
    let values: Vec<f32> = (0..batch * seq * vocab)
        .map(|i| 4.0 * ((i as f64 * 0.618_033_988_75) % 1.0) as f32 - 2.0)
        .collect();
    let logits = Var::from_tensor(&Tensor::from_vec(values, (batch, seq, vocab), &dev)?)?;
    let ids: Vec<u32> = (0..batch * refs_len)
        .map(|i| ((i * 7919 + 13) % (vocab - 1) + 1) as u32)
        .collect();
    let targets = Tensor::from_vec(ids, (batch, refs_len), &dev)?;
    let refs = References::from_ids(&targets, 0)?;
    if let Some(hidden_which) = which.strip_prefix("hidden_") {
        let hidden = Var::from_tensor(&Tensor::from_vec(
            (0..batch * seq * 64)
                .map(|i| 2.0 * ((i as f64 * 0.754_877_666) % 1.0) as f32 - 1.0)
                .collect::<Vec<f32>>(),
            (batch, seq, 64),
            &dev,
        )?)?;
        let weight = Var::from_tensor(&Tensor::from_vec(
            (0..vocab * 64)
                .map(|i| 0.5 * ((i as f64 * 0.569_840_29) % 1.0) as f32 - 0.25)
                .collect::<Vec<f32>>(),
            (vocab, 64),
            &dev,
        )?)?;
        let proj = candle_nn::Linear::new(weight.as_tensor().clone(), None);
        let hidden = hidden.as_tensor().clone();
        // `hidden_cross_entropy_softcap`, `hidden_cross_entropy_accuracy`: with an option on.
        let hidden_ce = CrossEntropyConfig {
            softcap: (hidden_which == "cross_entropy_softcap").then_some(30.0),
            token_accuracy: hidden_which == "cross_entropy_accuracy",
            ..Default::default()
        };
        for _ in 0..CALLS {
            let loss = if hidden_which.starts_with("cross_entropy") {
                let blocks = HiddenConfig::default();
                let out = cross_entropy_from_hidden(&hidden, &proj, &targets, &hidden_ce, &blocks)?;
                if let Some(metric) = &out.token_accuracy {
                    std::hint::black_box(metric.to_scalar::<f32>()?);
                }
                out.loss
            } else {
                let (cfg, blocks) = (BleuLossConfig::default(), HiddenConfig::default());
                bleu_loss_from_hidden(&hidden, &proj, None, &refs, &cfg, &blocks)?.loss
            };
            loss.backward()?;
        }
        println!("{which}: done");
        return Ok(());
    }
    let form = match which.as_str() {
        "lower_bound" => Form::LowerBound,
        "paired" => Form::Paired,
        _ => Form::Expected,
    };
    // `cross_entropy_sum` and `cross_entropy_none`: the same pass with another reduction (the
    // per-position losses summed for the backward).
    let ce_cfg = CrossEntropyConfig {
        reduction: match which.as_str() {
            "cross_entropy_sum" => CrossEntropyReduction::Sum,
            "cross_entropy_none" => CrossEntropyReduction::None,
            _ => CrossEntropyReduction::Mean,
        },
        z_loss: if which == "cross_entropy_z" {
            1e-4
        } else {
            0.0
        },
        token_accuracy: which == "cross_entropy_accuracy",
        softcap: (which == "cross_entropy_softcap").then_some(30.0),
        ..Default::default()
    };
    let cross_entropy = |logits: &Tensor| -> Result<Tensor> {
        let out = cross_entropy_from_logits(logits, &targets, &ce_cfg)?;
        // What the call reports besides is read, as a training loop that logs it would.
        for metric in out.z_loss.iter().chain(&out.token_accuracy) {
            std::hint::black_box(metric.sum_all()?.to_scalar::<f32>()?);
        }
        let loss = out.loss;
        if loss.rank() == 0 {
            Ok(loss)
        } else {
            loss.sum_all()
        }
    };
    let is_ce = which.starts_with("cross_entropy");
    // The calls repeat so that they, not the setup, make the count.
    for _ in 0..CALLS - 1 {
        let loss = if is_ce {
            cross_entropy(logits.as_tensor())?
        } else {
            let cfg = BleuLossConfig {
                form,
                ..Default::default()
            };
            bleu_loss_from_logits(logits.as_tensor(), None, &refs, &cfg)?.loss
        };
        loss.backward()?;
    }
    let loss = if is_ce {
        cross_entropy(logits.as_tensor())?
    } else {
        let cfg = BleuLossConfig {
            form,
            ..Default::default()
        };
        bleu_loss_from_logits(logits.as_tensor(), None, &refs, &cfg)?.loss
    };
    let grads = loss.backward()?;
    let grad = grads.get(logits.as_tensor()).expect("a gradient");
    println!(
        "{which}: loss {}, |grad| {}",
        loss.to_scalar::<f32>()?,
        grad.sqr()?.sum_all()?.to_scalar::<f32>()?
    );
    Ok(())
}
