//! `curves.png`: dev BLEU, cross-entropy and `-log BLEU` against the training step, one line
//! per run, coloured by objective (drawn with `crate::plot`).

use crate::plot::{colour, curve_panel, register_font, Curve, CurvePanel, CurveStyle};
use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::path::Path;

use super::train::{Objective, RunOutput};
use crate::train::LogRow;

const STYLE: CurveStyle = CurveStyle {
    caption: 22,
    margin: 12,
    x_label_area: 40,
    y_label_area: 60,
    y_labels: Some(10),
    label_size: 14,
    line_alpha: 0.85,
    legend_stroke: 2,
    legend_background: 0.8,
    legend_font: 16,
};

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

    /// The line of one run.
    fn curve(&self, run: &RunOutput) -> Curve {
        Curve {
            label: run.objective.name().to_string(),
            colour: colour(match run.objective {
                Objective::CrossEntropy => 0,
                Objective::CeThenBleu => 1,
            }),
            points: run
                .log
                .iter()
                .filter(|row| row.step >= self.from_step)
                .filter_map(|row| self.y(row).map(|y| (row.step as f64, y)))
                .collect(),
        }
    }
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
        let curves: Vec<Curve> = runs.iter().map(|run| spec.curve(run)).collect();
        let panel = CurvePanel {
            title: &spec.title,
            log_scale: spec.log_scale,
            x_max: steps.max(1) as f64,
            marker: Some((bleu_start as f64, "BLEU term starts")),
            legend: Some(spec.legend_at.clone()),
            style: STYLE,
        };
        curve_panel(area, &panel, &curves)?;
    }
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}
