//! References of the loss, and their side of the statistics (docs/loss.md, §6 Reference side: `e_j`, `ν_j`, `κ_j`).
//!
//! The references of one batch element are laid end to end; an n-gram never spans two of them.
//! For token ids the masks and clip counts are exact integers computed on the host by the
//! crate's one n-gram counter (`crate::ngram`), with no `V`-sized work and no gradient. For
//! one-hot or soft matrices they follow the derivation: reference self-matches
//! `Y[j,j'] = Π_k A_{j+k}·A_{j'+k}` and products over the strictly lower triangle.

use super::config::constant;
use super::host;
use super::kernels::row::op::GatherIds;
use super::products::{extend_ngram_match, prod_last_dim};
use crate::ngram::reference_ngram_masks;
use candle_core::{bail, DType, Device, Result, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What the reference side depends on besides the references: `max_order`, the EOS id of the
/// length model (references end at their first EOS), and the compute dtype.
type SideKey = (usize, Option<u32>, DType);

/// The references of a batch, built once and reused across steps.
///
/// Id references are read to the host once, by [`References::from_ids`]; every loss call after
/// that makes no device-to-host copy for them (see [`crate::loss`], "Device-to-host copies").
/// Their side of the statistics — first-occurrence masks `ν`, clip counts `κ`, the packed ids
/// and the reference lengths, all device tensors — is computed on the host from the ids kept
/// here and uploaded the first time a loss asks for a `(max_order, eos_id, dtype)`, then cached:
/// the next call with that key reuses the device tensors. A cache rather than precomputing
/// every key in the constructor, because the key is not known there: `max_order` is unbounded,
/// `eos_id` can be any id of the vocabulary, and the dtype follows the hypotheses. In a training
/// loop the key is fixed, so the cache holds one entry; clones of a `References` share it.
#[derive(Debug, Clone)]
pub struct References {
    kind: ReferenceKind,
    device: Device,
    sides: Arc<Mutex<HashMap<SideKey, Arc<ReferenceSide>>>>,
}

/// What a training step's loss is scored against: the cross-entropy's target ids and BLEU's
/// references, and optionally the hypotheses' lengths
/// ([`ce_bleu_from_logits`](super::ce_bleu_from_logits),
/// [`ce_bleu_from_hidden`](super::ce_bleu_from_hidden)).
///
/// ```
/// use candle_bleu::loss::{References, TrainingTargets};
/// use candle_core::{Device, Tensor};
/// let tokens = Tensor::new(&[[5u32, 6, 2, 0]], &Device::Cpu)?; // u32 [B, S]; 0 is padding
/// let refs = References::from_ids(&tokens, 0)?;
/// let targets = TrainingTargets::new(&tokens, &refs); // hypothesis lengths: S each
/// assert!(targets.hyp_lengths.is_none());
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TrainingTargets<'a> {
    /// u32 `[B, S]`: the cross-entropy's target id at every hypothesis position, each `< V` or
    /// the config's `pad_id`; not all padding.
    pub tokens: &'a Tensor,
    /// The references BLEU is computed against, of the same batch.
    pub refs: &'a References,
    /// u32 `[B]` hypothesis lengths, each `<= S` (the `hyp_lengths` of
    /// [`bleu_loss_from_logits`](super::bleu_loss_from_logits)); `None` = `S`.
    pub hyp_lengths: Option<&'a Tensor>,
}

impl<'a> TrainingTargets<'a> {
    /// The targets `tokens` (u32 `[B, S]`) and `refs`, with hypothesis lengths `S`.
    pub fn new(tokens: &'a Tensor, refs: &'a References) -> Self {
        Self {
            tokens,
            refs,
            hyp_lengths: None,
        }
    }

    /// The same with hypothesis lengths `hyp_lengths` (u32 `[B]`).
    pub fn with_hyp_lengths(self, hyp_lengths: &'a Tensor) -> Self {
        Self {
            hyp_lengths: Some(hyp_lengths),
            ..self
        }
    }
}

#[derive(Debug, Clone)]
enum ReferenceKind {
    /// `[b][r]`: the tokens of reference `r` of element `b`, padding removed.
    Ids(Vec<Vec<Vec<u32>>>),
    /// `matrices`: detached float `[B, T, V]`; `lengths[b]` rows of element `b` are its reference.
    Matrices {
        matrices: Tensor,
        lengths: Vec<usize>,
    },
}

impl References {
    /// References given as token ids.
    ///
    /// # Arguments
    /// * `ids` - u32 `[B, T]` (one reference per element) or `[B, R, T]` (up to `R`). Trailing
    ///   `pad_id`s are padding; a row of padding only is no reference (elements may have
    ///   different numbers of references). A `pad_id` before the last real token is a token.
    /// * `pad_id` - the padding id.
    ///
    /// Reads the ids to the host once (one device-to-host copy); no loss call on these
    /// references copies again. Build it once per batch, before the forward pass.
    ///
    /// Errors on another dtype or rank, an empty batch, or an element with no reference.
    ///
    /// ```
    /// use candle_bleu::loss::References;
    /// use candle_core::{Device, Tensor};
    ///
    /// // Two elements; the first has two references, the second one (its second row is padding).
    /// let ids = Tensor::new(
    ///     &[[[7u32, 8, 9, 0], [7, 9, 0, 0]], [[4, 5, 6, 4], [0, 0, 0, 0]]],
    ///     &Device::Cpu,
    /// )?;
    /// let refs = References::from_ids(&ids, 0)?;
    /// assert_eq!(refs.batch_size(), 2);
    /// assert_eq!(refs.ids().unwrap()[0], vec![vec![7, 8, 9], vec![7, 9]]);
    /// assert_eq!(refs.ids().unwrap()[1], vec![vec![4, 5, 6, 4]]);
    /// // An element whose rows are all padding is an error naming it.
    /// let empty = Tensor::new(&[[1u32, 2], [0, 0]], &Device::Cpu)?;
    /// assert!(References::from_ids(&empty, 0).unwrap_err().to_string().contains("element 1"));
    /// # Ok::<(), candle_core::Error>(())
    /// ```
    pub fn from_ids(ids: &Tensor, pad_id: u32) -> Result<Self> {
        if ids.dtype() != DType::U32 {
            bail!(
                "References::from_ids: `ids` must be u32, got {:?} with shape {:?}",
                ids.dtype(),
                ids.dims()
            );
        }
        let rows: Vec<Vec<Vec<u32>>> = match ids.rank() {
            2 => host::to_vec2::<u32>(ids)?
                .into_iter()
                .map(|row| vec![row])
                .collect(),
            3 => host::to_vec3::<u32>(ids)?,
            _ => bail!(
                "References::from_ids: `ids` must be [B, T] or [B, R, T], got shape {:?}",
                ids.dims()
            ),
        };
        if rows.is_empty() {
            bail!(
                "References::from_ids: empty batch (`ids` has shape {:?})",
                ids.dims()
            );
        }
        let mut references = Vec::with_capacity(rows.len());
        for (element, element_rows) in rows.into_iter().enumerate() {
            let kept: Vec<Vec<u32>> = element_rows
                .into_iter()
                .filter_map(|mut row| {
                    let length = row
                        .iter()
                        .rposition(|&id| id != pad_id)
                        .map_or(0, |p| p + 1);
                    row.truncate(length);
                    (length > 0).then_some(row)
                })
                .collect();
            if kept.is_empty() {
                bail!(
                    "References::from_ids: batch element {element} has no reference (every row of `ids` is padding {pad_id}; shape {:?})",
                    ids.dims()
                );
            }
            references.push(kept);
        }
        Ok(Self {
            kind: ReferenceKind::Ids(references),
            device: ids.device().clone(),
            sides: Arc::default(),
        })
    }

    /// References given as one-hot or soft rows, one reference per element (the derivation's
    /// `A`). The matrices are treated as targets: no gradient flows into them.
    ///
    /// # Arguments
    /// * `refs` - float `[B, T, V]`, rows of one-hot or probability vectors.
    /// * `lengths` - u32 `[B]`, `1 <= lengths[b] <= T`: the rows of element `b` that belong to
    ///   its reference; later rows are padding. Under `NotEos`/`SoftEos` the reference also
    ///   ends before its first row whose largest entry is the EOS column, as id references
    ///   end at their first EOS.
    ///
    /// Reads `lengths` to the host (one copy) and, off the CPU, checks `refs` for NaN/Inf (one
    /// more). Errors (naming the argument and its shape, dtype or value) on a wrong rank or
    /// dtype, an empty batch, lengths outside `1..=T`, or NaN/Inf in `refs`.
    ///
    /// ```
    /// use candle_bleu::loss::{bleu_loss, BleuLossConfig, References};
    /// use candle_core::{Device, Tensor};
    ///
    /// let dev = Device::Cpu;
    /// // One reference of 2 tokens (ids 1, 2) over V = 3, and a padding row.
    /// let rows = Tensor::new(&[[[0f32, 1., 0.], [0., 0., 1.], [0., 0., 0.]]], &dev)?;
    /// let refs = References::from_matrices(&rows, &Tensor::new(&[2u32], &dev)?)?;
    /// // The hypothesis is the reference, as one-hot rows: BLEU 1, loss 0.
    /// let cfg = BleuLossConfig { max_order: 2, ..Default::default() };
    /// let out = bleu_loss(&rows.narrow(1, 0, 2)?, None, &refs, &cfg)?;
    /// assert!(out.loss.to_scalar::<f32>()?.abs() < 1e-6);
    /// # Ok::<(), candle_core::Error>(())
    /// ```
    pub fn from_matrices(refs: &Tensor, lengths: &Tensor) -> Result<Self> {
        let (batch, max_len, _) = match refs.dims() {
            &[b, t, v] => (b, t, v),
            dims => {
                bail!("References::from_matrices: `refs` must be [B, T, V], got shape {dims:?}")
            }
        };
        if !refs.dtype().is_float() {
            bail!(
                "References::from_matrices: `refs` must be a float tensor, got {:?} with shape {:?}",
                refs.dtype(),
                refs.dims()
            );
        }
        if batch == 0 {
            bail!(
                "References::from_matrices: empty batch (`refs` has shape {:?})",
                refs.dims()
            );
        }
        if lengths.dtype() != DType::U32 || lengths.dims() != [batch] {
            bail!(
                "References::from_matrices: `lengths` must be u32 [{batch}], got {:?} with shape {:?}",
                lengths.dtype(),
                lengths.dims()
            );
        }
        let lengths: Vec<usize> = host::to_vec1::<u32>(lengths)?
            .into_iter()
            .map(|l| l as usize)
            .collect();
        for (element, &length) in lengths.iter().enumerate() {
            if length == 0 || length > max_len {
                bail!(
                    "References::from_matrices: `lengths[{element}]` = {length} must be in 1..={max_len} (T of `refs` {:?})",
                    refs.dims()
                );
            }
        }
        if host::all_finite(refs, true)? == Some(false) {
            bail!(
                "References::from_matrices: `refs` contains NaN or infinite values (shape {:?})",
                refs.dims()
            );
        }
        Ok(Self {
            kind: ReferenceKind::Matrices {
                matrices: refs.detach(),
                lengths,
            },
            device: refs.device().clone(),
            sides: Arc::default(),
        })
    }

    /// Number of batch elements.
    pub fn batch_size(&self) -> usize {
        match &self.kind {
            ReferenceKind::Ids(refs) => refs.len(),
            ReferenceKind::Matrices { lengths, .. } => lengths.len(),
        }
    }

    /// Whether the references are token ids (and so can use the fused gather kernel).
    pub fn is_ids(&self) -> bool {
        matches!(self.kind, ReferenceKind::Ids(_))
    }

    /// The reference token ids `[b][r]` with padding removed, if built from ids.
    pub fn ids(&self) -> Option<&[Vec<Vec<u32>>]> {
        match &self.kind {
            ReferenceKind::Ids(refs) => Some(refs),
            ReferenceKind::Matrices { .. } => None,
        }
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Checks the references against a hypothesis vocabulary of size `vocab`.
    pub(crate) fn check_vocab(&self, vocab: usize) -> Result<()> {
        match &self.kind {
            ReferenceKind::Ids(refs) => {
                for (element, element_refs) in refs.iter().enumerate() {
                    for (r, reference) in element_refs.iter().enumerate() {
                        if let Some(&id) = reference.iter().find(|&&id| id as usize >= vocab) {
                            bail!(
                                "`refs`: id {id} in reference {r} of batch element {element} is out of the vocabulary (V = {vocab}): every reference id must be < V"
                            );
                        }
                    }
                }
            }
            ReferenceKind::Matrices { matrices, .. } => {
                let ref_vocab = matrices.dim(2)?;
                if ref_vocab != vocab {
                    bail!(
                        "`refs` has vocabulary {ref_vocab} (shape {:?}) but the hypotheses have V = {vocab}",
                        matrices.dims()
                    );
                }
            }
        }
        Ok(())
    }

    /// The reference side of every order, for references truncated at `eos_id` (if any), in
    /// `dtype` on the references' device: from the cache, or built and cached.
    pub(crate) fn side(
        &self,
        max_order: usize,
        eos_id: Option<u32>,
        dtype: DType,
    ) -> Result<Arc<ReferenceSide>> {
        let key = (max_order, eos_id, dtype);
        // A panic while the lock was held cannot leave the map half-written (one insert), so a
        // poisoned lock is still a valid cache.
        let cached = self
            .sides
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(side) = cached {
            return Ok(side);
        }
        let side = Arc::new(match &self.kind {
            ReferenceKind::Ids(refs) => ids_side(refs, max_order, eos_id, dtype, &self.device)?,
            ReferenceKind::Matrices { matrices, lengths } => {
                let lengths = match eos_id {
                    Some(eos) => lengths_before_eos(matrices, lengths, eos)?,
                    None => lengths.clone(),
                };
                matrix_side(&matrices.to_dtype(dtype)?, &lengths, max_order)?
            }
        });
        self.sides
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, side.clone());
        Ok(side)
    }
}

/// How the token-match matrix `X` is read: by a gather at ids, or by a product with matrices.
#[derive(Debug, Clone)]
pub(crate) enum ReferenceTokens {
    /// u32 `[B, W]`: each element's references end to end, right-padded with id 0.
    Ids(Tensor),
    /// float `[B, T, V]`.
    Matrices(Tensor),
}

/// The reference side of the statistics, per order `n = 1..=N` (index `n - 1`).
#[derive(Debug, Clone)]
pub(crate) struct ReferenceSide {
    pub tokens: ReferenceTokens,
    /// `ν` per order: float `[B, W]`, first occurrences (0 outside references and padding).
    pub first: Vec<Tensor>,
    /// `κ` per order: float `[B, W]`, clip counts at first occurrences, 0 elsewhere.
    pub clip: Vec<Tensor>,
    /// For id references: `ν` and `κ` of every order packed as the matches op reads them,
    /// float `[2, N, B, W]` (built once on the host with the per-order ones).
    pub counts: Option<Tensor>,
    /// float `[B, R]`: the reference lengths of each element, the candidates for the effective
    /// reference length; `R` is the most references of an element, shorter rows are padded.
    pub ref_lengths: Tensor,
    /// u8 `[B, R]`: 1 where `ref_lengths` holds a reference, 0 at padding.
    pub ref_mask: Tensor,
    /// For id references: the ids a pass over the logits gathers at (`[B, W]`, with a column of
    /// `eos_id` appended under the EOS length models) and their first-occurrence links, built
    /// once here on the host.
    pub gather: Option<GatherIds>,
}

/// `ref_lengths` and `ref_mask` of [`ReferenceSide`] from host lengths `[b][r]`.
fn length_candidates(
    lengths: &[Vec<usize>],
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let batch = lengths.len();
    let most = lengths.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut values = vec![0f64; batch * most];
    let mut mask = vec![0u8; batch * most];
    for (b, element) in lengths.iter().enumerate() {
        for (r, &length) in element.iter().enumerate() {
            values[b * most + r] = length as f64;
            mask[b * most + r] = 1;
        }
    }
    Ok((
        constant(values, (batch, most), dtype, device)?,
        Tensor::from_vec(mask, (batch, most), device)?,
    ))
}

fn ids_side(
    refs: &[Vec<Vec<u32>>],
    max_order: usize,
    eos_id: Option<u32>,
    dtype: DType,
    device: &Device,
) -> Result<ReferenceSide> {
    // Under an EOS length model a reference ends at its first EOS (docs/loss.md, §5 Length models: reference positions
    // count up to their length, EOS excluded), as the hypothesis does.
    let truncated: Vec<Vec<&[u32]>> = refs
        .iter()
        .map(|element| {
            element
                .iter()
                .map(|reference| match eos_id {
                    Some(eos) => match reference.iter().position(|&id| id == eos) {
                        Some(end) => &reference[..end],
                        None => &reference[..],
                    },
                    None => &reference[..],
                })
                .collect()
        })
        .collect();
    let batch = refs.len();
    let width = truncated
        .iter()
        .map(|element| element.iter().map(|r| r.len()).sum::<usize>())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut ids = vec![0u32; batch * width];
    let mut first = vec![vec![0f64; batch * width]; max_order];
    let mut clip = vec![vec![0f64; batch * width]; max_order];
    for (b, element) in truncated.iter().enumerate() {
        let row = &mut ids[b * width..][..width];
        let mut offset = 0;
        for reference in element {
            row[offset..offset + reference.len()].copy_from_slice(reference);
            offset += reference.len();
        }
        for order in 1..=max_order {
            let masks = reference_ngram_masks(element, order);
            for (j, (&is_first, &count)) in masks.first.iter().zip(&masks.clip).enumerate() {
                first[order - 1][b * width + j] = f64::from(u8::from(is_first));
                clip[order - 1][b * width + j] = f64::from(count);
            }
        }
    }
    let to_tensor = |values: Vec<f64>| constant(values, (batch, width), dtype, device);
    let packed: Vec<f64> = first.iter().chain(&clip).flatten().copied().collect();
    let counts = constant(packed, (2, max_order, batch, width), dtype, device)?;
    let lengths: Vec<Vec<usize>> = truncated
        .iter()
        .map(|element| element.iter().map(|r| r.len()).collect())
        .collect();
    let (ref_lengths, ref_mask) = length_candidates(&lengths, dtype, device)?;
    let gather_width = width + usize::from(eos_id.is_some());
    let gather_ids: Vec<u32> = ids
        .chunks(width)
        .flat_map(|row| row.iter().copied().chain(eos_id))
        .collect();
    let gather = GatherIds::from_host(&gather_ids, (batch, gather_width), device)?;
    Ok(ReferenceSide {
        gather: Some(gather),
        tokens: ReferenceTokens::Ids(Tensor::from_vec(ids, (batch, width), device)?),
        first: first.into_iter().map(to_tensor).collect::<Result<_>>()?,
        clip: clip.into_iter().map(to_tensor).collect::<Result<_>>()?,
        counts: Some(counts),
        ref_lengths,
        ref_mask,
    })
}

/// Under an EOS length model a matrix reference ends at its first row whose largest entry is
/// the EOS column (for one-hot rows: the first EOS token), as an id reference ends at its
/// first EOS: `lengths[b]` is cut there.
fn lengths_before_eos(matrices: &Tensor, lengths: &[usize], eos_id: u32) -> Result<Vec<usize>> {
    let argmax = host::to_vec2::<u32>(&matrices.argmax(candle_core::D::Minus1)?)?;
    Ok(argmax
        .iter()
        .zip(lengths)
        .map(|(row, &length)| {
            row[..length]
                .iter()
                .position(|&id| id == eos_id)
                .unwrap_or(length)
        })
        .collect())
}

/// `ν_j = e_j Π_{j'<j} (1 - Y[j,j'] e_{j'})`, `κ_j = ν_j Σ_{j'} Y[j,j'] e_{j'}` (one reference
/// per element, so the max over references is that reference's count).
fn matrix_side(matrices: &Tensor, lengths: &[usize], max_order: usize) -> Result<ReferenceSide> {
    let (batch, max_len, _) = matrices.dims3()?;
    let device = matrices.device();
    let dtype = matrices.dtype();
    let self_match = matrices.matmul(&matrices.t()?)?;
    let strictly_lower =
        Tensor::tril2(max_len, dtype, device)?.sub(&Tensor::eye(max_len, dtype, device)?)?;
    let mut first = Vec::with_capacity(max_order);
    let mut clip = Vec::with_capacity(max_order);
    let mut ngram_match = self_match.clone();
    for order in 1..=max_order {
        if order > 1 {
            match extend_ngram_match(&ngram_match, &self_match, order)? {
                Some(next) => ngram_match = next,
                None => {
                    let zeros = Tensor::zeros((batch, max_len), dtype, device)?;
                    first.push(zeros.clone());
                    clip.push(zeros);
                    continue;
                }
            }
        }
        let starts = max_len - order + 1;
        let inside: Vec<f64> = lengths
            .iter()
            .flat_map(|&length| (0..starts).map(move |j| f64::from(u8::from(j + order <= length))))
            .collect();
        let inside = constant(inside, (batch, starts), dtype, device)?;
        // weighted[j, j'] = Y[j, j'] e_{j'}
        let weighted = ngram_match.broadcast_mul(&inside.unsqueeze(1)?)?;
        let lower = strictly_lower.narrow(0, 0, starts)?.narrow(1, 0, starts)?;
        let not_seen_before = weighted.broadcast_mul(&lower)?.affine(-1.0, 1.0)?;
        let order_first = inside.mul(&prod_last_dim(&not_seen_before)?)?;
        let order_clip = order_first.mul(&weighted.sum(2)?)?;
        let pad = max_len - starts;
        first.push(order_first.pad_with_zeros(1, 0, pad)?);
        clip.push(order_clip.pad_with_zeros(1, 0, pad)?);
    }
    let lengths: Vec<Vec<usize>> = lengths.iter().map(|&l| vec![l]).collect();
    let (ref_lengths, ref_mask) = length_candidates(&lengths, dtype, device)?;
    Ok(ReferenceSide {
        gather: None,
        tokens: ReferenceTokens::Matrices(matrices.clone()),
        first,
        clip,
        counts: None,
        ref_lengths,
        ref_mask,
    })
}
