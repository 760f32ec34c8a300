//! Bit-level fingerprints of the loss: the values and gradients of every entry point over a grid
//! of configurations, hashed, one line per case. Run it before and after a change that must not
//! move a bit (a restructuring, a moved module), on the same machine and thread count, and
//! compare the outputs (`diff`): equal lines mean equal bits.
//!
//! ```text
//! cargo run --release --example fingerprint > before.txt      # on the old commit
//! cargo run --release --example fingerprint > after.txt       # on the new one
//! diff before.txt after.txt && echo bit-identical
//! ```
//!
//! A change allowed to move rounding (a faster matrix product, say) is checked by value instead:
//! `--values FILE` also writes every loss and gradient element, one tensor per line, and
//! `--compare BEFORE AFTER` prints, per dtype, the largest difference of any tensor relative
//! to its largest magnitude (`max |a − b| / max |a|`).
//!
//! ```text
//! cargo run --release --example fingerprint -- --values before.values > before.txt
//! cargo run --release --example fingerprint -- --values after.values > after.txt
//! cargo run --release --example fingerprint -- --compare before.values after.values
//! ```
//!
//! The grid: f32 and f64; the CPU kernels and the composed candle-op references
//! (`*_composed`); `bleu_loss` on probabilities and `bleu_loss_from_logits` for every form
//! × length model × reduction × smoothing, with id references (one and two per element) and
//! with matrix references; `cross_entropy_from_logits` and `ce_bleu_from_logits` with padding and
//! label smoothing; `cross_entropy_from_hidden`, `bleu_loss_from_hidden` and
//! `ce_bleu_from_hidden` in one block and in several (their kernels only: the composed blocks have
//! no public entry point and are compared with the kernels by the crate's unit tests), with the
//! gradients of the hidden states, the weight and the bias; `loss_from_stats`. Each line hashes the exact bits (FNV-1a over
//! `to_bits`) of the loss and every gradient.

use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_hidden, bleu_loss_from_logits, bleu_loss_from_logits_composed,
    ce_bleu_from_hidden, ce_bleu_from_logits, ce_bleu_from_logits_composed,
    cross_entropy_from_hidden, cross_entropy_from_logits, cross_entropy_from_logits_composed,
    loss_from_stats, BleuLossConfig, BleuLossOutput, CrossEntropyConfig, CrossEntropyOutput, Form,
    HiddenConfig, LengthModel, LossSmoothing, Reduction, References, TrainingLoss,
    TrainingLossConfig, TrainingTargets,
};
use candle_core::{DType, Device, Result, Tensor, Var, D};
use candle_nn::Linear;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::Mutex;

const PAD: u32 = 0;
const EOS: u32 = 2;
const BATCH: usize = 3;
const SEQ: usize = 7;
const VOCAB: usize = 11;
const DIM: usize = 6;

/// FNV-1a over the bits of every value of `tensors`, in order.
fn fingerprint(name: &str, tensors: &[&Tensor]) -> Result<u64> {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bits: u64| {
        for byte in bits.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    let mut values = VALUES.lock().expect("values file lock");
    for (k, t) in tensors.iter().enumerate() {
        let flat = t.flatten_all()?;
        let as_f64: Vec<f64> = match t.dtype() {
            DType::F64 => {
                let v = flat.to_vec1::<f64>()?;
                v.iter().for_each(|v| eat(v.to_bits()));
                v
            }
            _ => {
                let v = flat.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                v.iter().for_each(|v| eat(u64::from(v.to_bits())));
                v.into_iter().map(f64::from).collect()
            }
        };
        if let Some(file) = values.as_mut() {
            write!(file, "{name}#{k}\t{:?}", t.dtype())?;
            for v in as_f64 {
                write!(file, " {v:?}")?;
            }
            writeln!(file)?;
        }
    }
    Ok(hash)
}

/// Where `--values` writes every tensor (`None`: hashes only).
static VALUES: Mutex<Option<BufWriter<File>>> = Mutex::new(None);

/// `--compare BEFORE AFTER`: per dtype, the largest `max |a − b| / max |a|` over the tensors
/// both files hold, with the tensor it came from.
fn compare_values(before: &str, after: &str) -> Result<()> {
    let read = |path: &str| -> Result<HashMap<String, (String, Vec<f64>)>> {
        let text = std::fs::read_to_string(path)?;
        let mut out = HashMap::new();
        for line in text.lines() {
            let (key, rest) = line
                .split_once('\t')
                .ok_or_else(|| candle_core::Error::Msg(format!("{path}: no tab in {line:.60}")))?;
            let mut fields = rest.split(' ');
            let dtype = fields.next().unwrap_or_default().to_string();
            let values = fields
                .map(str::parse::<f64>)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| candle_core::Error::Msg(format!("{path}: {e}")))?;
            out.insert(key.to_string(), (dtype, values));
        }
        Ok(out)
    };
    let (a, b) = (read(before)?, read(after)?);
    let mut worst: BTreeMap<String, (f64, String)> = BTreeMap::new();
    let (mut compared, mut differing) = (0usize, 0usize);
    for (key, (dtype, va)) in &a {
        let Some((_, vb)) = b.get(key) else { continue };
        if va.len() != vb.len() {
            return Err(candle_core::Error::Msg(format!(
                "{key}: {} values before, {} after",
                va.len(),
                vb.len()
            )));
        }
        compared += 1;
        let scale = va.iter().fold(0f64, |m, v| m.max(v.abs()));
        // A value that is NaN on one side only, or infinite differently, counts as an
        // infinite difference (`f64::max` would drop the NaN); equal bits count as none.
        let diff = va.iter().zip(vb).fold(0f64, |m, (x, y)| {
            let d = if x.to_bits() == y.to_bits() {
                0.0
            } else if x.is_finite() && y.is_finite() {
                (x - y).abs()
            } else {
                f64::INFINITY
            };
            m.max(d)
        });
        if diff > 0.0 {
            differing += 1;
        }
        let rel = if scale > 0.0 { diff / scale } else { diff };
        let entry = worst.entry(dtype.clone()).or_insert((0.0, String::new()));
        if rel > entry.0 {
            *entry = (rel, key.clone());
        }
    }
    println!(
        "{compared} tensors compared ({} only before, {} only after), {differing} differ",
        a.len() - compared,
        b.len() - compared
    );
    for (dtype, (rel, key)) in worst {
        println!("{dtype}: largest max|a-b|/max|a| = {rel:.3e} ({key})");
    }
    Ok(())
}

/// Deterministic values in `[-scale, scale)` (a low-discrepancy sequence).
fn values(count: usize, scale: f64, phase: f64) -> Vec<f64> {
    (0..count)
        .map(|i| scale * (((i as f64 + phase) * 0.618_033_988_749).fract() * 2.0 - 1.0))
        .collect()
}

fn tensor(count_shape: &[usize], scale: f64, phase: f64, dtype: DType) -> Result<Tensor> {
    let count = count_shape.iter().product();
    Tensor::from_vec(values(count, scale, phase), count_shape, &Device::Cpu)?.to_dtype(dtype)
}

/// Every BLEU loss configuration the grid covers.
fn configs() -> Vec<(String, BleuLossConfig)> {
    let mut out = Vec::new();
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        for length in [
            LengthModel::Given,
            LengthModel::NotEos { eos_id: EOS },
            LengthModel::SoftEos { eos_id: EOS },
        ] {
            for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
                for smoothing in [LossSmoothing::None, LossSmoothing::AddK(1.0)] {
                    let cfg = BleuLossConfig {
                        form,
                        length,
                        reduction,
                        smoothing,
                        ..Default::default()
                    };
                    let name = format!("{form:?}/{length:?}/{reduction:?}/{smoothing:?}");
                    out.push((name, cfg));
                }
            }
        }
    }
    out
}

/// Prints `name hash` for the loss of `f(x)` and its gradient with respect to `x`.
fn case(name: &str, x: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<()> {
    let var = Var::from_tensor(x)?;
    let line = match f(var.as_tensor()) {
        Ok(loss) => {
            let grads = loss.backward()?;
            let grad = grads.get(var.as_tensor()).cloned();
            let mut parts = vec![&loss];
            if let Some(g) = &grad {
                parts.push(g);
            }
            format!("{:016x}", fingerprint(name, &parts)?)
        }
        Err(e) => format!(
            "error: {}",
            e.to_string().lines().next().unwrap_or_default()
        ),
    };
    println!("{name} {line}");
    Ok(())
}

/// The entry points of one path: the fused kernels or their composed references.
struct Entry {
    name: &'static str,
    bleu_loss_from_logits:
        fn(&Tensor, Option<&Tensor>, &References, &BleuLossConfig) -> Result<BleuLossOutput>,
    cross_entropy_from_logits:
        fn(&Tensor, &Tensor, &CrossEntropyConfig) -> Result<CrossEntropyOutput>,
    ce_bleu_from_logits: fn(&Tensor, &TrainingTargets, &TrainingLossConfig) -> Result<TrainingLoss>,
}

fn run_grid(entry: &Entry, dtype: DType) -> Result<()> {
    let path = entry.name;
    let tag = format!("{path}/{dtype:?}");
    let logits = tensor(&[BATCH, SEQ, VOCAB], 2.5, 0.3, dtype)?;
    let one_ref = Tensor::new(
        &[
            [3u32, 4, 5, 3, 4, 2, 0],
            [6, 7, 6, 7, 8, 9, 2],
            [10, 3, 2, 0, 0, 0, 0],
        ],
        &Device::Cpu,
    )?;
    let two_refs = Tensor::new(
        &[
            [[3u32, 4, 5, 3, 2, 0], [4, 5, 3, 4, 2, 0]],
            [[6, 7, 8, 9, 2, 0], [7, 6, 9, 8, 7, 2]],
            [[10, 3, 2, 0, 0, 0], [3, 10, 10, 2, 0, 0]],
        ],
        &Device::Cpu,
    )?;
    let matrices =
        candle_nn::ops::softmax(&tensor(&[BATCH, 5, VOCAB], 4.0, 0.7, dtype)?, D::Minus1)?;
    let matrix_lengths = Tensor::new(&[5u32, 4, 3], &Device::Cpu)?;
    let hyp_lengths = Tensor::new(&[7u32, 5, 3], &Device::Cpu)?;
    let references = [
        ("ids1", References::from_ids(&one_ref, PAD)?),
        ("ids2", References::from_ids(&two_refs, PAD)?),
        (
            "matrices",
            References::from_matrices(&matrices, &matrix_lengths)?,
        ),
    ];
    for (refs_name, refs) in &references {
        for (cfg_name, cfg) in configs() {
            let lengths = match cfg.length {
                LengthModel::SoftEos { .. } => None,
                _ => Some(&hyp_lengths),
            };
            case(
                &format!("{tag}/bleu_loss/{refs_name}/{cfg_name}"),
                &logits,
                |x| {
                    Ok(
                        bleu_loss(&candle_nn::ops::softmax(x, D::Minus1)?, lengths, refs, &cfg)?
                            .loss,
                    )
                },
            )?;
            case(
                &format!("{tag}/bleu_loss_from_logits/{refs_name}/{cfg_name}"),
                &logits,
                |x| Ok((entry.bleu_loss_from_logits)(x, lengths, refs, &cfg)?.loss),
            )?;
        }
    }
    // The cross-entropy and the training loss, with padding and label smoothing.
    let targets = one_ref.clone();
    for (ce_name, ce) in [
        ("plain", CrossEntropyConfig::default()),
        (
            "pad+ls",
            CrossEntropyConfig {
                pad_id: Some(PAD),
                label_smoothing: 0.1,
                ..Default::default()
            },
        ),
    ] {
        case(&format!("{tag}/cross_entropy/{ce_name}"), &logits, |x| {
            (entry.cross_entropy_from_logits)(x, &targets, &ce).map(|o| o.loss)
        })?;
        for (refs_name, refs) in &references[..2] {
            for form in [Form::Expected, Form::Paired, Form::LowerBound] {
                let cfg = TrainingLossConfig {
                    bleu_weight: 0.3,
                    ce: ce.clone(),
                    bleu: BleuLossConfig {
                        form,
                        ..Default::default()
                    },
                };
                case(
                    &format!("{tag}/ce_bleu/{ce_name}/{refs_name}/{form:?}"),
                    &logits,
                    |x| {
                        let step_targets =
                            TrainingTargets::new(&targets, refs).with_hyp_lengths(&hyp_lengths);
                        Ok((entry.ce_bleu_from_logits)(x, &step_targets, &cfg)?.loss)
                    },
                )?;
            }
        }
    }
    // The hidden-state entry points: gradients of the hidden states, the weight and the bias.
    if path == "kernels" {
        hidden_grid(&tag, &references[0].1, &targets, &hyp_lengths, dtype)?;
    }
    // The score of given statistics.
    let stats =
        bleu_loss_from_logits(&logits, None, &references[1].1, &BleuLossConfig::default())?.stats;
    for (cfg_name, cfg) in configs() {
        let name = format!("{tag}/loss_from_stats/{cfg_name}");
        let line = format!(
            "{:016x}",
            fingerprint(&name, &[&loss_from_stats(&stats, &cfg)?])?
        );
        println!("{name} {line}");
    }
    Ok(())
}

fn hidden_grid(
    tag: &str,
    refs: &References,
    targets: &Tensor,
    hyp_lengths: &Tensor,
    dtype: DType,
) -> Result<()> {
    let hidden = tensor(&[BATCH, SEQ, DIM], 1.5, 0.1, dtype)?;
    let weight = tensor(&[VOCAB, DIM], 1.0, 0.5, dtype)?;
    let bias = tensor(&[VOCAB], 0.5, 0.9, dtype)?;
    for (block_name, block_elements) in [
        ("one-block", HiddenConfig::DEFAULT_BLOCK_ELEMENTS),
        ("blocks", 2 * VOCAB),
    ] {
        let hidden_cfg = HiddenConfig {
            block_elements,
            ..Default::default()
        };
        for form in [Form::Expected, Form::Paired, Form::LowerBound] {
            let h = Var::from_tensor(&hidden)?;
            let w = Var::from_tensor(&weight)?;
            let b = Var::from_tensor(&bias)?;
            let proj = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
            let bleu = BleuLossConfig {
                form,
                ..Default::default()
            };
            let cfg = TrainingLossConfig {
                bleu_weight: 0.3,
                ce: CrossEntropyConfig {
                    pad_id: Some(PAD),
                    label_smoothing: 0.1,
                    ..Default::default()
                },
                bleu: bleu.clone(),
            };
            let step_targets = TrainingTargets::new(targets, refs).with_hyp_lengths(hyp_lengths);
            let blocks = &hidden_cfg;
            let hs = h.as_tensor();
            let results = [
                (
                    "ce_bleu_from_hidden",
                    ce_bleu_from_hidden(hs, &proj, &step_targets, &cfg, blocks).map(|o| o.loss),
                ),
                (
                    "bleu_loss_from_hidden",
                    bleu_loss_from_hidden(hs, &proj, Some(hyp_lengths), refs, &bleu, blocks)
                        .map(|o| o.loss),
                ),
                (
                    "cross_entropy_from_hidden",
                    cross_entropy_from_hidden(hs, &proj, targets, &cfg.ce, blocks).map(|o| o.loss),
                ),
            ];
            for (name, loss) in results {
                let line = match loss {
                    Ok(loss) => {
                        let grads = loss.backward()?;
                        let mut parts = vec![loss.clone()];
                        for v in [&h, &w, &b] {
                            if let Some(g) = grads.get(v.as_tensor()) {
                                parts.push(g.clone());
                            }
                        }
                        let refs: Vec<&Tensor> = parts.iter().collect();
                        let name = format!("{tag}/{name}/{block_name}/{form:?}");
                        format!("{:016x}", fingerprint(&name, &refs)?)
                    }
                    Err(e) => format!(
                        "error: {}",
                        e.to_string().lines().next().unwrap_or_default()
                    ),
                };
                println!("{tag}/{name}/{block_name}/{form:?} {line}");
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => {}
        ["--values", path] => {
            *VALUES.lock().expect("values file lock") = Some(BufWriter::new(File::create(path)?));
        }
        ["--compare", before, after] => return compare_values(before, after),
        _ => {
            return Err(candle_core::Error::Msg(
                "usage: fingerprint [--values FILE | --compare BEFORE AFTER]".into(),
            ))
        }
    }
    let kernels = Entry {
        name: "kernels",
        bleu_loss_from_logits,
        cross_entropy_from_logits,
        ce_bleu_from_logits,
    };
    let composed = Entry {
        name: "composed",
        bleu_loss_from_logits: bleu_loss_from_logits_composed,
        cross_entropy_from_logits: cross_entropy_from_logits_composed,
        ce_bleu_from_logits: ce_bleu_from_logits_composed,
    };
    for dtype in [DType::F32, DType::F64] {
        run_grid(&kernels, dtype)?;
        run_grid(&composed, dtype)?;
    }
    if let Some(file) = VALUES.lock().expect("values file lock").as_mut() {
        file.flush()?;
    }
    Ok(())
}
