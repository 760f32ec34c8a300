//! Data parallelism over a real MPI job (feature `mpi`): `mpirun -np 2` runs this test binary's
//! ignored entry point [`mpi_rank`] as two ranks, each computing its shard of the f64 fixture of
//! `tests/distributed.rs` through `MpiAllReduce`, from the logits and from the hidden states
//! (`DataParallel::ce_bleu_from_logits`, `DataParallel::ce_bleu_from_hidden`), against the
//! single-process loss and gradients of the whole batch; and runs `examples/data_parallel` on two ranks (f64 and f32), checking
//! what it reports. Skipped, with a note, when `mpirun` is not on the PATH
//! (`scripts/install-mpi.sh` installs Open MPI).

mod distributed_fixture;

use candle_bleu::loss::distributed::mpi::collective::{CommunicatorCollectives, Root};
use candle_bleu::loss::distributed::mpi::topology::Communicator;
use candle_bleu::loss::distributed::{mpi, AllReduce, MpiAllReduce};
use candle_core::{DType, Device, Tensor};
use distributed_fixture::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Set for the ranks that `mpirun` starts: the entry point runs only then.
const RANK_VAR: &str = "CANDLE_BLEU_MPI_RANK_TEST";

/// `mpirun` and the flags it needs here, or `None` (with a note on stderr) when it is absent.
/// Open MPI refuses to run as root without `--allow-run-as-root`, and more ranks than cores
/// without `--oversubscribe`; both are harmless otherwise.
fn mpirun(test: &str) -> Option<Command> {
    let version = Command::new("mpirun").arg("--version").output();
    let Ok(version) = version else {
        // Written to stderr directly, past the test harness's capture, so that it shows.
        let _ = writeln!(
            std::io::stderr(),
            "note: {test} skipped: `mpirun` is not on the PATH (scripts/install-mpi.sh installs Open MPI)"
        );
        return None;
    };
    let mut command = Command::new("mpirun");
    if String::from_utf8_lossy(&version.stdout).contains("Open MPI") {
        command.args(["--oversubscribe", "--allow-run-as-root"]);
    }
    command.args(["-np", "2"]);
    Some(command)
}

/// Runs `command`; its stdout, or a panic with both outputs unless it exits with status 0.
fn run(mut command: Command) -> String {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().expect("mpirun starts");
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    assert!(
        status.success(),
        "{command:?} exited with {status}\n--- stdout\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&stderr)
    );
    stdout
}

/// The number after `key` on the first line of `out` that contains it.
fn number_after(out: &str, key: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.contains(key))
        .unwrap_or_else(|| panic!("no line with {key:?} in\n{out}"));
    let rest = &line[line.find(key).unwrap() + key.len()..];
    let token: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        .collect();
    token
        .parse()
        .unwrap_or_else(|_| panic!("no number after {key:?} in {line:?}"))
}

#[test]
fn two_mpi_ranks_give_the_single_process_loss_and_gradients() {
    let Some(mut command) = mpirun("two_mpi_ranks_give_the_single_process_loss_and_gradients")
    else {
        return;
    };
    let exe = std::env::current_exe().expect("this test binary");
    command
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            "mpi_rank",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(RANK_VAR, "1");
    let out = run(command);
    for rank in 0..2 {
        let key = format!("rank {rank} of 2: 144 configurations, max relative difference");
        let d = number_after(&out, &key);
        assert!(d < 1e-12, "rank {rank}: {d:e}\n{out}");
    }
    assert!(
        out.contains("rank 0 of 2: all-reduce of f32, f64, f16, bf16, u8, u32, i64 ok"),
        "{out}"
    );
}

/// The ranks' side of the test above: run by `mpirun`, ignored otherwise.
#[test]
#[ignore = "an MPI rank: started by two_mpi_ranks_give_the_single_process_loss_and_gradients"]
fn mpi_rank() {
    if std::env::var(RANK_VAR).is_err() {
        eprintln!("mpi_rank runs only under mpirun (see two_mpi_ranks_give_the_single_process_loss_and_gradients)");
        return;
    }
    let universe = mpi::initialize().expect("MPI initialises once");
    let reduce = MpiAllReduce::new(universe.world());
    let (rank, size) = (reduce.rank(), reduce.world_size());
    assert_eq!(size, 2);

    // The all-reduce itself, every dtype: rank r contributes r + 1 (and 0.5 in floats).
    let dev = Device::Cpu;
    for dtype in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::U8,
        DType::U32,
        DType::I64,
    ] {
        let local = Tensor::new(&[[rank as f64 + 1.0, 2.0], [0.0, 4.0]], &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let total = reduce.sum(&local).unwrap();
        assert_eq!((total.dtype(), total.dims()), (dtype, &[2usize, 2][..]));
        let values = total
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        assert_eq!(values, vec![3.0, 4.0, 0.0, 8.0], "{dtype:?}");
    }
    if rank == 0 {
        println!("rank 0 of 2: all-reduce of f32, f64, f16, bf16, u8, u32, i64 ok");
    }

    // The fixture, split 3 + 2 (with `pad_shard`, rank 1's targets are all padding).
    let mut worst: f64 = 0.0;
    let mut count = 0;
    for pad_shard in [false, true] {
        let fixture = Fixture::new(pad_shard).unwrap();
        for (cfg, input) in configs()
            .into_iter()
            .flat_map(|cfg| [(cfg.clone(), Input::Logits), (cfg, Input::Hidden)])
        {
            let single = fixture.single(&cfg).unwrap();
            let outcome = fixture.worker_from(&cfg, &reduce, input).unwrap();
            let d = outcome.max_difference(&single);
            assert!(
                d < 1e-12,
                "rank {rank}, {input:?}, {}: {outcome:?} vs {single:?}",
                describe(&cfg)
            );
            worst = worst.max(d);
            // Both ranks hold the same loss and gradients, bit for bit.
            let mut bits: Vec<u64> = [outcome.loss, outcome.cross_entropy, outcome.bleu]
                .iter()
                .chain(&outcome.grad_weight)
                .chain(&outcome.grad_bias)
                .map(|v| v.to_bits())
                .collect();
            let own = bits.clone();
            reduce
                .communicator()
                .process_at_rank(0)
                .broadcast_into(&mut bits[..]);
            assert_eq!(
                own,
                bits,
                "rank {rank} differs from rank 0: {input:?}, {}",
                describe(&cfg)
            );
            count += 1;
        }
    }
    // Each rank prints in turn.
    for turn in 0..size {
        reduce.communicator().barrier();
        if turn == rank {
            println!(
                "rank {rank} of {size}: {count} configurations, max relative difference {worst:e}"
            );
        }
    }
}

/// `target/<profile>/examples/data_parallel`, built (a no-op after `cargo test`, which builds
/// the examples) with this test's features and profile.
fn data_parallel_example() -> PathBuf {
    let exe = std::env::current_exe().expect("this test binary");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let mut command = Command::new(env!("CARGO"));
    command.current_dir(env!("CARGO_MANIFEST_DIR")).args([
        "build",
        "--quiet",
        "--example",
        "data_parallel",
    ]);
    let features: Vec<&str> = [
        ("cli", cfg!(feature = "cli")),
        ("mpi", cfg!(feature = "mpi")),
        ("cuda", cfg!(feature = "cuda")),
        ("cudnn", cfg!(feature = "cudnn")),
        ("metal", cfg!(feature = "metal")),
        ("mkl", cfg!(feature = "mkl")),
        ("accelerate", cfg!(feature = "accelerate")),
        ("nccl", cfg!(feature = "nccl")),
    ]
    .into_iter()
    .filter_map(|(feature, on)| on.then_some(feature))
    .collect();
    command.args(["--features", &features.join(",")]);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("release") => command.arg("--release"),
        Some("debug") | None => command.args(["--profile", "test"]),
        Some(custom) => command.args(["--profile", custom]),
    };
    if let Some(target_dir) = profile_dir.parent() {
        if target_dir.join("CACHEDIR.TAG").exists() {
            command.arg("--target-dir").arg(target_dir);
        }
    }
    let status = command.status().expect("cargo starts");
    assert!(
        status.success(),
        "cargo build --example data_parallel failed"
    );
    profile_dir.join("examples").join("data_parallel")
}

#[test]
fn the_data_parallel_example_trains_like_one_process() {
    let test = "the_data_parallel_example_trains_like_one_process";
    if mpirun(test).is_none() {
        return;
    }
    let example = data_parallel_example();
    // f64: equal to round-off; f32: equal to f32 round-off. Batch 9 splits 5 + 4. Each rank's
    // loss from the logits, and from the hidden states (`--from-hidden`), against the
    // single-process loss from the logits.
    for (precision, dtype_args, loss_tol, grad_tol) in [
        ("f64", &["--f64"][..], 1e-12, 1e-10),
        (
            "f64 from hidden states",
            &["--f64", "--from-hidden"][..],
            1e-12,
            1e-10,
        ),
        ("f32", &[][..], 1e-5, 1e-4),
        ("f32 from hidden states", &["--from-hidden"][..], 1e-5, 1e-4),
    ] {
        let mut command = mpirun(test).expect("mpirun");
        command.arg(&example).args(dtype_args).args([
            "--check",
            "--steps",
            "6",
            "--batch",
            "9",
            "--seq",
            "8",
            "--vocab",
            "24",
            "--dim",
            "8",
            "--hidden",
            "16",
            "--eval-every",
            "3",
            "--eval-size",
            "16",
        ]);
        let out = run(command);
        assert!(
            out.contains("parameters identical on all 2 ranks after each of the 6 steps"),
            "{out}"
        );
        let key = "vs 1 x B over 6 steps: max |dloss|";
        let d_loss = number_after(&out, key);
        let d_grad = number_after(&out, "max |dgrad|/max|grad|");
        let d_curve = number_after(&out, "single-process twin): max |dloss|");
        eprintln!("{precision}: |dloss| {d_loss:e}, |dgrad| {d_grad:e}, curve {d_curve:e}");
        assert!(
            d_loss < loss_tol && d_curve < loss_tol,
            "{precision}\n{out}"
        );
        assert!(d_grad < grad_tol, "{precision}\n{out}");
        assert_eq!(out.matches("check step ").count(), 6, "{out}");
        assert!(out.contains("final test BLEU"), "{out}");
    }
}
