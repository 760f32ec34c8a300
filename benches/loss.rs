//! Speed and memory of the BLEU loss, forward + backward from logits, against candle's own
//! `cross_entropy` on the same logits (measured in the same process) and PyTorch (read from
//! `benches/torch_results.json`, written by `benches/torch_bleu_loss.py` run back to back).
//!
//! ```text
//! cargo bench --bench loss                 # both shapes
//! cargo bench --bench loss -- --quick      # the small shape only
//! cargo bench --features cuda --bench loss # on CUDA device 0 (`-- --cpu`: on the CPU)
//! cargo bench --bench loss -- --large      # the large shape only
//! cargo bench --bench loss -- --no-slow    # skip candle-nn's cross_entropy and the composed loss
//! cargo bench --bench loss -- --reuse-heap # glibc keeps freed [B,S,V] blocks for reuse (mallopt)
//! ```
//!
//! Each row prints the median, minimum and maximum of its timed runs and its ratio to PyTorch;
//! the raw times go to `benches/results/loss-<unix time>.json`.
//!
//! Memory: a counting global allocator records the peak of live heap bytes during one
//! forward + backward, above what was live before (the logits themselves); reported as a
//! multiple of the logits tensor. The peak resident set (VmHWM, reset through
//! /proc/self/clear_refs) is reported beside it.

use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_logits, ce_bleu_from_logits, cross_entropy_from_logits,
    BleuLossConfig, CrossEntropyConfig, Form, References, TrainingLossConfig, TrainingTargets,
};
use candle_core::{DType, Device, Result, Tensor, Var, D};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

struct CountingAllocator;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc_zeroed(layout);
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = System.realloc(ptr, layout, new_size);
        if !new.is_null() {
            if new_size >= layout.size() {
                let live = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                    - layout.size();
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn reset_rss_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn rss_peak_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn rss_now_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

struct Measurement {
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    runs_ms: Vec<f64>,
    heap_peak_ratio: f64,
    rss_peak_ratio: Option<f64>,
}

/// Times `step` (forward + backward) `repeats` times after one warm-up; measures memory on the
/// warm-up run.
fn measure(
    logits_bytes: usize,
    repeats: usize,
    step: &dyn Fn() -> Result<()>,
) -> Result<Measurement> {
    let live_before = LIVE.load(Ordering::Relaxed);
    PEAK.store(live_before, Ordering::Relaxed);
    let rss_before = rss_now_bytes();
    reset_rss_peak();
    step()?;
    let heap_peak_ratio = (PEAK.load(Ordering::Relaxed) - live_before) as f64 / logits_bytes as f64;
    let rss_peak_ratio = match (rss_before, rss_peak_bytes()) {
        (Some(before), Some(peak)) => {
            Some(peak.saturating_sub(before) as f64 / logits_bytes as f64)
        }
        _ => None,
    };
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = Instant::now();
        step()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let runs_ms = times.clone();
    times.sort_by(f64::total_cmp);
    Ok(Measurement {
        median_ms: times[times.len() / 2],
        min_ms: times[0],
        max_ms: times[times.len() - 1],
        runs_ms,
        heap_peak_ratio,
        rss_peak_ratio,
    })
}

/// PyTorch's median for (shape, form), from benches/torch_results.json if present.
fn torch_median(results: &Option<serde_json::Value>, shape: [usize; 4], form: &str) -> Option<f64> {
    let rows = results.as_ref()?.get("results")?.as_array()?;
    rows.iter()
        .find(|row| {
            let row_shape: Option<Vec<usize>> = row.get("shape").and_then(|s| {
                s.as_array()?
                    .iter()
                    .map(|d| d.as_u64().map(|d| d as usize))
                    .collect()
            });
            row_shape.as_deref() == Some(&shape[..])
                && row.get("form").and_then(|s| s.as_str()) == Some(form)
        })?
        .get("median_ms")?
        .as_f64()
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let device = if std::env::args().any(|a| a == "--cpu") {
        Device::Cpu
    } else {
        Device::cuda_if_available(0)?
    };
    println!("device: {:?}", device.location());
    let large_only = std::env::args().any(|a| a == "--large");
    let no_slow = std::env::args().any(|a| a == "--no-slow");
    let mut raw_rows = Vec::new();
    if std::env::args().any(|a| a == "--reuse-heap") {
        // Blocks above the mmap threshold are unmapped on free, so each step's [B,S,V]
        // gradients land on fresh pages (first-touch faults); raising the thresholds keeps them
        // in the heap for the next step. Process-wide: a choice for the training program.
        #[cfg(target_os = "linux")]
        // SAFETY: mallopt only changes glibc's allocation thresholds.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 2 << 30);
        }
        println!("--reuse-heap: mallopt(M_MMAP_THRESHOLD = 1 GiB, M_TRIM_THRESHOLD = 2 GiB)");
    }
    // TORCH_RESULTS=path compares with another run of the PyTorch script (e.g. one made just
    // before, for alternating runs).
    let torch_path =
        std::env::var("TORCH_RESULTS").unwrap_or_else(|_| "benches/torch_results.json".into());
    let torch: Option<serde_json::Value> = std::fs::read_to_string(&torch_path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok());
    let shapes: &[(usize, usize, usize, usize, usize)] = if quick {
        &[(16, 32, 32, 1000, 20)]
    } else if large_only {
        &[(32, 64, 64, 32000, 7)]
    } else {
        &[(16, 32, 32, 1000, 20), (32, 64, 64, 32000, 5)]
    };
    println!(
        "threads: rayon {} | candle {}",
        rayon::current_num_threads(),
        candle_core::utils::get_num_threads()
    );
    for &(batch, seq, ref_len, vocab, repeats) in shapes {
        let shape = format!("[{batch},{seq},{ref_len},{vocab}]");
        let logits = Tensor::randn(0f32, 1.0, (batch, seq, vocab), &device)?;
        let logits_bytes = logits.elem_count() * 4;
        let ids =
            Tensor::rand(0f32, vocab as f32, (batch, ref_len), &device)?.to_dtype(DType::U32)?;
        // Copy some hypothesis-side argmaxes into the references so that matches are not all 0.
        let refs = References::from_ids(&ids, u32::MAX)?;
        let targets =
            Tensor::rand(0f32, vocab as f32, (batch * seq,), &device)?.to_dtype(DType::U32)?;
        let targets_2d = targets.reshape((batch, seq))?;
        let var = Var::from_tensor(&logits)?;

        let cross_entropy = || -> Result<()> {
            let flat = var.as_tensor().reshape((batch * seq, vocab))?;
            let loss = candle_nn::loss::cross_entropy(&flat, &targets)?;
            let _ = loss.backward()?;
            Ok(())
        };
        let fused = |form: Form| {
            let refs = &refs;
            let var = &var;
            move || -> Result<()> {
                let cfg = BleuLossConfig {
                    form,
                    ..Default::default()
                };
                let out = bleu_loss_from_logits(var.as_tensor(), None, refs, &cfg)?;
                let _ = out.loss.backward()?;
                Ok(())
            }
        };
        let fused_cross_entropy = || -> Result<()> {
            let loss = cross_entropy_from_logits(
                var.as_tensor(),
                &targets_2d,
                &CrossEntropyConfig::default(),
            )?
            .loss;
            let _ = loss.backward()?;
            Ok(())
        };
        // The forward alone: the backward's share is the difference to the row above it.
        let fused_cross_entropy_forward = || -> Result<()> {
            let loss = cross_entropy_from_logits(
                var.as_tensor(),
                &targets_2d,
                &CrossEntropyConfig::default(),
            )?
            .loss;
            std::hint::black_box(loss);
            Ok(())
        };
        let ce_bleu_apart = || -> Result<()> {
            let ce = cross_entropy_from_logits(
                var.as_tensor(),
                &targets_2d,
                &CrossEntropyConfig::default(),
            )?
            .loss;
            let bleu =
                bleu_loss_from_logits(var.as_tensor(), None, &refs, &BleuLossConfig::default())?;
            let _ = (ce + bleu.loss)?.backward()?;
            Ok(())
        };
        let ce_bleu = |form: Form| {
            let refs = &refs;
            let var = &var;
            let targets_2d = &targets_2d;
            move || -> Result<()> {
                let cfg = BleuLossConfig {
                    form,
                    ..Default::default()
                };
                let cfg = TrainingLossConfig {
                    bleu: cfg,
                    ..Default::default()
                };
                let out = ce_bleu_from_logits(
                    var.as_tensor(),
                    &TrainingTargets::new(targets_2d, refs),
                    &cfg,
                )?;
                let _ = out.loss.backward()?;
                Ok(())
            }
        };
        let composed_expected = || -> Result<()> {
            let probs = candle_nn::ops::softmax(var.as_tensor(), D::Minus1)?;
            let out = bleu_loss(&probs, None, &refs, &BleuLossConfig::default())?;
            let _ = out.loss.backward()?;
            Ok(())
        };

        println!("\n{shape} f32, 4-grams, forward + backward from logits, median of {repeats}");
        println!(
            "{:<44} {:>10} {:>17} {:>9} {:>9} {:>12} {:>10}",
            "", "median ms", "min-max ms", "vs row 1", "vs torch", "heap peak", "RSS peak"
        );
        let mut rows: Vec<(&str, Option<&str>, Measurement)> = Vec::new();
        if !no_slow {
            rows.push((
                "candle cross_entropy (yardstick)",
                Some("cross_entropy"),
                measure(logits_bytes, repeats.min(3), &cross_entropy)?,
            ));
        }
        rows.push((
            "cross_entropy_from_logits (fused)",
            Some("cross_entropy"),
            measure(logits_bytes, repeats, &fused_cross_entropy)?,
        ));
        rows.push((
            "  its forward alone",
            None,
            measure(logits_bytes, repeats, &fused_cross_entropy_forward)?,
        ));
        rows.push((
            "bleu_loss_from_logits Expected (fused)",
            Some("expected"),
            measure(logits_bytes, repeats, &fused(Form::Expected))?,
        ));
        rows.push((
            "ce_bleu_from_logits Expected (one op)",
            Some("ce_expected"),
            measure(logits_bytes, repeats, &ce_bleu(Form::Expected))?,
        ));
        rows.push((
            "CE + BLEU Expected computed apart",
            Some("ce_expected"),
            measure(logits_bytes, repeats, &ce_bleu_apart)?,
        ));
        rows.push((
            "bleu_loss_from_logits LowerBound (fused)",
            Some("lower_bound"),
            measure(logits_bytes, repeats, &fused(Form::LowerBound))?,
        ));
        rows.push((
            "bleu_loss_from_logits Paired",
            Some("paired"),
            measure(logits_bytes, repeats, &fused(Form::Paired))?,
        ));
        rows.push((
            "ce_bleu_from_logits Paired (one op)",
            None,
            measure(logits_bytes, repeats, &ce_bleu(Form::Paired))?,
        ));
        if !no_slow {
            rows.push((
                "ops::softmax + bleu_loss Expected (composed)",
                None,
                measure(logits_bytes, repeats.min(3), &composed_expected)?,
            ));
        }
        let ce_ms = rows[0].2.median_ms;
        for (name, torch_name, m) in &rows {
            raw_rows.push(serde_json::json!({
                "shape": [batch, seq, ref_len, vocab],
                "name": name,
                "torch_form": torch_name,
                "median_ms": m.median_ms,
                "min_ms": m.min_ms,
                "max_ms": m.max_ms,
                "runs_ms": m.runs_ms,
                "heap_peak_over_logits": m.heap_peak_ratio,
                "rss_peak_over_logits": m.rss_peak_ratio,
            }));
            let vs_torch = torch_name
                .and_then(|t| torch_median(&torch, [batch, seq, ref_len, vocab], t))
                .map(|t| format!("{:.2}x", m.median_ms / t))
                .unwrap_or_else(|| "-".into());
            println!(
                "{:<44} {:>10.1} {:>17} {:>8.2}x {:>9} {:>11.2}x {:>10}",
                name,
                m.median_ms,
                format!("{:.1}-{:.1}", m.min_ms, m.max_ms),
                m.median_ms / ce_ms,
                vs_torch,
                m.heap_peak_ratio,
                m.rss_peak_ratio
                    .map(|r| format!("{r:.2}x"))
                    .unwrap_or_else(|| "-".into())
            );
        }
        if torch.is_some() {
            println!("(vs torch: candle time / PyTorch time from {torch_path}; < 1 is faster)");
        }
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let path = format!("benches/results/loss-{stamp}.json");
    let doc = serde_json::json!({ "unix_time": stamp, "rows": raw_rows });
    if std::fs::create_dir_all("benches/results").is_ok()
        && std::fs::write(
            &path,
            serde_json::to_string_pretty(&doc).unwrap_or_default(),
        )
        .is_ok()
    {
        println!("raw times: {path}");
    }
    Ok(())
}
