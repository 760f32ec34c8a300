//! Pieces of a training loop the examples share: the learning-rate schedule, the optimiser,
//! checkpoints of a `VarMap` in memory, step timing, and the log and partial results a study
//! writes as it goes.

use anyhow::{bail, Result};
use candle_core::Tensor;
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarMap};
use std::fmt::Write as _;
use std::path::Path;

/// The learning rate at `step` (0-based): a linear warm-up over `warmup` steps to `peak`,
/// then a cosine decay to 10 % of `peak` at step `total`.
///
/// ```
/// use candle_bleu_research::train::learning_rate;
/// let close = |a: f64, b: f64| (a - b).abs() < 1e-15;
/// assert!(close(learning_rate(1e-3, 10, 110, 4), 5e-4)); // warm-up: (4 + 1) / 10 of the peak
/// assert!(close(learning_rate(1e-3, 10, 110, 10), 1e-3)); // the peak after the warm-up
/// assert!(close(learning_rate(1e-3, 10, 110, 60), 5.5e-4)); // halfway down the cosine
/// assert!(close(learning_rate(1e-3, 10, 110, 110), 1e-4)); // 10 % at the end
/// ```
pub fn learning_rate(peak: f64, warmup: usize, total: usize, step: usize) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let progress = (step - warmup) as f64 / total.saturating_sub(warmup).max(1) as f64;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
}

/// AdamW over every variable of `varmap` with learning rate `lr` and weight decay 0.01
/// (the examples' optimiser; its learning rate is set per step with `set_learning_rate`).
pub fn adamw(varmap: &VarMap, lr: f64) -> Result<AdamW> {
    Ok(AdamW::new(
        varmap.all_vars(),
        ParamsAdamW {
            lr,
            weight_decay: 0.01,
            ..Default::default()
        },
    )?)
}

/// An in-memory copy of every variable's value, by name.
pub type Snapshot = Vec<(String, Tensor)>;

/// A copy of every variable's value.
pub fn snapshot(varmap: &VarMap) -> Result<Snapshot> {
    let Ok(data) = varmap.data().lock() else {
        bail!("snapshot: the VarMap's lock is poisoned");
    };
    data.iter()
        .map(|(name, var)| Ok((name.clone(), var.as_tensor().copy()?)))
        .collect()
}

/// Sets every variable to its value in `snapshot`. Errors: a name the model does not have, a
/// shape or dtype that does not match.
pub fn restore(varmap: &VarMap, snapshot: &[(String, Tensor)]) -> Result<()> {
    let Ok(data) = varmap.data().lock() else {
        bail!("restore: the VarMap's lock is poisoned");
    };
    for (name, value) in snapshot {
        match data.get(name) {
            Some(var) => var.set(value)?,
            None => bail!("restore: the model has no variable `{name}`"),
        }
    }
    Ok(())
}

/// CPU seconds used by this process so far (all threads), where the platform tells; `NaN`
/// elsewhere. On a shared machine a step's CPU time is a steadier measure than its wall time.
pub fn process_cpu_s() -> f64 {
    #[cfg(target_os = "linux")]
    {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec for the duration of the call.
        if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) } == 0 {
            return now.tv_sec as f64 + 1e-9 * now.tv_nsec as f64;
        }
    }
    f64::NAN
}

/// Mean seconds of one training step (forward, backward, update; evaluation excluded).
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTime {
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Process CPU time (all threads), [`process_cpu_s`].
    pub cpu_s: f64,
}

/// One row of a study's `log.csv`: the training losses averaged since the previous row, and the
/// dev BLEU at this step.
#[derive(Debug, Clone)]
pub struct LogRow {
    /// The global training step (warm-up steps included).
    pub step: usize,
    /// Training cross-entropy (label-smoothed where the study smooths).
    pub ce_loss: f64,
    /// Teacher-forced `-log BLEU` of the training batches (the example says which form and
    /// length model), the same yardstick whatever the objective optimises.
    pub bleu_loss: f64,
    /// Dev BLEU (greedy decoding, 0–100) at this step.
    pub dev_bleu: f64,
}

/// The `log.csv` of finished runs, given as `(objective, seed, rows)`: the header
/// `step,objective,seed,ce_loss,bleu_loss,dev_bleu`, then one line a row, losses to 6 decimals
/// and BLEU to 4.
///
/// ```
/// use candle_bleu_research::train::{log_csv, LogRow};
/// let rows = [LogRow { step: 100, ce_loss: 2.5, bleu_loss: 1.25, dev_bleu: 30.125 }];
/// assert_eq!(
///     log_csv([("ce", 1, &rows[..])]),
///     "step,objective,seed,ce_loss,bleu_loss,dev_bleu\n100,ce,1,2.500000,1.250000,30.1250\n"
/// );
/// ```
pub fn log_csv<'a>(runs: impl IntoIterator<Item = (&'a str, u64, &'a [LogRow])>) -> String {
    let mut csv = String::from("step,objective,seed,ce_loss,bleu_loss,dev_bleu\n");
    for (objective, seed, rows) in runs {
        for row in rows {
            // Writing to a String cannot fail.
            let _ = writeln!(
                csv,
                "{},{objective},{seed},{:.6},{:.6},{:.4}",
                row.step, row.ce_loss, row.bleu_loss, row.dev_bleu
            );
        }
    }
    csv
}

/// Rewrites `dir/results.json` as `{"partial": true, "runs": runs}`: the runs a study has
/// finished so far, so that an interrupted study leaves its finished runs behind.
pub fn write_partial_results(dir: &Path, runs: &[serde_json::Value]) -> Result<()> {
    let partial = serde_json::json!({"partial": true, "runs": runs});
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&partial)?,
    )?;
    Ok(())
}

/// What every run of a synthetic study (the `seq2seq` and `study` examples) trains with: the
/// study's settings `C` (its `TrainConfig`), its encoded corpus and the device — the same for
/// each objective and seed.
pub struct TrainingContext<'a, C> {
    /// The study's training settings.
    pub cfg: &'a C,
    /// The encoded train, dev and test splits.
    pub data: &'a crate::data::EncodedCorpus,
    /// Where the models train.
    pub device: &'a candle_core::Device,
}

/// One teacher-forced step's inputs on a synthetic task (the `seq2seq` and `study` examples):
/// the next batch of `batches` from `data.train`, encoded and decoded with `dropout`. Returns
/// the batch's examples, the batch and the decoder's logits `[B, S, V]`.
pub fn teacher_forced_logits<'d>(
    model: &crate::model::transformer::Transformer,
    data: &'d crate::data::EncodedCorpus,
    batches: &mut crate::data::Batches,
    dropout: &mut crate::model::transformer::Dropout,
    device: &candle_core::Device,
) -> Result<(Vec<&'d crate::data::Encoded>, crate::data::Batch, Tensor)> {
    let examples: Vec<&crate::data::Encoded> = batches
        .next_indices()
        .into_iter()
        .map(|i| &data.train[i])
        .collect();
    let batch = crate::data::make_batch(&examples, device)?;
    let memory = model.encode(&batch.src, crate::data::PAD, Some(dropout))?;
    let logits = model.logits(&model.decode(&batch.dec_in, &memory, Some(dropout))?)?;
    Ok((examples, batch, logits))
}

/// What the synthetic studies record of a run's selected checkpoint in `results.json`.
pub struct SelectedRun<'a> {
    /// The objective's name.
    pub objective: &'a str,
    /// The objective's name in file names.
    pub slug: &'a str,
    /// The seed.
    pub seed: u64,
    /// Dev BLEU of the selected checkpoint.
    pub dev_bleu: f64,
    /// Its step.
    pub selected_step: usize,
    /// Dev BLEU at the last step.
    pub last_dev_bleu: f64,
    /// Test BLEU of the selected checkpoint (greedy).
    pub test_bleu: f64,
    /// Its test outputs, tokens per segment.
    pub test_hyps: &'a [Vec<String>],
    /// The run's training and evaluation, seconds.
    pub wall_s: f64,
}

/// Writes `run`'s test outputs as `out/test.<slug>.seed<k>.hyp` and returns its
/// `results.json` fields: objective, seed, dev and test BLEU, the selected step, the output
/// and reference files (relative to `out`) and the BLEU signature; a study adds its own.
pub fn selected_run_json(
    run: &SelectedRun,
    out: &Path,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let hyp_name = format!("test.{}.seed{}.hyp", run.slug, run.seed);
    crate::data::tokens::write_lines(&out.join(&hyp_name), run.test_hyps)?;
    let record = serde_json::json!({
        "objective": run.objective,
        "seed": run.seed,
        "dev_bleu": run.dev_bleu,
        "selected_step": run.selected_step,
        "last_dev_bleu": run.last_dev_bleu,
        "test_bleu": run.test_bleu,
        "test_hyp": hyp_name,
        "test_ref": "test.ref",
        "signature": crate::eval::BLEU_SIGNATURE_TOK_NONE,
        "wall_s": run.wall_s,
    });
    match record {
        serde_json::Value::Object(map) => Ok(map),
        _ => bail!("internal: a run record is an object"),
    }
}
