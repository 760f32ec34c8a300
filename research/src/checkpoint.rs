//! A run's checkpoint: the model's variables, the optimizer's moments and a small JSON state,
//! written atomically (to a temporary file, then renamed) so an interruption never leaves a
//! half-written checkpoint behind.

use anyhow::{Context, Result};
use candle_nn::VarMap;
use serde::{de::DeserializeOwned, Serialize};
use std::path::{Path, PathBuf};

use crate::optim::AdamW;

/// Writes `bytes` to `path` via a temporary sibling and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temporary(path);
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Saves `varmap` as safetensors at `path`, atomically.
pub fn save_vars(varmap: &VarMap, path: &Path) -> Result<()> {
    let tmp = temporary(path);
    varmap
        .save(&tmp)
        .with_context(|| format!("saving {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// Loads `path` into the variables of `varmap` (every variable must be present).
pub fn load_vars(varmap: &mut VarMap, path: &Path) -> Result<()> {
    varmap
        .load(path)
        .with_context(|| format!("loading {}", path.display()))
}

/// The weights kept after the dev evaluation at `step` (`ckpt-<step>.safetensors` in the run's
/// directory), for checkpoint averaging.
pub fn step_checkpoint(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!("ckpt-{step:07}.safetensors"))
}

/// The kept step checkpoints of the run in `dir` ([`step_checkpoint`]), by step, ascending.
pub fn step_checkpoints(dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let mut kept = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(kept),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if let Some(step) = name
            .strip_prefix("ckpt-")
            .and_then(|rest| rest.strip_suffix(".safetensors"))
            .and_then(|digits| digits.parse::<usize>().ok())
        {
            kept.push((step, path));
        }
    }
    kept.sort();
    Ok(kept)
}

/// Keeps the weights in `varmap` as the step checkpoint of `step` in `dir` and removes the
/// oldest beyond the last `keep` (0: keeps none).
pub fn keep_step_checkpoint(varmap: &VarMap, dir: &Path, step: usize, keep: usize) -> Result<()> {
    if keep == 0 {
        return Ok(());
    }
    save_vars(varmap, &step_checkpoint(dir, step))?;
    let kept = step_checkpoints(dir)?;
    for (_, path) in kept.iter().take(kept.len().saturating_sub(keep)) {
        std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

/// The element-wise mean of the checkpoints `inputs` (the same variables, names and shapes in
/// each), computed in f64 and stored in each variable's dtype at `output`, atomically:
/// checkpoint averaging (Vaswani et al. 2017 average the last 5 or 20; NAT papers the last 5).
pub fn average_checkpoints(inputs: &[PathBuf], output: &Path) -> Result<()> {
    let Some((first, rest)) = inputs.split_first() else {
        anyhow::bail!("no checkpoint to average");
    };
    let device = candle_core::Device::Cpu;
    let load = |path: &PathBuf| {
        candle_core::safetensors::load(path, &device)
            .with_context(|| format!("loading {}", path.display()))
    };
    let first = load(first)?;
    let mut sums = std::collections::HashMap::new();
    for (name, tensor) in &first {
        sums.insert(name.clone(), tensor.to_dtype(candle_core::DType::F64)?);
    }
    for path in rest {
        let next = load(path)?;
        if next.len() != first.len() {
            anyhow::bail!(
                "{} holds {} variables, not {}",
                path.display(),
                next.len(),
                first.len()
            );
        }
        for (name, sum) in sums.iter_mut() {
            let Some(tensor) = next.get(name) else {
                anyhow::bail!("{} has no variable `{name}`", path.display());
            };
            *sum = (&*sum + tensor.to_dtype(candle_core::DType::F64)?)?;
        }
    }
    let count = inputs.len() as f64;
    let mut mean = std::collections::HashMap::new();
    for (name, sum) in sums {
        mean.insert(name.clone(), (sum / count)?.to_dtype(first[&name].dtype())?);
    }
    let tmp = temporary(output);
    candle_core::safetensors::save(&mean, &tmp)
        .with_context(|| format!("saving {}", tmp.display()))?;
    std::fs::rename(&tmp, output).with_context(|| format!("renaming to {}", output.display()))
}

/// Saves the optimizer state at `path`, atomically.
pub fn save_optimizer(optimizer: &AdamW, path: &Path) -> Result<()> {
    let tmp = temporary(path);
    optimizer.save(&tmp)?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// Writes `state` as pretty JSON at `path`, atomically.
pub fn save_json<T: Serialize>(state: &T, path: &Path) -> Result<()> {
    write_atomic(path, serde_json::to_string_pretty(state)?.as_bytes())
}

/// Reads JSON from `path`, or `None` if the file does not exist.
pub fn load_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(
            serde_json::from_slice(&bytes)
                .with_context(|| format!("parsing {}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};

    /// Averaging two checkpoints gives each variable's mean; only the last `keep` step
    /// checkpoints stay.
    #[test]
    fn averaging_and_keeping_the_last_checkpoints() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("candle-bleu-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let varmap = VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let w = vb.get_with_hints((2, 2), "w", candle_nn::Init::Const(1.0))?;
        for step in [10, 20, 30] {
            let var = varmap.data().lock().expect("lock")["w"].clone();
            var.set(&Tensor::full(step as f32, (2, 2), &Device::Cpu)?)?;
            keep_step_checkpoint(&varmap, &dir, step, 2)?;
        }
        drop(w);
        let kept = step_checkpoints(&dir)?;
        assert_eq!(kept.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [20, 30]);
        let paths: Vec<PathBuf> = kept.into_iter().map(|(_, p)| p).collect();
        let out = dir.join("averaged.safetensors");
        average_checkpoints(&paths, &out)?;
        let mean = candle_core::safetensors::load(&out, &Device::Cpu)?;
        assert_eq!(mean["w"].dtype(), DType::F32);
        assert_eq!(mean["w"].to_vec2::<f32>()?, [[25.0, 25.0], [25.0, 25.0]]);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
