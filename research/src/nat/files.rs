//! Gzipped line files (the study's committed outputs) and SHA-256 digests.

use anyhow::{Context, Result};
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// SHA-256 of the file at `path`, lowercase hex.
pub fn file_sha256(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(sha256_hex(&bytes))
}

/// `lines`, each ended by `\n`.
pub fn join_lines(lines: &[String]) -> String {
    let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// Writes `lines` gzipped to `path` (the gzip header's time is 0, so equal lines give equal
/// files), atomically.
pub fn write_lines_gz(path: &Path, lines: &[String]) -> Result<()> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
    encoder.write_all(join_lines(lines).as_bytes())?;
    crate::checkpoint::write_atomic(path, &encoder.finish()?)
}

/// The lines of the gzipped file at `path`.
pub fn read_lines_gz(path: &Path) -> Result<Vec<String>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut text = String::new();
    GzDecoder::new(&bytes[..])
        .read_to_string(&mut text)
        .with_context(|| format!("decompressing {}", path.display()))?;
    Ok(text.lines().map(str::to_string).collect())
}
