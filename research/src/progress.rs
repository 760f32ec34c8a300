//! Progress bars (indicatif) for training runs, and printing beside them; [`StudyProgress`],
//! the projected end of a long study (a bar on a terminal, plain lines when the output goes to
//! a file). Its projection weighs the planned steps of each kind of run by the seconds per step
//! measured so far for that kind (a kind not yet measured counts at the mean of the others), so
//! a study whose objectives cost differently per step is projected honestly.

use anyhow::Result;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A bar of `len` steps added to `bars`, labelled `prefix` right-aligned in `prefix_width`
/// columns: `      ce seed 1 [=====>    ] 50/150 00:00:12 ce 3.412 -logBLEU 4.1 dev 12.30`.
pub fn bar(
    bars: &MultiProgress,
    prefix: String,
    prefix_width: usize,
    len: usize,
) -> Result<ProgressBar> {
    let bar = bars.add(ProgressBar::new(len as u64));
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{prefix:>{prefix_width}}} [{{bar:30}}] {{pos}}/{{len}} {{elapsed_precise}} {{msg}}"
        ))?
        .progress_chars("=> "),
    );
    bar.set_prefix(prefix);
    Ok(bar)
}

/// Prints `line` above the bars, or on stdout when they are hidden (indicatif drops
/// `println` when its bars are hidden, i.e. when the output is not a terminal).
pub fn say(bars: &MultiProgress, line: String) -> Result<()> {
    if bars.is_hidden() {
        println!("{line}");
    } else {
        bars.println(line)?;
    }
    Ok(())
}

/// Planned and completed work of a study.
pub struct StudyProgress {
    /// Per kind: (planned steps, completed steps, seconds spent).
    kinds: BTreeMap<String, (f64, f64, f64)>,
    /// Per kind: the estimated seconds per step, used until the kind has measured steps.
    estimates: BTreeMap<String, f64>,
    started: Instant,
    bar: Option<ProgressBar>,
    last_line: Instant,
    line_every: Duration,
}

impl StudyProgress {
    /// A progress report; `plan` is `(kind, steps)` for every run to come.
    pub fn new(plan: &[(String, usize)]) -> Self {
        let mut kinds = BTreeMap::new();
        for (kind, steps) in plan {
            kinds.entry(kind.clone()).or_insert((0.0, 0.0, 0.0)).0 += *steps as f64;
        }
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {percent:>3}% {msg}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar
        });
        Self {
            kinds,
            estimates: BTreeMap::new(),
            started: Instant::now(),
            bar,
            last_line: Instant::now(),
            line_every: Duration::from_secs(30),
        }
    }

    /// Adds planned work discovered later (e.g. runs whose step count depends on early
    /// stopping).
    pub fn plan(&mut self, kind: &str, steps: usize) {
        self.kinds
            .entry(kind.to_string())
            .or_insert((0.0, 0.0, 0.0))
            .0 += steps as f64;
    }

    /// The estimated `seconds` per step of `kind`, which the projection uses until `kind` has
    /// measured steps. Without one, an unmeasured kind takes the mean measured rate of the
    /// others, which is wrong when the kinds' steps differ (a distillation chunk against a
    /// training step).
    pub fn estimate(&mut self, kind: &str, seconds: f64) {
        self.estimates.insert(kind.to_string(), seconds);
    }

    /// Records `steps` completed steps of `kind` that took `seconds`.
    pub fn record(&mut self, kind: &str, steps: usize, seconds: f64) {
        let entry = self
            .kinds
            .entry(kind.to_string())
            .or_insert((0.0, 0.0, 0.0));
        entry.1 += steps as f64;
        entry.2 += seconds;
    }

    /// Removes planned steps that will not run (an early stop).
    pub fn unplan(&mut self, kind: &str, steps: usize) {
        if let Some(entry) = self.kinds.get_mut(kind) {
            entry.0 = (entry.0 - steps as f64).max(entry.1);
        }
    }

    /// Seconds still to go, from the measured rates.
    pub fn remaining_seconds(&self) -> f64 {
        let measured: Vec<f64> = self
            .kinds
            .values()
            .filter(|k| k.1 > 0.0)
            .map(|k| k.2 / k.1)
            .collect();
        let fallback = if measured.is_empty() {
            0.0
        } else {
            measured.iter().sum::<f64>() / measured.len() as f64
        };
        self.kinds
            .iter()
            .map(|(kind, &(planned, done, seconds))| {
                let rate = if done > 0.0 {
                    seconds / done
                } else {
                    self.estimates.get(kind).copied().unwrap_or(fallback)
                };
                (planned - done).max(0.0) * rate
            })
            .sum()
    }

    fn fraction(&self) -> f64 {
        let remaining = self.remaining_seconds();
        let spent: f64 = self.kinds.values().map(|k| k.2).sum();
        if spent + remaining > 0.0 {
            spent / (spent + remaining)
        } else {
            0.0
        }
    }

    /// Shows `message` with the projection: on the bar, or as a line at most every 30 s
    /// (`force` prints one now).
    pub fn show(&mut self, message: &str, force: bool) {
        let remaining = self.remaining_seconds();
        let eta = format_duration(remaining);
        let text = format!("{message} | about {eta} to go");
        match &self.bar {
            Some(bar) => {
                bar.set_position((1000.0 * self.fraction()) as u64);
                bar.set_message(text);
            }
            None => {
                if force || self.last_line.elapsed() >= self.line_every {
                    eprintln!(
                        "[{} elapsed, {:>3.0}%] {text}",
                        format_duration(self.started.elapsed().as_secs_f64()),
                        100.0 * self.fraction()
                    );
                    self.last_line = Instant::now();
                }
            }
        }
    }

    /// Prints a line above the bar (or as a line).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `1h02m`, `4m05s`, `12s`.
pub fn format_duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}
