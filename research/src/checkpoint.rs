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
