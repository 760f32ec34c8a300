//! What the tests that run research examples share.

use std::path::Path;
use std::process::Command;

/// `cargo run --example <name> -- <args>` in this test binary's profile, target directory and
/// features, from the workspace root: the same package selection as the workspace's
/// `cargo test` (both default members), so the same feature unification, and `cargo run`
/// reuses this build instead of compiling another.
pub fn example_command(name: &str, args: &[&str]) -> Command {
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("research/ is inside the workspace");
    let mut command = Command::new(env!("CARGO"));
    command
        .current_dir(workspace)
        .args(["run", "--quiet", "--example", name]);
    // The features this test was built with: `cargo run` then reuses this build of the crate
    // instead of compiling another.
    let features: Vec<&str> = [
        ("cli", cfg!(feature = "cli")),
        ("cuda", cfg!(feature = "cuda")),
        ("cudnn", cfg!(feature = "cudnn")),
        ("metal", cfg!(feature = "metal")),
        ("mkl", cfg!(feature = "mkl")),
        ("accelerate", cfg!(feature = "accelerate")),
        ("mpi", cfg!(feature = "mpi")),
        ("nccl", cfg!(feature = "nccl")),
    ]
    .into_iter()
    .filter_map(|(feature, on)| on.then_some(feature))
    .collect();
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
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
    command.arg("--").args(args);
    command
}
