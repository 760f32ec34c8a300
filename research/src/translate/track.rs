//! What a study writes while its runs train: the progress projection ([`StudyProgress`]) and
//! `log.csv`, one row per dev evaluation (`run,objective,seed,step,train_loss,train_ce,
//! dev_bleu,seconds`).

use anyhow::Result;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use super::run::{RunSpec, RunState};
use crate::progress::{format_duration, StudyProgress};

/// A study's progress and its `log.csv`.
pub struct Tracker {
    /// The projected end.
    pub progress: StudyProgress,
    log: std::fs::File,
}

impl Tracker {
    /// Opens (appending to) `dir/log.csv`, writing its header when new, with the progress of
    /// `plan` (`(kind, steps)` of every run to come).
    pub fn open(dir: &Path, plan: &[(String, usize)]) -> Result<Self> {
        let log_path = dir.join("log.csv");
        let fresh_log = !log_path.exists();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        if fresh_log {
            writeln!(
                log,
                "run,objective,seed,step,train_loss,train_ce,dev_bleu,seconds"
            )?;
        }
        Ok(Self {
            progress: StudyProgress::new(plan),
            log,
        })
    }

    /// Trains (or resumes, or loads) one run: `train(on_step)` runs it, calling `on_step`
    /// after every step; its new dev evaluations go to `log.csv` as `label,kind,...`, its
    /// steps to the progress of `kind`, and the steps it does not run (an early stop, a run
    /// finished in an earlier session) leave the plan.
    pub fn train<O>(
        &mut self,
        label: &str,
        kind: &str,
        spec: &RunSpec<O>,
        train: impl FnOnce(&mut dyn FnMut(&RunState<O>)) -> Result<RunState<O>>,
    ) -> Result<RunState<O>> {
        let planned = spec.max_steps;
        let progress = &mut self.progress;
        let log = &mut self.log;
        // Evaluations up to this step are in log.csv already (a resumed run's earlier ones).
        let mut logged_to: Option<usize> = None;
        let mut executed = 0usize;
        let mut tick = Instant::now();
        let started = Instant::now();
        let state = train(&mut |state: &RunState<O>| {
            // Called once per step run in this session (a resumed run's earlier steps are
            // neither recorded nor planned again); wall time, evaluations included.
            progress.record(kind, 1, tick.elapsed().as_secs_f64());
            tick = Instant::now();
            executed += 1;
            let from = *logged_to.get_or_insert(state.step - 1);
            let fresh: Vec<_> = state
                .evals
                .iter()
                .filter(|e| e.step > from || (e.step == 0 && from == 0 && executed == 1))
                .collect();
            for eval in &fresh {
                let _ = writeln!(
                    log,
                    "{label},{kind},{},{},{},{},{:.2},{:.1}",
                    spec.seed,
                    eval.step,
                    eval.train_loss.map_or(String::new(), |v| format!("{v:.4}")),
                    eval.train_ce.map_or(String::new(), |v| format!("{v:.4}")),
                    eval.dev_bleu,
                    state.train_seconds + state.eval_seconds
                );
                let _ = log.flush();
            }
            let fresh = !fresh.is_empty();
            if let Some(last) = state.evals.last() {
                logged_to = Some(last.step.max(from));
            }
            let mut dev = String::new();
            match state.evals.last() {
                Some(e) => {
                    let _ = write!(
                        dev,
                        "dev BLEU {:.2} at step {}, best {:.2} at {}",
                        e.dev_bleu, e.step, state.best_dev_bleu, state.best_step
                    );
                }
                None => dev.push_str("no dev evaluation yet"),
            }
            progress.show(
                &format!(
                    "{label}: step {}/{} ({:.0} ms/step), {dev}",
                    state.step,
                    spec.max_steps,
                    state.ms_per_step(),
                ),
                fresh,
            );
        })?;
        self.progress.unplan(kind, planned.saturating_sub(executed));
        self.progress.println(&format!(
            "{label}: best dev BLEU {:.2} at step {} of {} ({:.0} ms/step, {} this session)",
            state.best_dev_bleu,
            state.best_step,
            state.step,
            state.ms_per_step(),
            format_duration(started.elapsed().as_secs_f64())
        ));
        Ok(state)
    }
}
