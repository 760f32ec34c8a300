//! `curves.png` (dev BLEU, cross-entropy and teacher-forced `-log BLEU` against the step, one
//! line per run, coloured by objective) and `averaging.png` (the averaging-effect measures per
//! objective, mean over seeds with a min–max bar), drawn with `crate::plot`.

use crate::eval::Measures;
use crate::plot::{bar_panel, colour, curve_panel, register_font, Curve, CurvePanel, CurveStyle};
use crate::train::LogRow;
use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::path::Path;

use super::run::RunOutput;

const STYLE: CurveStyle = CurveStyle {
    caption: 20,
    margin: 10,
    x_label_area: 36,
    y_label_area: 56,
    y_labels: None,
    label_size: 13,
    line_alpha: 0.8,
    legend_stroke: 3,
    legend_background: 0.85,
    legend_font: 13,
};

struct Panel {
    title: &'static str,
    value: fn(&LogRow) -> f64,
    /// `log10` of the value on a linear axis labelled with the value.
    log_scale: bool,
}

impl Panel {
    /// The line of one run, in its objective's colour.
    fn curve(&self, run: &RunOutput, names: &[&str]) -> Curve {
        let index = names.iter().position(|n| *n == run.arm.name).unwrap_or(0);
        let y = |row: &LogRow| {
            let v = (self.value)(row);
            match self.log_scale {
                true if v > 0.0 && v.is_finite() => Some(v.log10()),
                false if v.is_finite() => Some(v),
                _ => None,
            }
        };
        Curve {
            label: run.arm.name.to_string(),
            colour: colour(index),
            points: run
                .log
                .iter()
                .filter_map(|row| y(row).map(|v| (row.step as f64, v)))
                .collect(),
        }
    }
}

/// Draws the three panels of training curves into `path` (PNG).
pub fn curves(path: &Path, runs: &[RunOutput], names: &[&str], warmup: usize) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1800, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let areas = root.split_evenly((1, 3));
    let panels = [
        Panel {
            title: "dev BLEU (greedy)",
            value: |r| r.dev_bleu,
            log_scale: false,
        },
        Panel {
            title: "train cross-entropy (log scale)",
            value: |r| r.ce_loss,
            log_scale: true,
        },
        Panel {
            title: "train -log BLEU, teacher-forced expected/Given (log)",
            value: |r| r.bleu_loss,
            log_scale: true,
        },
    ];
    let steps = runs
        .iter()
        .flat_map(|r| r.log.iter().map(|row| row.step))
        .max()
        .unwrap_or(1) as f64;
    for (i, (area, spec)) in areas.iter().zip(&panels).enumerate() {
        let curves: Vec<Curve> = runs.iter().map(|run| spec.curve(run, names)).collect();
        let panel = CurvePanel {
            title: spec.title,
            log_scale: spec.log_scale,
            x_max: steps,
            marker: Some((warmup as f64, "end of CE warm-up")),
            legend: (i == 0).then_some(SeriesLabelPosition::LowerRight),
            style: STYLE,
        };
        curve_panel(area, &panel, &curves)?;
    }
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}

/// Draws the averaging-effect measures per objective into `path` (PNG): entropy,
/// argmax-is-another-position's-reference-token rate, repeated-token rate (with the
/// references' own rate), length ratio (with 1), and a legend of the objectives' numbers.
pub fn averaging(
    path: &Path,
    runs: &[RunOutput],
    names: &[&str],
    reference_repeats: f64,
) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1800, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let (top, bottom) = root.split_vertically(420);
    let top_areas = top.split_evenly((1, 2));
    let bottom_split = bottom.split_evenly((1, 3));
    let per_arm = |value: fn(&Measures) -> f64| -> Vec<(usize, Vec<f64>)> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let seeds = runs
                    .iter()
                    .filter(|r| r.arm.name == *name)
                    .map(|r| value(&r.measures))
                    .collect();
                (i, seeds)
            })
            .filter(|(_, seeds): &(usize, Vec<f64>)| !seeds.is_empty())
            .collect()
    };
    bar_panel(
        &top_areas[0],
        "entropy of the teacher-forced distribution (nats/position)",
        &per_arm(|m| m.entropy),
        None,
    )?;
    bar_panel(
        &top_areas[1],
        "argmax = a reference token of another position (share)",
        &per_arm(|m| m.argmax_other_ref_rate),
        None,
    )?;
    bar_panel(
        &bottom_split[0],
        "repeated-token rate, greedy decodes",
        &per_arm(|m| m.repeated_token_rate),
        Some((reference_repeats, "references")),
    )?;
    bar_panel(
        &bottom_split[1],
        "length ratio hyp/ref, greedy decodes",
        &per_arm(|m| m.length_ratio),
        Some((1.0, "1")),
    )?;
    // The key: bar number -> objective, in its colour.
    let key = &bottom_split[2];
    for (i, name) in names.iter().enumerate() {
        let y = 30 + 30 * i as i32;
        key.draw(&Rectangle::new([(20, y), (40, y + 18)], colour(i).filled()))
            .map_err(|e| anyhow!("plot: {e}"))?;
        key.draw(&Text::new(
            format!("{}  {name}", i + 1),
            (50, y),
            ("sans-serif", 17).into_font(),
        ))
        .map_err(|e| anyhow!("plot: {e}"))?;
    }
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}
