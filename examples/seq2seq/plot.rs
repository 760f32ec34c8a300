//! `curves.png`: dev BLEU, cross-entropy and `-log BLEU` against the training step, one line
//! per run, coloured by objective.

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::path::Path;

use crate::train::{LogRow, Objective, RunOutput};

/// Registers the shipped DejaVu Sans as "sans-serif" for plotters' pure-Rust text renderer,
/// so drawing needs no system font library (fontconfig) on the machine.
fn register_font() -> Result<()> {
    static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow!("plot: cannot load assets/DejaVuSans.ttf"))
}

fn colour(objective: Objective) -> RGBColor {
    match objective {
        Objective::CrossEntropy => RGBColor(31, 119, 180),
        Objective::CeThenBleu => RGBColor(214, 39, 40),
    }
}

/// What one panel shows.
struct Panel {
    title: String,
    value: fn(&LogRow) -> f64,
    /// A log y axis: the losses fall by an order of magnitude in the first steps, and a log
    /// axis keeps the late differences visible. Drawn as `log10(value)` on a linear axis
    /// whose labels show the value, so that it gets evenly spaced labels.
    log_scale: bool,
    /// Rows before this step are left out (dev BLEU climbs from ~30 to ~78 in the first
    /// steps, which would flatten the differences that matter).
    from_step: usize,
    legend_at: SeriesLabelPosition,
}

impl Panel {
    /// The plotted y of a log row, if it can be drawn.
    fn y(&self, row: &LogRow) -> Option<f64> {
        let v = (self.value)(row);
        match self.log_scale {
            true if v > 0.0 && v.is_finite() => Some(v.log10()),
            false if v.is_finite() => Some(v),
            _ => None,
        }
    }

    /// The points of one run.
    fn points(&self, run: &RunOutput) -> Vec<(f64, f64)> {
        run.log
            .iter()
            .filter(|row| row.step >= self.from_step)
            .filter_map(|row| self.y(row).map(|y| (row.step as f64, y)))
            .collect()
    }
}

/// One panel: the panel's value against the step for every run.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    spec: &Panel,
    runs: &[RunOutput],
    bleu_start: usize,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let plot_err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot: {e}");
    let steps = runs
        .iter()
        .flat_map(|r| r.log.iter().map(|row| row.step))
        .max()
        .unwrap_or(1) as f64;
    let ys: Vec<f64> = runs
        .iter()
        .flat_map(|r| spec.points(r))
        .map(|(_, y)| y)
        .collect();
    let low = ys.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (low, high) = if low.is_finite() && high > low {
        (low - 0.05 * (high - low), high + 0.05 * (high - low))
    } else {
        (low.min(0.0), low.max(0.0) + 1.0)
    };
    let log_scale = spec.log_scale;
    let mut chart = ChartBuilder::on(area)
        .caption(spec.title.as_str(), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..steps, low..high)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_labels(10)
        .y_label_formatter(&|y| {
            let v = if log_scale { 10f64.powf(*y) } else { *y };
            format!("{v:.2}")
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(plot_err)?;
    let grey = RGBColor(120, 120, 120);
    if bleu_start > 0 && (bleu_start as f64) < steps {
        let x = bleu_start as f64;
        chart
            .draw_series(LineSeries::new(
                vec![(x, low), (x, high)],
                grey.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label("BLEU term starts")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2))
            });
    }
    let mut labelled = Vec::new();
    for run in runs {
        let style = colour(run.objective).mix(0.85).stroke_width(2);
        let series = chart
            .draw_series(LineSeries::new(spec.points(run), style))
            .map_err(plot_err)?;
        if !labelled.contains(&run.objective) {
            labelled.push(run.objective);
            let legend = colour(run.objective);
            series.label(run.objective.name()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], legend.stroke_width(2))
            });
        }
    }
    chart
        .configure_series_labels()
        .position(spec.legend_at.clone())
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

/// Draws the three panels into `path` (PNG).
pub fn curves(path: &Path, runs: &[RunOutput], bleu_start: usize) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1500, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let panels = root.split_evenly((1, 3));
    let steps = runs
        .iter()
        .flat_map(|r| r.log.iter().map(|row| row.step))
        .max()
        .unwrap_or(0);
    let zoom_from = if steps >= 8 { steps / 4 } else { 0 };
    let specs = [
        Panel {
            title: format!("dev BLEU (greedy), from step {zoom_from}"),
            value: |r| r.dev_bleu,
            log_scale: false,
            from_step: zoom_from,
            legend_at: SeriesLabelPosition::LowerRight,
        },
        Panel {
            title: "train cross-entropy (log scale)".into(),
            value: |r| r.ce_loss,
            log_scale: true,
            from_step: 0,
            legend_at: SeriesLabelPosition::UpperRight,
        },
        Panel {
            title: "train -log BLEU, teacher-forced (log scale)".into(),
            value: |r| r.bleu_loss,
            log_scale: true,
            from_step: 0,
            legend_at: SeriesLabelPosition::UpperRight,
        },
    ];
    for (area, spec) in panels.iter().zip(&specs) {
        panel(area, spec, runs, bleu_start)?;
    }
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}
