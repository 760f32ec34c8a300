//! Progress bars (indicatif) for training runs, and printing beside them.

use anyhow::Result;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

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
