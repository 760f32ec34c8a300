//! `curves.png` (dev BLEU, cross-entropy and teacher-forced `-log BLEU` against the step, one
//! line per run, coloured by objective) and `averaging.png` (the averaging-effect measures per
//! objective, mean over seeds with a min–max bar).

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::path::Path;

use crate::arms::LogRow;
use crate::RunOutput;

/// Registers the shipped DejaVu Sans as "sans-serif" for plotters' pure-Rust text renderer,
/// so drawing needs no system font library (fontconfig) on the machine.
fn register_font() -> Result<()> {
    static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow!("plot: cannot load assets/DejaVuSans.ttf"))
}

/// A colour per objective (tab20-like, distinguishable for a dozen arms).
fn colour(index: usize) -> RGBColor {
    const PALETTE: [RGBColor; 12] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(0, 0, 0),
        RGBColor(255, 187, 120),
    ];
    PALETTE[index % PALETTE.len()]
}

struct Panel {
    title: &'static str,
    value: fn(&LogRow) -> f64,
    /// `log10` of the value on a linear axis labelled with the value.
    log_scale: bool,
}

fn curve_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    spec: &Panel,
    runs: &[RunOutput],
    names: &[&str],
    warmup: usize,
    legend: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let plot_err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot: {e}");
    let y = |row: &LogRow| {
        let v = (spec.value)(row);
        match spec.log_scale {
            true if v > 0.0 && v.is_finite() => Some(v.log10()),
            false if v.is_finite() => Some(v),
            _ => None,
        }
    };
    let points = |run: &RunOutput| -> Vec<(f64, f64)> {
        run.log
            .iter()
            .filter_map(|row| y(row).map(|v| (row.step as f64, v)))
            .collect()
    };
    let steps = runs
        .iter()
        .flat_map(|r| r.log.iter().map(|row| row.step))
        .max()
        .unwrap_or(1) as f64;
    let ys: Vec<f64> = runs.iter().flat_map(&points).map(|(_, v)| v).collect();
    let low = ys.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (low, high) = if low.is_finite() && high > low {
        (low - 0.05 * (high - low), high + 0.05 * (high - low))
    } else {
        (0.0, 1.0)
    };
    let log_scale = spec.log_scale;
    let mut chart = ChartBuilder::on(area)
        .caption(spec.title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..steps, low..high)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|v| {
            let v = if log_scale { 10f64.powf(*v) } else { *v };
            format!("{v:.2}")
        })
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(plot_err)?;
    let grey = RGBColor(120, 120, 120);
    if warmup > 0 && (warmup as f64) < steps {
        let x = warmup as f64;
        chart
            .draw_series(LineSeries::new(
                vec![(x, low), (x, high)],
                grey.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label("end of CE warm-up")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2))
            });
    }
    let mut labelled = Vec::new();
    for run in runs {
        let index = names.iter().position(|n| *n == run.arm.name).unwrap_or(0);
        let series = chart
            .draw_series(LineSeries::new(
                points(run),
                colour(index).mix(0.8).stroke_width(2),
            ))
            .map_err(plot_err)?;
        if !labelled.contains(&index) {
            labelled.push(index);
            let c = colour(index);
            series.label(run.arm.name).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3))
            });
        }
    }
    if legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(plot_err)?;
    }
    Ok(())
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
    for (i, (area, spec)) in areas.iter().zip(&panels).enumerate() {
        curve_panel(area, spec, runs, names, warmup, i == 0)?;
    }
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}

/// One measure per objective: a bar at the mean over seeds, a line from min to max, and an
/// optional dashed reference value.
fn bar_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    values: &[(usize, Vec<f64>)],
    reference: Option<(f64, &str)>,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let plot_err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot: {e}");
    let high = values
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .chain(reference.map(|r| r.0))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.15;
    let n = values.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(10)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..n as f64, 0f64..high)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_label_formatter(&|v| format!("{v:.2}"))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(plot_err)?;
    for (slot, (arm, seeds)) in values.iter().enumerate() {
        let finite: Vec<f64> = seeds.iter().copied().filter(|v| v.is_finite()).collect();
        if finite.is_empty() {
            continue;
        }
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let x = slot as f64;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x + 0.15, 0.0), (x + 0.85, mean)],
                colour(*arm).filled(),
            )))
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(
                vec![(x + 0.5, lo), (x + 0.5, hi)],
                BLACK.stroke_width(2),
            ))
            .map_err(plot_err)?;
        // The objective's number (the key's) above its bar.
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{}", arm + 1),
                (x + 0.4, hi.max(mean) + 0.07 * high),
                ("sans-serif", 14),
            )))
            .map_err(plot_err)?;
    }
    if let Some((value, label)) = reference {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, value), (n as f64, value)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(plot_err)?
            .label(label)
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(1)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(plot_err)?;
    }
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
    let per_arm = |value: fn(&crate::eval::Measures) -> f64| -> Vec<(usize, Vec<f64>)> {
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
