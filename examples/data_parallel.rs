//! Data-parallel training with cross-entropy + corpus BLEU over MPI.
//!
//! ```sh
//! cargo build --release --features mpi --example data_parallel
//! mpirun -np 2 target/release/examples/data_parallel --check      # add --allow-run-as-root as root,
//!                                                                 # --oversubscribe on fewer cores
//! RAYON_NUM_THREADS=1 mpirun -np 2 target/release/examples/data_parallel --time
//! mpirun -np <GPUs> target/release/examples/data_parallel --nccl   # built with --features mpi,nccl
//! ```
//!
//! Every rank builds the same model (rank 0's initial parameters are broadcast), generates the
//! same global batch each step and takes its shard (`shard_range`), computes the loss of the
//! **global** batch from its shard (`DataParallel::ce_bleu_from_logits`, or with `--from-hidden`
//! `DataParallel::ce_bleu_from_hidden` from the states before the output layer: one small
//! all-reduce of the BLEU statistics and the cross-entropy's sum and token count), backpropagates, sums the
//! parameter gradients over the ranks (`DataParallel::sum_gradients`: one all-reduce) and steps
//! AdamW. After every step the ranks compare a hash of their parameters: they must be
//! bit-identical. Rank 0 evaluates (greedy decode, exact corpus BLEU) and prints.
//!
//! `--check` also runs, on rank 0, the single-process computation on the whole global batch:
//! each step, its loss and gradients at the data-parallel parameters (N ranks × B/N must equal
//! 1 × B, to f32 round-off; `--f64` for f64), and a second model trained on one process beside
//! the data-parallel one (the two training curves). `--time` prints the step time.
//!
//! The task: translate a sequence token by token, where a token's translation depends on its
//! left neighbour (one of two fixed permutations); the model is embeddings of the token and of
//! its left neighbour, plus a position embedding, a tanh layer and the output projection.

use anyhow::{bail, Context, Result};
use candle_bleu::exact::{corpus_bleu, BleuConfig};
use candle_bleu::loss::distributed::{self, mpi, AllReduce, DataParallel, MpiAllReduce};
use candle_bleu::loss::{
    ce_bleu_from_logits, BleuLossConfig, CrossEntropyConfig, HiddenConfig, References,
    TrainingLossConfig, TrainingTargets,
};
use candle_core::{DType, Device, Module, Tensor, Var, D};
use candle_nn::{AdamW, Embedding, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use clap::Parser;
use mpi::collective::Root;
use mpi::topology::Communicator;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

const PAD: u32 = 0;
/// Ids below this are special (PAD and one unused id); words are `FIRST_WORD..vocab`.
const FIRST_WORD: u32 = 2;

#[derive(Parser, Debug, Clone)]
#[command(about = "Data-parallel CE + BLEU training over MPI (launch with mpirun -np N)")]
struct Args {
    /// Training steps.
    #[arg(long, default_value_t = 40)]
    steps: usize,
    /// Global batch size (split over the ranks as evenly as possible).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Longest sequence; lengths are drawn from [seq/2, seq].
    #[arg(long, default_value_t = 32)]
    seq: usize,
    /// Vocabulary size (>= 4).
    #[arg(long, default_value_t = 1000)]
    vocab: usize,
    /// Embedding width.
    #[arg(long, default_value_t = 64)]
    dim: usize,
    /// Hidden width.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Weight λ of the BLEU loss.
    #[arg(long, default_value_t = 0.5)]
    lambda: f64,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seed of the task and of the initial parameters.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Train in f64 instead of f32.
    #[arg(long)]
    f64: bool,
    /// Rank 0 also computes the single-process loss and gradients on the whole global batch each
    /// step, and trains a single-process model beside the data-parallel one.
    #[arg(long)]
    check: bool,
    /// Print the step time (rank 0's wall time of each step after the warm-up).
    #[arg(long)]
    time: bool,
    /// Steps left out of the timing.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Evaluate every this many steps (0: only at the end).
    #[arg(long, default_value_t = 10)]
    eval_every: usize,
    /// Held-out sentences for the evaluation.
    #[arg(long, default_value_t = 256)]
    eval_size: usize,
    /// Also time this many all-reduces of a parameter-sized buffer alone (after a barrier, so
    /// that the ranks start together): the collective's own cost, without waiting for a slower
    /// rank's compute.
    #[arg(long, default_value_t = 0)]
    allreduce_reps: usize,
    /// All-reduce with NCCL on GPUs (needs `--features nccl`): rank r uses CUDA device
    /// `OMPI_COMM_WORLD_LOCAL_RANK` (else r); the NCCL id is broadcast over MPI.
    #[arg(long)]
    nccl: bool,
    /// Each rank's loss from the hidden states and the output layer
    /// (`DataParallel::ce_bleu_from_hidden`, the `[B, S, V]` logits never stored) instead of
    /// from the logits (`DataParallel::ce_bleu_from_logits`).
    #[arg(long)]
    from_hidden: bool,
}

/// The synthetic translation task: two permutations of the words; a word's translation is
/// `perms[c][word]` with `c` = whether its left neighbour is in the upper half of the words.
struct Task {
    perms: [Vec<u32>; 2],
    vocab: usize,
    seq: usize,
}

/// A batch: source ids, the source shifted right (each position's left neighbour, PAD first),
/// target ids (PAD-padded), lengths.
struct Batch {
    src: Tensor,
    prev: Tensor,
    targets: Tensor,
    lengths: Tensor,
}

impl Task {
    fn new(vocab: usize, seq: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let words: Vec<u32> = (FIRST_WORD..vocab as u32).collect();
        let mut perm = || {
            let mut shuffled = words.clone();
            shuffled.shuffle(&mut rng);
            let mut table = vec![PAD; vocab];
            for (&w, &t) in words.iter().zip(&shuffled) {
                table[w as usize] = t;
            }
            table
        };
        Self {
            perms: [perm(), perm()],
            vocab,
            seq,
        }
    }

    /// `size` sentences from `seed`: the same on every rank.
    fn batch(&self, size: usize, seed: u64, device: &Device) -> Result<Batch> {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut src, mut prev, mut tgt, mut lengths) = (vec![], vec![], vec![], vec![]);
        let half = (FIRST_WORD as usize + self.vocab) / 2;
        for _ in 0..size {
            let len = rng.gen_range(self.seq.div_ceil(2)..=self.seq);
            let mut left = PAD;
            for i in 0..self.seq {
                if i < len {
                    let w = rng.gen_range(FIRST_WORD..self.vocab as u32);
                    let context = usize::from(left as usize >= half);
                    src.push(w);
                    prev.push(left);
                    tgt.push(self.perms[context][w as usize]);
                    left = w;
                } else {
                    src.push(PAD);
                    prev.push(PAD);
                    tgt.push(PAD);
                }
            }
            lengths.push(len as u32);
        }
        let shape = (size, self.seq);
        Ok(Batch {
            src: Tensor::from_vec(src, shape, device)?,
            prev: Tensor::from_vec(prev, shape, device)?,
            targets: Tensor::from_vec(tgt, shape, device)?,
            lengths: Tensor::from_vec(lengths, size, device)?,
        })
    }
}

impl Batch {
    fn shard(&self, start: usize, len: usize) -> Result<Batch> {
        Ok(Batch {
            src: self.src.narrow(0, start, len)?,
            prev: self.prev.narrow(0, start, len)?,
            targets: self.targets.narrow(0, start, len)?,
            lengths: self.lengths.narrow(0, start, len)?,
        })
    }
}

/// Embeddings of the token, its left neighbour and its position; tanh layer; output projection.
struct Model {
    token: Embedding,
    left: Embedding,
    position: Embedding,
    hidden: Linear,
    output: Linear,
}

impl Model {
    fn new(vb: VarBuilder, args: &Args) -> Result<Self> {
        Ok(Self {
            token: candle_nn::embedding(args.vocab, args.dim, vb.pp("token"))?,
            left: candle_nn::embedding(args.vocab, args.dim, vb.pp("left"))?,
            position: candle_nn::embedding(args.seq, args.dim, vb.pp("position"))?,
            hidden: candle_nn::linear(args.dim, args.hidden, vb.pp("hidden"))?,
            output: candle_nn::linear(args.hidden, args.vocab, vb.pp("output"))?,
        })
    }

    /// Logits `[B, S, V]`.
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        Ok(self.output.forward(&self.states(batch)?)?)
    }

    /// The states before the output layer, `[B, S, hidden]`.
    fn states(&self, batch: &Batch) -> Result<Tensor> {
        let (b, s) = batch.src.dims2()?;
        let positions = Tensor::arange(0u32, s as u32, batch.src.device())?
            .unsqueeze(0)?
            .broadcast_as((b, s))?
            .contiguous()?;
        let x = (self.token.forward(&batch.src)? + self.left.forward(&batch.prev)?)?
            .add(&self.position.forward(&positions)?)?;
        Ok(self.hidden.forward(&x)?.tanh()?)
    }
}

/// A model with its parameters in a fixed order and its optimizer.
struct Trainer {
    model: Model,
    vars: Vec<Var>,
    opt: AdamW,
}

impl Trainer {
    fn new(args: &Args, dtype: DType, device: &Device) -> Result<Self> {
        let varmap = VarMap::new();
        let model = Model::new(VarBuilder::from_varmap(&varmap, dtype, device), args)?;
        let vars = distributed::vars_by_name(&varmap);
        let params = ParamsAdamW {
            lr: args.lr,
            ..Default::default()
        };
        let opt = AdamW::new(vars.clone(), params)?;
        Ok(Self { model, vars, opt })
    }

    /// All parameters, flattened in `vars` order, as f64.
    fn flat(&self) -> Result<Vec<f64>> {
        let parts: Vec<Tensor> = self
            .vars
            .iter()
            .map(|v| v.as_tensor().flatten_all()?.to_dtype(DType::F64))
            .collect::<candle_core::Result<_>>()?;
        Ok(Tensor::cat(&parts, 0)?.to_vec1::<f64>()?)
    }
}

/// An [`AllReduce`] that also measures the time spent in it.
struct Timed<R> {
    inner: R,
    spent: Cell<Duration>,
}

impl<R: AllReduce> AllReduce for Timed<R> {
    fn sum(&self, t: &Tensor) -> candle_core::Result<Tensor> {
        let start = Instant::now();
        let out = self.inner.sum(t);
        self.spent.set(self.spent.get() + start.elapsed());
        out
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn rank(&self) -> usize {
        self.inner.rank()
    }
}

/// FNV-1a over the bits of every parameter.
fn parameter_hash(values: &[f64]) -> u64 {
    let mut hash = 0xcbf29ce484222325u64;
    for v in values {
        for byte in v.to_bits().to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x100000001b3);
        }
    }
    hash
}

/// Greedy decode of the held-out set; exact corpus BLEU (sacrebleu's default smoothing) on ids.
fn evaluate(model: &Model, eval: &Batch) -> Result<f64> {
    let predicted = model.forward(eval)?.argmax(D::Minus1)?.to_vec2::<u32>()?;
    let targets = eval.targets.to_vec2::<u32>()?;
    let lengths = eval.lengths.to_vec1::<u32>()?;
    let hyps: Vec<Vec<u32>> = predicted
        .iter()
        .zip(&lengths)
        .map(|(p, &l)| p[..l as usize].to_vec())
        .collect();
    let refs: Vec<Vec<Vec<u32>>> = targets
        .iter()
        .zip(&lengths)
        .map(|(t, &l)| vec![t[..l as usize].to_vec()])
        .collect();
    Ok(corpus_bleu(&hyps, &refs, &BleuConfig::default())?.score)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The loss configuration: CE (PAD ignored) + λ · corpus BLEU (expected form, given lengths).
fn loss_config(args: &Args) -> TrainingLossConfig {
    TrainingLossConfig {
        bleu_weight: args.lambda,
        ce: CrossEntropyConfig {
            pad_id: Some(PAD),
            label_smoothing: 0.0,
            ..Default::default()
        },
        bleu: BleuLossConfig::default(),
    }
}

/// What rank 0 records for `--check`.
#[derive(Default)]
struct CheckLog {
    worst_loss: f64,
    worst_grad: f64,
    worst_curve: f64,
}

fn run<R: AllReduce>(
    args: &Args,
    world: &mpi::topology::SimpleCommunicator,
    reduce: R,
    device: Device,
) -> Result<()> {
    let reduce = Timed {
        inner: reduce,
        spent: Cell::new(Duration::ZERO),
    };
    let (rank, size) = (reduce.rank(), reduce.world_size());
    // The data-parallel losses and helpers over the ranks: the single-process calls' arguments.
    let group = DataParallel::new(&reduce);
    let leader = rank == 0;
    if args.vocab < 4 || args.seq < 2 || args.batch < size {
        bail!("need --vocab >= 4, --seq >= 2 and --batch >= the number of ranks ({size})");
    }
    let dtype = if args.f64 { DType::F64 } else { DType::F32 };
    let cfg = loss_config(args);
    let task = Task::new(args.vocab, args.seq, args.seed);
    let eval = task.batch(args.eval_size, u64::MAX - args.seed, &device)?;

    // Rank 0's random initialisation on every rank; the single-process twin starts from it too.
    let mut dp = Trainer::new(args, dtype, &device)?;
    group.broadcast_parameters(&dp.vars)?;
    let twin = if leader && args.check {
        let twin = Trainer::new(args, dtype, &device)?;
        for (t, v) in twin.vars.iter().zip(&dp.vars) {
            t.set(v.as_tensor())?;
        }
        Some(RefCell::new(twin))
    } else {
        None
    };
    let (start, len) = distributed::shard_range(args.batch, rank, size)?;
    if leader {
        println!(
            "data_parallel: {size} rank(s) x {} thread(s) on {:?}, global batch {} ({} per rank on rank 0), seq {}, vocab {}, {} parameters, {:?}",
            candle_core::utils::get_num_threads(),
            device,
            args.batch,
            len,
            args.seq,
            args.vocab,
            dp.flat()?.len(),
            dtype
        );
    }

    let mut step_ms = Vec::new();
    let mut reduce_ms = Vec::new();
    let mut log = CheckLog::default();
    for step in 0..args.steps {
        let global = task.batch(args.batch, args.seed * 1_000_003 + step as u64, &device)?;
        let shard = global.shard(start, len)?;

        let started = Instant::now();
        reduce.spent.set(Duration::ZERO);
        let refs = References::from_ids(&shard.targets, PAD)?;
        let targets = TrainingTargets::new(&shard.targets, &refs).with_hyp_lengths(&shard.lengths);
        let out = if args.from_hidden {
            let states = dp.model.states(&shard)?;
            let blocks = HiddenConfig::default();
            let proj = &dp.model.output;
            group.ce_bleu_from_hidden(&states, proj, &targets, &cfg, &blocks)?
        } else {
            let logits = dp.model.forward(&shard)?;
            group.ce_bleu_from_logits(&logits, &targets, &cfg)?
        };
        let mut grads = out.loss.backward()?;
        group.sum_gradients(&mut grads, &dp.vars)?;
        let before_check = started.elapsed();
        // --check: the single-process loss and gradients at the parameters the step starts from.
        let checked = match &twin {
            Some(_) => Some(check_step(&dp, &global, &cfg, &grads, &out.loss)?),
            None => None,
        };
        let optimizer_started = Instant::now();
        dp.opt.step(&grads)?;
        // The step's time, without the check's work.
        let elapsed = (before_check + optimizer_started.elapsed()).as_secs_f64();
        if step >= args.warmup {
            step_ms.push(elapsed * 1e3);
            reduce_ms.push(reduce.spent.get().as_secs_f64() * 1e3);
        }

        // Identical parameters on every rank: rank 0's hash against each rank's own.
        let mut hash = parameter_hash(&dp.flat()?);
        let own = hash;
        world.process_at_rank(0).broadcast_into(&mut hash);
        let mismatch = Tensor::new(&[f32::from(u8::from(own != hash))], &device)?;
        let mismatches = reduce.inner.sum(&mismatch)?.to_vec1::<f32>()?[0];
        if mismatches != 0.0 {
            bail!("step {step}: the parameters differ on {mismatches} rank(s)");
        }

        if let (Some((d_loss, d_grad, single_loss)), Some(twin)) = (checked, &twin) {
            let curve = twin_step(&mut twin.borrow_mut(), &global, &cfg)?;
            let loss = out.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            log.worst_loss = log.worst_loss.max(d_loss);
            log.worst_grad = log.worst_grad.max(d_grad);
            log.worst_curve = log.worst_curve.max((loss - curve).abs());
            println!(
                "check step {step}: loss {loss:.6} (1 x B: {single_loss:.6}) |dloss| {d_loss:.2e} max|dgrad|/max|grad| {d_grad:.2e}; single-process twin's loss {curve:.6}"
            );
        } else if leader && (step % 10 == 0 || step + 1 == args.steps) {
            let loss = out.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            let ce = out.cross_entropy.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            let bleu = out.bleu.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            println!(
                "step {step}: loss {loss:.4} (CE {ce:.4}, soft BLEU {:.4}), {:.1} ms",
                (-bleu).exp(),
                elapsed * 1e3
            );
        }
        if leader && args.eval_every > 0 && (step + 1) % args.eval_every == 0 {
            println!(
                "eval after step {step}: test BLEU {:.2}",
                evaluate(&dp.model, &eval)?
            );
        }
    }

    if args.allreduce_reps > 0 {
        let buffer = Tensor::ones(dp.flat()?.len(), dtype, &device)?;
        let mut times = Vec::with_capacity(args.allreduce_reps);
        for _ in 0..args.allreduce_reps {
            mpi::collective::CommunicatorCollectives::barrier(world);
            let started = Instant::now();
            let total = reduce.inner.sum(&buffer)?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
            drop(total);
        }
        if leader {
            println!(
                "all-reduce alone: {} elements {dtype:?} on {size} rank(s), {} reps: median {:.3} ms (min {:.3})",
                buffer.elem_count(),
                times.len(),
                median(&mut times.clone()),
                times.iter().copied().fold(f64::INFINITY, f64::min)
            );
        }
    }
    if leader {
        println!(
            "parameters identical on all {size} ranks after each of the {} steps (hash compared every step)",
            args.steps
        );
        println!("final test BLEU {:.2}", evaluate(&dp.model, &eval)?);
        if let Some(twin) = &twin {
            let twin = twin.borrow();
            let drift = dp
                .flat()?
                .iter()
                .zip(twin.flat()?)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            println!(
                "check: {size} ranks x B/{size} vs 1 x B over {} steps: max |dloss| {:.2e}, max |dgrad|/max|grad| {:.2e}",
                args.steps, log.worst_loss, log.worst_grad
            );
            println!(
                "check: training curves (data-parallel vs single-process twin): max |dloss| {:.2e}, final max |dparameter| {drift:.2e}, twin's test BLEU {:.2}",
                log.worst_curve,
                evaluate(&twin.model, &eval)?
            );
        }
        if args.time && !step_ms.is_empty() {
            let n = step_ms.len();
            let (min, max) = (
                step_ms.iter().copied().fold(f64::INFINITY, f64::min),
                step_ms.iter().copied().fold(0.0, f64::max),
            );
            println!(
                "step time: {size} rank(s) x {} thread(s), steps {}..{}: median {:.2} ms (min {min:.2}, max {max:.2}), all-reduces {:.2} ms median",
                candle_core::utils::get_num_threads(),
                args.warmup,
                args.warmup + n,
                median(&mut step_ms),
                median(&mut reduce_ms)
            );
        }
    }
    Ok(())
}

/// Rank 0, `--check`: the single-process loss and gradients on the whole global batch at the
/// data-parallel parameters, against the data-parallel loss and summed gradients. Returns
/// `(|Δloss|, max|Δgrad| / max|grad|, single-process loss)`.
fn check_step(
    dp: &Trainer,
    global: &Batch,
    cfg: &TrainingLossConfig,
    dp_grads: &candle_core::backprop::GradStore,
    dp_loss: &Tensor,
) -> Result<(f64, f64, f64)> {
    let logits = dp.model.forward(global)?;
    let refs = References::from_ids(&global.targets, PAD)?;
    let single = ce_bleu_from_logits(
        &logits,
        &TrainingTargets::new(&global.targets, &refs).with_hyp_lengths(&global.lengths),
        cfg,
    )?;
    let grads = single.loss.backward()?;
    let (mut worst, mut scale) = (0.0f64, 0.0f64);
    for var in &dp.vars {
        let g1 = grads
            .get(var.as_tensor())
            .context("a single-process gradient")?
            .to_dtype(DType::F64)?;
        let gn = dp_grads
            .get(var.as_tensor())
            .context("a data-parallel gradient")?
            .to_dtype(DType::F64)?;
        worst = worst.max((&g1 - &gn)?.abs()?.max_all()?.to_scalar::<f64>()?);
        scale = scale.max(g1.abs()?.max_all()?.to_scalar::<f64>()?);
    }
    let single_loss = single.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    let dp_loss = dp_loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    Ok((
        (single_loss - dp_loss).abs(),
        worst / scale.max(f64::MIN_POSITIVE),
        single_loss,
    ))
}

/// One single-process training step of the twin on the whole global batch; its loss.
fn twin_step(twin: &mut Trainer, global: &Batch, cfg: &TrainingLossConfig) -> Result<f64> {
    let logits = twin.model.forward(global)?;
    let refs = References::from_ids(&global.targets, PAD)?;
    let out = ce_bleu_from_logits(
        &logits,
        &TrainingTargets::new(&global.targets, &refs).with_hyp_lengths(&global.lengths),
        cfg,
    )?;
    let loss = out.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    twin.opt.backward_step(&out.loss)?;
    Ok(loss)
}

/// Runs on the CPU with MPI's all-reduce, or with `--nccl` on this rank's GPU with NCCL's.
fn start(args: &Args, world: &mpi::topology::SimpleCommunicator) -> Result<()> {
    if args.nccl {
        #[cfg(feature = "nccl")]
        {
            let local_rank = std::env::var("OMPI_COMM_WORLD_LOCAL_RANK")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(world.rank() as usize);
            let device = Device::new_cuda(local_rank)?;
            let reduce = distributed::NcclAllReduce::from_mpi(&device, world)?;
            return run(args, world, reduce, device);
        }
        #[cfg(not(feature = "nccl"))]
        bail!("--nccl needs the example built with `--features mpi,nccl`");
    }
    run(
        args,
        world,
        MpiAllReduce::new(world.duplicate()),
        Device::Cpu,
    )
}

fn main() {
    let args = Args::parse();
    let universe = mpi::initialize().expect("MPI initialises once");
    let world = universe.world();
    if let Err(e) = start(&args, &world) {
        // A collective waits for every rank: abort all of them rather than leave them waiting.
        eprintln!("rank {}: error: {e:#}", world.rank());
        world.abort(1);
    }
}
