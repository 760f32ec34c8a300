//! The training loss from hidden states against the logits path, forward + backward, in one
//! process, variants alternated round by round: time, heap peak and peak resident set.
//!
//! ```text
//! cargo bench --bench hidden -- --shape 32,64,512,64,32000        # [B,S,D,T,V]
//! cargo bench --bench hidden -- --shape 64,14,256,14,8000 --rounds 9
//! cargo bench --bench hidden -- --peaked 3 --zipf 1.5 --filter 1e-5 # a peaked distribution
//! cargo bench --bench hidden -- --variants logits,hidden --json out.json
//! ```
//!
//! Variants (`--variants`, comma-separated; default all but the CE-only ones):
//! - `logits`: `proj.forward(hidden)` (`candle_nn::Linear`) + `ce_bleu_from_logits`;
//! - `hidden`: `ce_bleu_from_hidden` (no filtering);
//! - `filtered`: `ce_bleu_from_hidden` with `--filter τ` (default 1e-5);
//! - `ce-logits`, `ce-hidden`: the cross-entropy alone, both ways;
//! - `matmul`: candle's CPU matmul at the loss's three product shapes (`H Wᵀ`, `G W`, `Gᵀ H`),
//!   the yardstick for PyTorch's (`benches/torch_hidden.py` times the same).
//!
//! The BLEU loss is the default config (expected form unless `--form paired|lower-bound`,
//! 4-grams, corpus, add-1), the
//! cross-entropy pads id 0 and smooths labels by 0.1, `λ` = 0.3, the output layer is tied
//! embeddings (no bias), all in f32. Hidden states are N(0, 1); the weight is N(0, σ²/D) with
//! σ = `--peaked` (default 1: nearly uniform softmax rows); `--zipf α` adds a unigram prior
//! `−α·ln(v + 1)` to id `v`'s logit (see `inputs`). The rows' mean entropy and the share of
//! tiles that `--filter` skips are printed.
//!
//! Memory: each variant's first step runs in a child process of its own (this binary with
//! `--memory-of VARIANT`), which reports the peak resident set above what the inputs and
//! parameters occupy before the step (VmHWM after a reset through `/proc/self/clear_refs`,
//! minus VmRSS before), and the peak of live heap bytes (a counting allocator).

#[path = "common/ids.rs"]
mod ids;

use candle_bleu::loss::{
    ce_bleu_from_hidden, ce_bleu_from_logits, cross_entropy_from_hidden, cross_entropy_from_logits,
    BleuLossConfig, CrossEntropyConfig, Form, HiddenConfig, References, TrainingLossConfig,
    TrainingTargets,
};
use candle_core::{DType, Device, Module, Result, Tensor, Var, D};
use candle_nn::Linear;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

struct CountingAllocator;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn added(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if !ptr.is_null() {
            added(layout.size());
        }
        ptr
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc_zeroed(layout);
        if !ptr.is_null() {
            added(layout.size());
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
                added(new_size - layout.size());
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn status_kib(field: &str) -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

struct Args {
    shape: [usize; 5],
    rounds: usize,
    variants: Vec<String>,
    filter: f64,
    peaked: f64,
    zipf: f64,
    block_elements: usize,
    vocab_tile: usize,
    form: Form,
    json: Option<String>,
    memory_of: Option<String>,
}

fn parse_args() -> Args {
    let mut args = Args {
        shape: [32, 64, 512, 64, 32000],
        rounds: 5,
        variants: ["matmul", "logits", "hidden", "filtered"]
            .map(String::from)
            .to_vec(),
        filter: 1e-5,
        peaked: 1.0,
        zipf: 0.0,
        block_elements: HiddenConfig::DEFAULT_BLOCK_ELEMENTS,
        vocab_tile: HiddenConfig::default().vocab_tile,
        form: Form::Expected,
        json: None,
        memory_of: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--shape" => {
                let dims: Vec<usize> = value().split(',').map(|d| d.parse().unwrap()).collect();
                args.shape = dims.try_into().expect("--shape B,S,D,T,V");
            }
            "--rounds" => args.rounds = value().parse().unwrap(),
            "--variants" => args.variants = value().split(',').map(String::from).collect(),
            "--filter" => args.filter = value().parse().unwrap(),
            "--peaked" => args.peaked = value().parse().unwrap(),
            "--zipf" => args.zipf = value().parse().unwrap(),
            "--block-elements" => args.block_elements = value().parse().unwrap(),
            "--vocab-tile" => args.vocab_tile = value().parse().unwrap(),
            "--form" => {
                args.form = match value().as_str() {
                    "expected" => Form::Expected,
                    "paired" => Form::Paired,
                    "lower-bound" => Form::LowerBound,
                    other => panic!("--form expected|paired|lower-bound, got {other}"),
                }
            }
            "--json" => args.json = Some(value()),
            "--memory-of" => args.memory_of = Some(value()),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

/// The inputs of one step, on the CPU.
struct Inputs {
    hidden: Var,
    weight: Var,
    refs: References,
    targets: Tensor,
    lengths: Tensor,
}

fn inputs(args: &Args) -> Result<Inputs> {
    use rand::SeedableRng;
    let [b, s, d, t, v] = args.shape;
    let dev = Device::Cpu;
    let mut rng = rand::rngs::StdRng::seed_from_u64(2024);
    let mut hidden = Tensor::randn(0f32, 1.0, (b, s, d), &dev)?;
    let mut weight = Tensor::randn(0f32, (args.peaked / (d as f64).sqrt()) as f32, (v, d), &dev)?;
    if args.zipf > 0.0 {
        // A unigram prior in the logits, as trained output layers carry: hidden feature 0 is 1
        // and weight column 0 is −α·ln(v + 1), so id v's logit is shifted by −α·ln(v + 1)
        // (frequent tokens have small ids, as BPE vocabularies order them).
        let ones = Tensor::ones((b, s, 1), DType::F32, &dev)?;
        hidden = Tensor::cat(&[&ones, &hidden.narrow(2, 1, d - 1)?], 2)?;
        let prior =
            ((Tensor::arange(1f32, v as f32 + 1.0, &dev)?.log()? * -args.zipf)?).reshape((v, 1))?;
        weight = Tensor::cat(&[&prior, &weight.narrow(1, 1, d - 1)?], 1)?;
    }
    let (ref_ids, target_ids, lengths) = ids::random_ids(&mut rng, [b, s, t, v]);
    Ok(Inputs {
        hidden: Var::from_tensor(&hidden)?,
        weight: Var::from_tensor(&weight)?,
        refs: References::from_ids(&Tensor::from_vec(ref_ids, (b, t), &dev)?, 0)?,
        targets: Tensor::from_vec(target_ids, (b, s), &dev)?,
        lengths: Tensor::from_vec(lengths, b, &dev)?,
    })
}

fn config(args: &Args) -> TrainingLossConfig {
    TrainingLossConfig {
        bleu_weight: 0.3,
        ce: CrossEntropyConfig {
            pad_id: Some(0),
            label_smoothing: 0.1,
            ..Default::default()
        },
        bleu: BleuLossConfig {
            form: args.form,
            ..Default::default()
        },
    }
}

/// The blocks of the hidden-state entry points, with gradient filtering at `filter`.
fn blocks(args: &Args, filter: Option<f64>) -> HiddenConfig {
    HiddenConfig {
        block_elements: args.block_elements,
        vocab_tile: args.vocab_tile,
        filter_below: filter,
    }
}

/// One forward + backward of `variant`; the gradients are dropped.
fn step(variant: &str, x: &Inputs, args: &Args) -> Result<()> {
    let proj = Linear::new(x.weight.as_tensor().clone(), None);
    let h = x.hidden.as_tensor();
    let lengths = Some(&x.lengths);
    let loss = match variant {
        "logits" => {
            let logits = proj.forward(h)?;
            ce_bleu_from_logits(
                &logits,
                &TrainingTargets {
                    tokens: &x.targets,
                    refs: &x.refs,
                    hyp_lengths: lengths,
                },
                &config(args),
            )?
            .loss
        }
        "hidden" => {
            ce_bleu_from_hidden(
                h,
                &proj,
                &TrainingTargets {
                    tokens: &x.targets,
                    refs: &x.refs,
                    hyp_lengths: lengths,
                },
                &config(args),
                &blocks(args, None),
            )?
            .loss
        }
        "filtered" => {
            let cfg = config(args);
            ce_bleu_from_hidden(
                h,
                &proj,
                &TrainingTargets {
                    tokens: &x.targets,
                    refs: &x.refs,
                    hyp_lengths: lengths,
                },
                &cfg,
                &blocks(args, Some(args.filter)),
            )?
            .loss
        }
        "ce-logits" => {
            cross_entropy_from_logits(&proj.forward(h)?, &x.targets, &config(args).ce)?.loss
        }
        "ce-hidden" => {
            let cfg = config(args);
            cross_entropy_from_hidden(h, &proj, &x.targets, &cfg.ce, &blocks(args, None))?.loss
        }
        "matmul" => {
            // The three products of the loss's forward and backward, as candle's CPU matmul
            // computes them: H Wᵀ [R, V], G W [R, D], Gᵀ H [V, D].
            let [b, s, d, _, v] = args.shape;
            let rows = h.reshape((b * s, d))?;
            let w = x.weight.as_tensor();
            let logits = rows.matmul(&w.t()?)?;
            let g = logits.matmul(w)?;
            let gw = logits.t()?.matmul(&rows)?;
            let _ = (g, gw, v);
            return Ok(());
        }
        other => panic!("unknown variant {other}"),
    };
    let grads = loss.backward()?;
    assert!(grads.get(x.hidden.as_tensor()).is_some() || variant == "matmul");
    Ok(())
}

/// Mean entropy (nats) of the softmax rows of the logits, measured on up to 256 rows.
fn mean_entropy(x: &Inputs) -> Result<f64> {
    let (b, s, d) = x.hidden.dims3()?;
    let rows = x
        .hidden
        .as_tensor()
        .reshape((b * s, d))?
        .narrow(0, 0, (b * s).min(256))?;
    let logits = rows
        .matmul(&x.weight.as_tensor().t()?)?
        .to_dtype(DType::F64)?;
    let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
    let entropy = (log_p.exp()? * &log_p)?.sum(1)?.neg()?.mean_all()?;
    entropy.to_scalar::<f64>()
}

/// The share of the backward's `rows of a block × vocab_tile` tiles whose probabilities all lie
/// below `--filter` (the tiles gradient filtering skips), over up to 8 blocks spread over the
/// rows, blocks sized as the hidden path sizes them.
fn skipped_tile_share(x: &Inputs, args: &Args) -> Result<f64> {
    let [b, s, d, _, v] = args.shape;
    let rows = b * s;
    let block = (args.block_elements / v).max(1).min(rows);
    let tile = args.vocab_tile.min(v);
    let hidden = x.hidden.as_tensor().reshape((rows, d))?;
    let (mut skipped, mut tiles) = (0usize, 0usize);
    let blocks = rows.div_ceil(block);
    for k in 0..blocks.min(8) {
        let start = k * blocks / blocks.min(8) * block;
        let n = block.min(rows - start);
        let logits = hidden
            .narrow(0, start, n)?
            .matmul(&x.weight.as_tensor().t()?)?;
        // Each column's largest probability over the block's rows, then per tile.
        let column_max = candle_nn::ops::softmax_last_dim(&logits)?
            .max(0)?
            .to_vec1::<f32>()?;
        for tile in column_max.chunks(tile) {
            skipped += usize::from(tile.iter().all(|&p| f64::from(p) < args.filter));
            tiles += 1;
        }
    }
    Ok(skipped as f64 / tiles as f64)
}

/// `(rss_extra_mib, heap_peak_mib)` of one step in this process.
fn memory_of(variant: &str, x: &Inputs, args: &Args) -> Result<(f64, f64)> {
    let live_before = LIVE.load(Ordering::Relaxed);
    PEAK.store(live_before, Ordering::Relaxed);
    let rss_before = status_kib("VmRSS:").unwrap_or(0);
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    step(variant, x, args)?;
    let rss_peak = status_kib("VmHWM:").unwrap_or(0);
    let heap = PEAK.load(Ordering::Relaxed) - live_before;
    Ok((
        rss_peak.saturating_sub(rss_before) as f64 / 1024.0,
        heap as f64 / (1 << 20) as f64,
    ))
}

fn median_min_max(times: &[f64]) -> (f64, f64, f64) {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    (
        sorted[sorted.len() / 2],
        sorted[0],
        sorted[sorted.len() - 1],
    )
}

fn main() -> Result<()> {
    let args = parse_args();
    let x = inputs(&args)?;
    if let Some(variant) = &args.memory_of {
        let (rss, heap) = memory_of(variant, &x, &args)?;
        println!("{rss} {heap}");
        return Ok(());
    }
    let [b, s, d, t, v] = args.shape;
    let skipped_share = skipped_tile_share(&x, &args)?;
    println!(
        "device: cpu ({} rayon threads); [B,S,D,T,V] = [{b},{s},{d},{t},{v}] f32; peaked σ = {}, zipf α = {}: mean row entropy {:.3} nats (ln V = {:.3}); filter τ = {:e} skips {:.1} % of the backward's tiles",
        rayon::current_num_threads(),
        args.peaked,
        args.zipf,
        mean_entropy(&x)?,
        (v as f64).ln(),
        args.filter,
        100.0 * skipped_share
    );
    // Memory: one child process per variant.
    let exe = std::env::current_exe().expect("the bench's path");
    let mut memory = Vec::new();
    for variant in &args.variants {
        let mut child_args: Vec<String> = std::env::args().skip(1).collect();
        child_args.extend(["--memory-of".into(), variant.clone()]);
        let output = std::process::Command::new(&exe).args(&child_args).output();
        let parsed = output.ok().and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).to_string();
            let mut it = text.split_whitespace().map(|w| w.parse::<f64>().ok());
            Some((it.next()??, it.next()??))
        });
        memory.push(parsed);
    }
    // Time: variants alternated round by round, after one warm-up each.
    for variant in &args.variants {
        step(variant, &x, &args)?;
    }
    let mut times = vec![Vec::new(); args.variants.len()];
    for _ in 0..args.rounds {
        for (i, variant) in args.variants.iter().enumerate() {
            let start = Instant::now();
            step(variant, &x, &args)?;
            times[i].push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let baseline = args
        .variants
        .iter()
        .position(|v| v == "logits")
        .map(|i| median_min_max(&times[i]).0);
    println!(
        "{:<10} {:>10} {:>19} {:>11} {:>13} {:>13}",
        "variant", "median ms", "min-max ms", "vs logits", "RSS peak MiB", "heap peak MiB"
    );
    let mut rows = Vec::new();
    for (i, variant) in args.variants.iter().enumerate() {
        let (median, min, max) = median_min_max(&times[i]);
        let ratio = baseline.map(|b| median / b);
        let (rss, heap) = memory[i].unwrap_or((f64::NAN, f64::NAN));
        println!(
            "{variant:<10} {median:>10.1} {:>19} {:>11} {rss:>13.1} {heap:>13.1}",
            format!("{min:.1}-{max:.1}"),
            ratio.map_or("-".into(), |r| format!("{r:.3}")),
        );
        rows.push(serde_json::json!({
            "variant": variant,
            "runs_ms": times[i],
            "median_ms": median,
            "vs_logits": ratio,
            "rss_peak_extra_mib": memory[i].map(|m| m.0),
            "heap_peak_extra_mib": memory[i].map(|m| m.1),
        }));
    }
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "shape": args.shape,
            "rounds": args.rounds,
            "filter": args.filter,
            "form": format!("{:?}", args.form),
            "peaked": args.peaked,
            "zipf": args.zipf,
            "skipped_tile_share": skipped_share,
            "block_elements": args.block_elements,
            "vocab_tile": args.vocab_tile,
            "mean_entropy_nats": mean_entropy(&x)?,
            "threads": rayon::current_num_threads(),
            "results": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json).unwrap()).expect("writing --json");
    }
    Ok(())
}
