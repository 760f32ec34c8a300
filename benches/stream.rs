//! The machine's limits for the fused loss kernels (issue 11): memory bandwidth (STREAM copy
//! and triad on 1 and 2 threads), the compute rate of the fused forward on cache-resident
//! logits (a row maximum, one vectorised f32 `exp` and a sum per element), the cost
//! of first-touch page faults on a fresh `[B, S, V]` buffer, and the cost of candle's gradient
//! accumulation (`zeros_like` + `add`, done by `backprop.rs` for every gradient), then the floor
//! these imply for a fused loss at `[32·64, 32000]` f32.
//!
//! ```text
//! cargo bench --bench stream
//! ```

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;
use std::time::Instant;

/// Elements of each STREAM array: 64 Mi f32 = 256 MiB, the size of the `[32,64,32000]` logits
/// (far beyond every cache).
const STREAM_LEN: usize = 64 << 20;
/// `[B·S, V]` of the loss benchmark's large shape.
const ROWS: usize = 32 * 64;
const VOCAB: usize = 32_000;
const REPEATS: usize = 9;

struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

fn time_runs(repeats: usize, mut f: impl FnMut()) -> Stats {
    f();
    let mut times: Vec<f64> = (0..repeats)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    Stats {
        median: times[times.len() / 2],
        min: times[0],
        max: times[times.len() - 1],
    }
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool")
}

const CHUNK: usize = 1 << 16;

/// STREAM's bandwidths in GB/s (bytes counted as STREAM does: 2 arrays for copy, 3 for triad),
/// from the best run (STREAM's convention) and the median.
fn stream(threads: usize) -> ((f64, f64), (f64, f64)) {
    let pool = pool(threads);
    let a = vec![1.0f32; STREAM_LEN];
    let mut b = vec![2.0f32; STREAM_LEN];
    let mut c = vec![0.5f32; STREAM_LEN];
    let bytes = (STREAM_LEN * 4) as f64;
    let copy = pool.install(|| {
        time_runs(REPEATS, || {
            b.par_chunks_mut(CHUNK)
                .zip(a.par_chunks(CHUNK))
                .for_each(|(dst, src)| dst.copy_from_slice(src));
        })
    });
    let triad = pool.install(|| {
        time_runs(REPEATS, || {
            c.par_chunks_mut(CHUNK)
                .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
                .for_each(|(dst, (x, y))| {
                    for ((d, &x), &y) in dst.iter_mut().zip(x).zip(y) {
                        *d = x + 3.0 * y;
                    }
                });
        })
    });
    std::hint::black_box((&b, &c));
    (
        (
            2.0 * bytes / copy.min / 1e9,
            2.0 * bytes / copy.median / 1e9,
        ),
        (
            3.0 * bytes / triad.min / 1e9,
            3.0 * bytes / triad.median / 1e9,
        ),
    )
}

/// Logits per second through the fused cross-entropy's forward on cache-resident logits
/// (`[1, 64, 4096]` f32, 1 MiB), best run: the kernel's compute rate per element (a row
/// maximum, one `exp` and a sum) when memory bandwidth is not the limit.
fn compute_rate(threads: usize) -> f64 {
    const ROWS_RESIDENT: usize = 64;
    const VOCAB_RESIDENT: usize = 4096;
    const CALLS: usize = 50;
    let pool = pool(threads);
    let logits =
        Tensor::randn(0f32, 1.0, (1, ROWS_RESIDENT, VOCAB_RESIDENT), &Device::Cpu).expect("logits");
    let targets = Tensor::zeros((1, ROWS_RESIDENT), DType::U32, &Device::Cpu).expect("targets");
    let cfg = candle_bleu::loss::CrossEntropyConfig::default();
    let stats = pool.install(|| {
        time_runs(REPEATS, || {
            for _ in 0..CALLS {
                let loss = candle_bleu::loss::cross_entropy_from_logits(&logits, &targets, &cfg);
                let _ = std::hint::black_box(loss.expect("cross-entropy"));
            }
        })
    });
    (ROWS_RESIDENT * VOCAB_RESIDENT * CALLS) as f64 / stats.min
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(buffer: &mut [f32]) {
    // SAFETY: advice over a range inside the live allocation; never changes its contents.
    unsafe {
        let start = buffer.as_mut_ptr() as usize;
        let aligned = (start + (2 << 20) - 1) & !((2 << 20) - 1);
        let end = (start + buffer.len() * 4) & !((2 << 20) - 1);
        if end > aligned {
            libc::madvise(
                aligned as *mut libc::c_void,
                end - aligned,
                libc::MADV_HUGEPAGE,
            );
        }
    }
}
#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_: &mut [f32]) {}

/// Writing a `[ROWS, VOCAB]` f32 buffer on 2 threads: fresh (first-touch page faults), fresh
/// with `MADV_HUGEPAGE`, and already resident. Medians in seconds.
fn page_faults() -> (Stats, Stats, Stats) {
    let pool = pool(2);
    let len = ROWS * VOCAB;
    let fill = |buffer: &mut [f32]| {
        buffer
            .par_chunks_mut(VOCAB)
            .for_each(|row| row.iter_mut().for_each(|x| *x = 1.0));
    };
    pool.install(|| {
        let fresh = time_runs(REPEATS, || {
            let mut buffer = vec![0f32; len];
            fill(&mut buffer);
            std::hint::black_box(&buffer);
        });
        let huge = time_runs(REPEATS, || {
            let mut buffer = vec![0f32; len];
            advise_huge_pages(&mut buffer);
            fill(&mut buffer);
            std::hint::black_box(&buffer);
        });
        let mut resident = vec![0f32; len];
        let warm = time_runs(REPEATS, || {
            fill(&mut resident);
            std::hint::black_box(&resident);
        });
        (fresh, huge, warm)
    })
}

fn main() -> Result<()> {
    println!(
        "cores: {} | STREAM arrays: {} MiB each, best (median) of {REPEATS}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        (STREAM_LEN * 4) >> 20
    );
    let mut bandwidth_2 = 0.0;
    for threads in [1, 2] {
        let ((copy_best, copy_median), (triad_best, triad_median)) = stream(threads);
        println!(
            "STREAM {threads} thread(s): copy {copy_best:.1} ({copy_median:.1}) GB/s, triad {triad_best:.1} ({triad_median:.1}) GB/s"
        );
        if threads == 2 {
            bandwidth_2 = triad_best;
        }
    }
    let mut compute_2 = 0.0;
    for threads in [1, 2] {
        let rate = compute_rate(threads);
        println!(
            "fused forward on cache-resident f32 logits, {threads} thread(s): {:.2} G logits/s",
            rate / 1e9
        );
        if threads == 2 {
            compute_2 = rate;
        }
    }

    let (fresh, huge, warm) = page_faults();
    let mib = (ROWS * VOCAB * 4) as f64 / (1 << 20) as f64;
    println!(
        "writing a [{ROWS}, {VOCAB}] f32 buffer ({mib:.0} MiB), 2 threads, median (min-max) ms:\n  fresh pages {:.1} ({:.1}-{:.1}) | fresh + MADV_HUGEPAGE {:.1} ({:.1}-{:.1}) | resident {:.1} ({:.1}-{:.1})",
        fresh.median * 1e3, fresh.min * 1e3, fresh.max * 1e3,
        huge.median * 1e3, huge.min * 1e3, huge.max * 1e3,
        warm.median * 1e3, warm.min * 1e3, warm.max * 1e3,
    );

    let gradient = Tensor::ones((ROWS, VOCAB), DType::F32, &Device::Cpu)?;
    let accumulate = time_runs(REPEATS, || {
        let sum = gradient.zeros_like().and_then(|z| z.add(&gradient));
        let _ = std::hint::black_box(sum.expect("add"));
    });
    println!(
        "candle's gradient accumulation on [{ROWS}, {VOCAB}] f32 (zeros_like + add, as backprop.rs does per gradient): median {:.1} ms ({:.1}-{:.1})",
        accumulate.median * 1e3, accumulate.min * 1e3, accumulate.max * 1e3
    );

    // Around the faults of the accumulation: glibc serves blocks this large by mmap and unmaps
    // them on free, so every step's gradient lands on fresh pages. Raising the mmap and trim
    // thresholds keeps freed blocks in the heap for reuse (process-wide, the user's choice).
    #[cfg(target_os = "linux")]
    {
        // SAFETY: mallopt only changes glibc's allocation thresholds.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 2 << 30);
        }
        let reused = time_runs(REPEATS, || {
            let sum = gradient.zeros_like().and_then(|z| z.add(&gradient));
            let _ = std::hint::black_box(sum.expect("add"));
        });
        println!(
            "the same after mallopt(M_MMAP_THRESHOLD = 1 GiB, M_TRIM_THRESHOLD = 2 GiB), freed blocks reused: median {:.1} ms ({:.1}-{:.1})",
            reused.median * 1e3, reused.min * 1e3, reused.max * 1e3
        );
    }

    // A fused loss reads the logits once forward (one exp per element), reads them again and
    // writes the gradient backward (one exp per element).
    let bytes = (ROWS * VOCAB * 4) as f64;
    let elements = (ROWS * VOCAB) as f64;
    let forward_floor = bytes / (bandwidth_2 * 1e9) + elements / compute_2;
    let backward_floor = 2.0 * bytes / (bandwidth_2 * 1e9) + elements / compute_2;
    println!(
        "floor of a fused loss at [{ROWS}, {VOCAB}] f32 (triad bandwidth, 2-thread compute rate): forward {:.1} ms, backward {:.1} ms, total {:.1} ms",
        forward_floor * 1e3,
        backward_floor * 1e3,
        (forward_floor + backward_floor) * 1e3
    );
    Ok(())
}
