//! Plot pieces the examples draw their figures with (plotters, pure-Rust PNG): the shipped
//! font, a palette, a panel of training curves and a panel of bars per objective.

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Registers the shipped DejaVu Sans (`assets/DejaVuSans.ttf`) as "sans-serif" for plotters'
/// pure-Rust text renderer, so drawing needs no system font library (fontconfig).
pub fn register_font() -> Result<()> {
    static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow!("plot: cannot load assets/DejaVuSans.ttf"))
}

/// Twelve distinguishable colours (tab20-like), one per objective.
pub const PALETTE: [RGBColor; 12] = [
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

/// The palette's colour for objective number `index` (cycling).
pub fn colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// One line of a curve panel: a run's points, drawn in `colour`; the legend names each
/// distinct `label` once (for the first line that has it).
#[derive(Debug, Clone)]
pub struct Curve {
    /// Legend entry.
    pub label: String,
    /// Line colour.
    pub colour: RGBColor,
    /// `(step, y)` points; for a log-scale panel `y` is already `log10` of the value.
    pub points: Vec<(f64, f64)>,
}

/// Sizes and styles of a curve panel (font sizes and areas in pixels).
#[derive(Debug, Clone, Copy)]
pub struct CurveStyle {
    /// Caption font size.
    pub caption: u32,
    /// Margin around the chart.
    pub margin: u32,
    /// Height of the x label area.
    pub x_label_area: u32,
    /// Width of the y label area.
    pub y_label_area: u32,
    /// Number of y labels, if not plotters' default.
    pub y_labels: Option<usize>,
    /// Tick label font size.
    pub label_size: u32,
    /// Opacity of the lines.
    pub line_alpha: f64,
    /// Stroke width of the legend's line samples.
    pub legend_stroke: u32,
    /// Opacity of the legend's white background.
    pub legend_background: f64,
    /// Legend font size.
    pub legend_font: u32,
}

/// What a curve panel shows.
#[derive(Debug, Clone)]
pub struct CurvePanel<'a> {
    /// Caption.
    pub title: &'a str,
    /// The points are `log10` values: the axis labels show `10^y`.
    pub log_scale: bool,
    /// The x axis runs from 0 to this step.
    pub x_max: f64,
    /// A grey vertical line at this step with this legend entry, when inside `(0, x_max)`
    /// (e.g. where the BLEU term starts).
    pub marker: Option<(f64, &'a str)>,
    /// Where to draw the legend; `None` draws none.
    pub legend: Option<SeriesLabelPosition>,
    /// Sizes and styles.
    pub style: CurveStyle,
}

/// Draws `curves` against the step into `area`. The y range is the points' range padded by
/// 5 % (a single value `v` gives `[min(v, 0), max(v, 0) + 1]`, no points `[0, 1]`).
pub fn curve_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &CurvePanel,
    curves: &[Curve],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let plot_err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot: {e}");
    let style = panel.style;
    let ys = curves.iter().flat_map(|c| c.points.iter().map(|&(_, y)| y));
    let low = ys.clone().fold(f64::INFINITY, f64::min);
    let high = ys.fold(f64::NEG_INFINITY, f64::max);
    let (low, high) = if low.is_finite() && high > low {
        (low - 0.05 * (high - low), high + 0.05 * (high - low))
    } else if low.is_finite() {
        (low.min(0.0), low.max(0.0) + 1.0)
    } else {
        (0.0, 1.0)
    };
    let log_scale = panel.log_scale;
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", style.caption))
        .margin(style.margin)
        .x_label_area_size(style.x_label_area)
        .y_label_area_size(style.y_label_area)
        .build_cartesian_2d(0f64..panel.x_max, low..high)
        .map_err(plot_err)?;
    let x_label = |x: &f64| format!("{x:.0}");
    let y_label = |y: &f64| {
        let v = if log_scale { 10f64.powf(*y) } else { *y };
        format!("{v:.2}")
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc("step")
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .label_style(("sans-serif", style.label_size));
    if let Some(n) = style.y_labels {
        mesh.y_labels(n);
    }
    mesh.draw().map_err(plot_err)?;
    let grey = RGBColor(120, 120, 120);
    if let Some((x, label)) = panel.marker {
        if x > 0.0 && x < panel.x_max {
            chart
                .draw_series(LineSeries::new(
                    vec![(x, low), (x, high)],
                    grey.stroke_width(2),
                ))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2))
                });
        }
    }
    let mut labelled: Vec<&str> = Vec::new();
    for curve in curves {
        let series = chart
            .draw_series(LineSeries::new(
                curve.points.iter().copied(),
                curve.colour.mix(style.line_alpha).stroke_width(2),
            ))
            .map_err(plot_err)?;
        if !labelled.contains(&curve.label.as_str()) {
            labelled.push(&curve.label);
            let (c, stroke) = (curve.colour, style.legend_stroke);
            series.label(curve.label.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(stroke))
            });
        }
    }
    if let Some(position) = &panel.legend {
        chart
            .configure_series_labels()
            .position(position.clone())
            .background_style(WHITE.mix(style.legend_background))
            .border_style(BLACK)
            .label_font(("sans-serif", style.legend_font))
            .draw()
            .map_err(plot_err)?;
    }
    Ok(())
}

/// One measure per objective: for each `(objective number, values over seeds)` a bar in the
/// objective's [`colour`] at the mean of the finite values, a line from their min to max and
/// the objective's number (1-based) above it, plus an optional dashed reference value with a
/// legend entry.
pub fn bar_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
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
