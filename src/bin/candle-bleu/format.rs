//! Output exactly as sacrebleu 2.6.0 prints it: Python float formatting, `json.dumps`, the
//! signature, `BLEUScore.format`, and the two `tabulate` 0.10 table formats sacrebleu uses for
//! several systems (`fancy_grid` for text, `latex_booktabs` for LaTeX); and the rendering of
//! what the command computed ([`MetricOut`]) in the format the options ask for ([`render`]).

use candle_bleu::exact::ter::TerConfig;
use candle_bleu::exact::tokenize::is_python_whitespace;
use candle_bleu::exact::BleuScore;

use crate::args::{Args, Format};
use crate::Options;

/// Python's `f"{x:.{width}f}"` (both round the exact binary value half to even).
pub fn fixed(x: f64, width: usize) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    format!("{x:.width$}")
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed notation when the
/// decimal exponent is in -4..16, else `d.ddde±XX`; always with a `.` or an exponent.
pub fn py_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0.0");
    }
    // The number of significant digits of the shortest string that round-trips; then that many
    // digits of the exact value, rounded half to even. Python (David Gay's dtoa) takes the
    // nearest of the shortest strings, ties to even, where Rust's shortest can round a tie up
    // (1.79779815673828125 is "1.7977981567382812" for Python, "1.7977981567382813" for `{:e}`).
    let shortest = format!("{:e}", x.abs());
    let n = shortest
        .split_once('e')
        .map_or(shortest.as_str(), |(m, _)| m)
        .bytes()
        .filter(u8::is_ascii_digit)
        .count();
    let sci = format!("{:.*e}", n.saturating_sub(1), x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(|&c| c != '.').collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    let decpt = exp + 1;
    let n = digits.len() as i32;
    let body = if decpt <= -4 || decpt > 16 {
        let m = if n == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    } else if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt >= n {
        format!("{digits}{}.0", "0".repeat((decpt - n) as usize))
    } else {
        let d = decpt as usize;
        format!("{}.{}", &digits[..d], &digits[d..])
    };
    format!("{sign}{body}")
}

/// A JSON value, written as Python's `json.dumps(value, indent=...)` writes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Int(i64),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// A number as Python holds it: an `int` when integral (and not too large), else a float.
    pub fn number(x: f64) -> Json {
        if x.fract() == 0.0 && x.abs() < 9e15 {
            Json::Int(x as i64)
        } else {
            Json::Float(x)
        }
    }

    /// `json.dumps(self, indent=indent, ensure_ascii=ensure_ascii)`.
    pub fn dumps(&self, indent: usize, ensure_ascii: bool) -> String {
        let mut out = String::new();
        self.write(&mut out, indent, 0, ensure_ascii);
        out
    }

    fn write(&self, out: &mut String, indent: usize, level: usize, ascii: bool) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Int(i) => out.push_str(&i.to_string()),
            Json::Float(x) => out.push_str(&json_float(*x)),
            Json::Str(s) => write_json_str(out, s, ascii),
            Json::Array(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (k, item) in items.iter().enumerate() {
                    if k > 0 {
                        out.push(',');
                    }
                    newline(out, indent, level + 1);
                    item.write(out, indent, level + 1, ascii);
                }
                newline(out, indent, level);
                out.push(']');
            }
            Json::Object(fields) => {
                if fields.is_empty() {
                    out.push_str("{}");
                    return;
                }
                out.push('{');
                for (k, (key, value)) in fields.iter().enumerate() {
                    if k > 0 {
                        out.push(',');
                    }
                    newline(out, indent, level + 1);
                    write_json_str(out, key, ascii);
                    out.push_str(": ");
                    value.write(out, indent, level + 1, ascii);
                }
                newline(out, indent, level);
                out.push('}');
            }
        }
    }
}

fn newline(out: &mut String, indent: usize, level: usize) {
    out.push('\n');
    out.extend(std::iter::repeat_n(' ', indent * level));
}

/// `json`'s float: `repr`, with `NaN`/`Infinity` for the non-finite values.
fn json_float(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        py_repr(x)
    }
}

/// A JSON string as Python's `json` encoder escapes it.
fn write_json_str(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// sacrebleu's reproducibility signature (`Signature` and `BLEUSignature`/`CHRFSignature`/
/// `TERSignature`):
/// fields in sacrebleu's order, `None` ones left out.
#[derive(Debug, Clone)]
pub struct Signature {
    pub nrefs: usize,
    pub bs: Option<usize>,
    pub ar: Option<usize>,
    pub seed: Option<String>,
    pub metric: MetricSignature,
}

/// The metric's own signature fields.
#[derive(Debug, Clone)]
pub enum MetricSignature {
    Bleu {
        lowercase: bool,
        effective_order: bool,
        tok: &'static str,
        /// `exp`, `none`, `floor[0.10]`, `add-k[1.00]`.
        smooth: String,
        /// This tool's `ngram` field, present only when the order is not 4.
        max_order: usize,
    },
    Chrf {
        lowercase: bool,
        eps_smoothing: bool,
        char_order: usize,
        word_order: usize,
        whitespace: bool,
    },
    Ter(TerConfig),
}

/// The sacrebleu version whose numbers (and signature) this tool reproduces.
pub const SACREBLEU_VERSION: &str = "2.6.0";

impl Signature {
    /// `Signature.format(short)`.
    pub fn format(&self, short: bool) -> String {
        let mut pairs: Vec<(&str, &str, String)> = vec![("nrefs", "#", self.nrefs.to_string())];
        if let Some(bs) = self.bs {
            pairs.push(("bs", "bs", bs.to_string()));
        }
        if let Some(ar) = self.ar {
            pairs.push(("ar", "ar", ar.to_string()));
        }
        if let Some(seed) = &self.seed {
            pairs.push(("seed", "rs", seed.clone()));
        }
        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
        let case = |lc: bool| if lc { "lc" } else { "mixed" }.to_owned();
        match &self.metric {
            MetricSignature::Bleu {
                lowercase,
                effective_order,
                tok,
                smooth,
                max_order,
            } => {
                pairs.push(("case", "c", case(*lowercase)));
                pairs.push(("eff", "e", yes_no(*effective_order)));
                pairs.push(("tok", "tok", (*tok).to_owned()));
                pairs.push(("smooth", "s", smooth.clone()));
                if *max_order != 4 {
                    pairs.push(("ngram", "n", max_order.to_string()));
                }
            }
            MetricSignature::Chrf {
                lowercase,
                eps_smoothing,
                char_order,
                word_order,
                whitespace,
            } => {
                pairs.push(("case", "c", case(*lowercase)));
                pairs.push(("eff", "e", yes_no(!eps_smoothing)));
                pairs.push(("nc", "nc", char_order.to_string()));
                pairs.push(("nw", "nw", word_order.to_string()));
                pairs.push(("space", "s", yes_no(*whitespace)));
            }
            MetricSignature::Ter(cfg) => {
                pairs.push(("case", "c", case(!cfg.case_sensitive)));
                pairs.push(("tok", "t", "tercom".to_owned()));
                pairs.push(("norm", "nr", yes_no(cfg.normalized)));
                pairs.push(("punct", "pn", yes_no(!cfg.no_punct)));
                pairs.push(("asian", "as", yes_no(cfg.asian_support)));
            }
        }
        pairs.push(("version", "v", SACREBLEU_VERSION.into()));
        pairs
            .into_iter()
            .map(|(long, abbr, v)| format!("{}:{v}", if short { abbr } else { long }))
            .collect::<Vec<_>>()
            .join("|")
    }
}

/// sacrebleu's `BLEUScore._verbose`: `p1/p2/.../pN (BP = .. ratio = .. hyp_len = .. ref_len = ..)`.
pub fn verbose(score: &BleuScore) -> String {
    let precisions: Vec<String> = score.precisions_pct.iter().map(|&p| fixed(p, 1)).collect();
    format!(
        "{} (BP = {} ratio = {} hyp_len = {} ref_len = {})",
        precisions.join("/"),
        fixed(score.bp, 3),
        fixed(score.ratio, 3),
        score.hyp_len,
        score.ref_len
    )
}

/// A bootstrap estimate as `Score` holds it (`_mean`, `_ci`).
#[derive(Debug, Clone, Copy)]
pub struct Ci {
    pub mean: f64,
    pub ci: f64,
}

/// What a score prints besides its number: sacrebleu's `_verbose` text and (JSON only) this
/// tool's extra fields after sacrebleu's.
pub struct ScoreExtras {
    pub verbose: Option<String>,
    pub json: Vec<(String, Json)>,
}

/// A BLEU score's extras: its verbose text and the JSON fields counts, totals, precisions,
/// bp, ratio, hyp_len, ref_len.
pub fn bleu_extras(score: &BleuScore) -> ScoreExtras {
    let nums = |v: &[f64]| Json::Array(v.iter().map(|&x| Json::number(x)).collect());
    ScoreExtras {
        verbose: Some(verbose(score)),
        json: vec![
            ("counts".into(), nums(&score.counts)),
            ("totals".into(), nums(&score.totals)),
            (
                "precisions".into(),
                Json::Array(
                    score
                        .precisions_pct
                        .iter()
                        .map(|&p| Json::Float(p))
                        .collect(),
                ),
            ),
            ("bp".into(), Json::Float(score.bp)),
            ("ratio".into(), Json::Float(score.ratio)),
            ("hyp_len".into(), Json::Int(score.hyp_len as i64)),
            ("ref_len".into(), Json::Int(score.ref_len as i64)),
        ],
    }
}

/// One score to print: its name (`BLEU`, `chrF2`, ...), value, extras and bootstrap estimate.
pub struct ScoreLine<'a> {
    pub name: &'a str,
    pub score: f64,
    pub extras: &'a ScoreExtras,
    pub ci: Option<Ci>,
}

/// `Score.format(width, score_only, signature, is_json)`.
pub fn score_format(
    line: &ScoreLine<'_>,
    width: usize,
    score_only: bool,
    signature: &str,
    is_json: bool,
) -> String {
    let ScoreLine {
        name,
        score,
        extras,
        ci,
    } = *line;
    let mut sc = fixed(score, width);
    let mut d: Vec<(String, Json)> = vec![
        ("name".into(), Json::Str(name.into())),
        (
            "score".into(),
            Json::Float(sc.parse::<f64>().unwrap_or(score)),
        ),
        ("signature".into(), Json::Str(signature.into())),
    ];
    if let Some(ci) = ci.filter(|c| c.mean > 0.0) {
        let mean = fixed(ci.mean, width);
        let var = fixed(ci.ci, width);
        let text = format!("μ = {mean} ± {var}");
        sc.push_str(&format!(" ({text})"));
        d.push((
            "confidence_mean".into(),
            Json::Float(mean.parse().unwrap_or(ci.mean)),
        ));
        d.push((
            "confidence_var".into(),
            Json::Float(var.parse().unwrap_or(ci.ci)),
        ));
        d.push(("confidence".into(), Json::Str(text)));
    }
    if score_only {
        return sc;
    }
    if is_json {
        if let Some(v) = &extras.verbose {
            d.push(("verbose_score".into(), Json::Str(v.clone())));
        }
        for param in signature.split('|') {
            if let Some((k, v)) = param.split_once(':') {
                d.push((k.into(), Json::Str(v.into())));
            }
        }
        d.extend(extras.json.iter().cloned());
        return Json::Object(d).dumps(1, false);
    }
    match &extras.verbose {
        Some(v) => format!("{name}|{signature} = {sc} {v}"),
        None => format!("{name}|{signature} = {sc}"),
    }
}

/// sacrebleu's `print_single_results` for text output: one line per metric, aligned on each
/// line's first `=` (lines without one, e.g. `-b`, printed first, as they are).
pub fn align_single_results(results: &[String]) -> String {
    let mut out = String::new();
    if results.len() == 1 {
        out.push_str(&results[0]);
        out.push('\n');
        return out;
    }
    let mut lens = Vec::new();
    for line in results {
        match line.chars().position(|c| c == '=') {
            Some(i) => lens.push(i as isize - 1),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if let Some(&w) = lens.iter().max() {
        for (&len, line) in lens.iter().zip(results) {
            let chars: Vec<char> = line.chars().collect();
            // Python slices with a negative index count from the end.
            let cut = if len < 0 {
                (chars.len() as isize + len).max(0) as usize
            } else {
                (len as usize).min(chars.len())
            };
            let left: String = chars[..cut].iter().collect();
            let right: String = chars[cut..].iter().collect();
            let pad = (w.max(0) as usize).saturating_sub(cut);
            out.push_str(&" ".repeat(pad));
            out.push_str(&left);
            out.push_str(&right);
            out.push('\n');
        }
    }
    out
}

/// Column alignment in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Right,
    Center,
}

/// Python's `str.strip()` (Python whitespace).
fn py_strip(s: &str) -> &str {
    s.trim_matches(is_python_whitespace)
}

fn width_of(s: &str) -> usize {
    s.chars().count()
}

/// `format(s, '>w')` / `format(s, '^w')`.
fn pad(s: &str, width: usize, align: Align) -> String {
    let n = width_of(s);
    let fill = width.saturating_sub(n);
    let (left, right) = match align {
        Align::Right => (fill, 0),
        Align::Center => (fill / 2, fill - fill / 2),
    };
    format!("{}{s}{}", " ".repeat(left), " ".repeat(right))
}

/// Cells stripped, split into lines, column widths (`max(len(header) + 2, longest line)`).
fn layout(headers: &[String], rows: &[Vec<String>]) -> (Vec<Vec<Vec<String>>>, Vec<usize>) {
    let cells: Vec<Vec<Vec<String>>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|c| py_strip(c).split('\n').map(str::to_owned).collect())
                .collect()
        })
        .collect();
    let widths = headers
        .iter()
        .enumerate()
        .map(|(j, h)| {
            let longest = cells
                .iter()
                .flat_map(|row| row[j].iter().map(|l| width_of(l)))
                .max()
                .unwrap_or(0);
            (width_of(h) + 2).max(longest)
        })
        .collect();
    (cells, widths)
}

/// `tabulate(..., tablefmt='fancy_grid', colalign=aligns)` with one line per cell line.
pub fn fancy_grid(headers: &[String], rows: &[Vec<String>], aligns: &[Align]) -> String {
    let (cells, widths) = layout(headers, rows);
    let line = |l: char, fill: char, sep: char, r: char| {
        let parts: Vec<String> = widths
            .iter()
            .map(|&w| std::iter::repeat_n(fill, w + 2).collect())
            .collect();
        format!("{l}{}{r}", parts.join(&sep.to_string()))
    };
    let row_line = |items: Vec<String>| format!("│{}│", items.join("│"));
    let mut out = vec![line('╒', '═', '╤', '╕')];
    out.push(row_line(
        headers
            .iter()
            .zip(&widths)
            .zip(aligns)
            .map(|((h, &w), &a)| format!(" {} ", pad(h, w, a)))
            .collect(),
    ));
    out.push(line('╞', '═', '╪', '╡'));
    for (k, row) in cells.iter().enumerate() {
        let height = row.iter().map(Vec::len).max().unwrap_or(1);
        for i in 0..height {
            out.push(row_line(
                row.iter()
                    .zip(&widths)
                    .zip(aligns)
                    .map(|((lines, &w), &a)| match lines.get(i) {
                        Some(l) => format!(" {} ", pad(l, w, a)),
                        None => " ".repeat(w + 2),
                    })
                    .collect(),
            ));
        }
        if k + 1 < cells.len() {
            out.push(line('├', '─', '┼', '┤'));
        }
    }
    out.push(line('╘', '═', '╧', '╛'));
    out.join("\n")
}

/// tabulate's `LATEX_ESCAPE_RULES`.
fn latex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("\\&"),
            '%' => out.push_str("\\%"),
            '$' => out.push_str("\\$"),
            '#' => out.push_str("\\#"),
            '_' => out.push_str("\\_"),
            '^' => out.push_str("\\^{}"),
            '{' => out.push_str("\\{"),
            '}' => out.push_str("\\}"),
            '~' => out.push_str("\\textasciitilde{}"),
            '\\' => out.push_str("\\textbackslash{}"),
            '<' => out.push_str("\\ensuremath{<}"),
            '>' => out.push_str("\\ensuremath{>}"),
            c => out.push(c),
        }
    }
    out
}

/// `tabulate(..., tablefmt='latex_booktabs', colalign=aligns)` (cells on one line each).
pub fn latex_booktabs(headers: &[String], rows: &[Vec<String>], aligns: &[Align]) -> String {
    let (cells, widths) = layout(headers, rows);
    let spec: String = aligns
        .iter()
        .map(|a| match a {
            Align::Right => 'r',
            Align::Center => 'c',
        })
        .collect();
    let row = |items: Vec<String>| {
        let padded: Vec<String> = items
            .iter()
            .map(|c| latex_escape(&format!(" {c} ")))
            .collect();
        format!("{}\\\\", padded.join("&")).trim_end().to_owned()
    };
    let mut out = vec![format!("\\begin{{tabular}}{{{spec}}}"), "\\toprule".into()];
    out.push(row(headers
        .iter()
        .zip(&widths)
        .zip(aligns)
        .map(|((h, &w), &a)| pad(h, w, a))
        .collect()));
    out.push("\\midrule".into());
    for r in &cells {
        out.push(row(r
            .iter()
            .zip(&widths)
            .zip(aligns)
            .map(|((lines, &w), &a)| pad(&lines.join(" "), w, a))
            .collect()));
    }
    out.push("\\bottomrule\n\\end{tabular}".into());
    out.join("\n")
}

// ---- What the command computed, and its rendering ----

/// A score with what it prints besides its number.
pub struct Scored {
    pub score: f64,
    pub extras: ScoreExtras,
}

/// What was computed for one metric, ready to render.
pub enum Body {
    /// `--sentence-level`: one score per segment.
    Sentences(Vec<Scored>),
    /// One system: its corpus score, and the bootstrap estimate with `-ci`.
    Corpus { scored: Scored, ci: Option<Ci> },
    /// Several systems: one table cell each, in order (the baseline first in a paired test).
    Rows(Vec<Row>),
}

/// One metric's results.
pub struct MetricOut {
    /// sacrebleu's score name: `BLEU`, `chrF2`, `chrF2++`, ...
    pub name: String,
    pub signature: Signature,
    pub body: Body,
}

/// One system's cell of the several-systems table.
pub struct Row {
    pub score: f64,
    /// Paired tests, systems after the baseline.
    pub p_value: Option<f64>,
    /// Paired bootstrap: the bootstrap mean and the 95% half-width.
    pub mean_ci: Option<(f64, f64)>,
}

/// Prints the scores as sacrebleu does: one line per sentence, one score per metric (JSON or
/// text, several metrics as a JSON list or aligned lines), or the several-systems table (JSON
/// list, `fancy_grid` text or LaTeX) with its notes.
pub fn render(args: &Args, opts: &Options, names: &[String], outs: &[MetricOut]) -> String {
    if outs.iter().any(|o| matches!(o.body, Body::Rows(_))) {
        return render_table(args, opts, names, outs);
    }
    let is_json = opts.format == Format::Json;
    let mut results = Vec::with_capacity(outs.len());
    let mut out = String::new();
    for metric in outs {
        match &metric.body {
            Body::Sentences(sentences) => {
                let sig = metric.signature.format(args.short);
                for s in sentences {
                    let line = ScoreLine {
                        name: &metric.name,
                        score: s.score,
                        extras: &s.extras,
                        ci: None,
                    };
                    out.push_str(&score_format(
                        &line,
                        opts.width,
                        args.score_only,
                        &sig,
                        false,
                    ));
                    out.push('\n');
                }
            }
            Body::Corpus { scored, ci } => {
                let sig = metric.signature.format(args.short && !is_json);
                let line = ScoreLine {
                    name: &metric.name,
                    score: scored.score,
                    extras: &scored.extras,
                    ci: *ci,
                };
                results.push(score_format(
                    &line,
                    opts.width,
                    args.score_only,
                    &sig,
                    is_json,
                ));
            }
            Body::Rows(_) => {}
        }
    }
    if results.is_empty() {
        return out;
    }
    if is_json {
        if results.len() > 1 {
            format!("[\n{}\n]\n", results.join(",\n"))
        } else {
            format!("{}\n", results[0])
        }
    } else {
        align_single_results(&results)
    }
}

/// The several-systems output: a JSON list, or a table with the paired-test notes and the
/// signatures.
fn render_table(args: &Args, opts: &Options, names: &[String], outs: &[MetricOut]) -> String {
    let width = opts.width;
    let columns: Vec<(&MetricOut, &[Row])> = outs
        .iter()
        .filter_map(|o| match &o.body {
            Body::Rows(rows) => Some((o, rows.as_slice())),
            _ => None,
        })
        .collect();
    if opts.format == Format::Json {
        let opt = |x: Option<f64>| x.map_or(Json::Null, Json::Float);
        let list: Vec<Json> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let mut fields = vec![("system".to_owned(), Json::Str(name.clone()))];
                for (metric, rows) in &columns {
                    let row = &rows[i];
                    let value = if opts.paired {
                        Json::Object(vec![
                            ("score".into(), Json::Float(row.score)),
                            ("p_value".into(), opt(row.p_value)),
                            ("mean".into(), opt(row.mean_ci.map(|m| m.0))),
                            ("ci".into(), opt(row.mean_ci.map(|m| m.1))),
                        ])
                    } else {
                        Json::Str(fixed(row.score, width))
                    };
                    fields.push((metric.name.clone(), value));
                }
                Json::Object(fields)
            })
            .collect();
        let mut out = Json::Array(list).dumps(4, true);
        out.push('\n');
        return out;
    }
    let multiline = opts.format != Format::Latex;
    let mut headers = vec!["System".to_owned()];
    let mut table_rows: Vec<Vec<String>> = names.iter().map(|n| vec![n.clone()]).collect();
    // sacrebleu's `is_bootstrap` is set by the first cell with a mean and never reset.
    let mut is_bootstrap = false;
    for (metric, rows) in &columns {
        for (row, cells) in rows.iter().zip(&mut table_rows) {
            let mut cell = fixed(row.score, width);
            if let Some((mean, ci)) = row.mean_ci {
                is_bootstrap = true;
                cell.push_str(&format!(" ({} ± {})", fixed(mean, width), fixed(ci, width)));
            }
            if let Some(p) = row.p_value {
                cell.push(if multiline { '\n' } else { ' ' });
                cell.push_str(&format!("(p = {p:.4})"));
                if p <= 0.05 {
                    cell.push('*');
                }
            }
            cells.push(cell);
        }
        headers.push(if is_bootstrap {
            format!("{} (μ ± 95% CI)", metric.name)
        } else {
            metric.name.clone()
        });
    }
    let mut aligns = vec![Align::Right];
    aligns.resize(headers.len(), Align::Center);
    let table = match opts.format {
        Format::Latex => latex_booktabs(&headers, &table_rows, &aligns),
        _ => fancy_grid(&headers, &table_rows, &aligns),
    };
    let mut out = format!("{table}\n\n");
    if opts.paired {
        let (kind, n, trials) = if args.paired_bs {
            (
                "bootstrap resampling",
                args.paired_bs_n,
                "resampling trials",
            )
        } else {
            ("approximate randomization", args.paired_ar_n, "trials")
        };
        let msg = format!("Paired {kind} test with {n} {trials}");
        let rule = "-".repeat(msg.chars().count());
        let baseline = if names[0].starts_with("Baseline:") {
            names[0].as_str()
        } else {
            ""
        };
        out.push_str(&format!("{rule}\n{msg}\n{rule}\n"));
        out.push_str(&format!(
            " - Each system is pairwise compared to {baseline}.\n"
        ));
        if args.paired_bs {
            out.push_str("   Actual system score / bootstrap estimated true mean / 95% CI are provided for each metric.\n");
        } else {
            out.push_str("   Actual system score is provided for each metric.\n");
        }
        out.push_str(PAIRED_EXPLANATION);
    }
    out.push_str("-----------------\nMetric signatures\n-----------------\n");
    for (metric, _) in &columns {
        out.push_str(&format!(
            " - {:<10} {}\n",
            metric.name,
            metric.signature.format(args.short)
        ));
    }
    out
}

/// sacrebleu's explanation of the paired tests, after the first two lines.
const PAIRED_EXPLANATION: &str = "
 - Null hypothesis: the system and the baseline translations are essentially
   generated by the same underlying process. For a given system and the baseline,
   the p-value is roughly the probability of the absolute score difference (delta)
   or higher occurring due to chance, under the assumption that the null hypothesis is correct.

 - Assuming a significance threshold of 0.05, the null hypothesis can be rejected
   for p-values < 0.05 (marked with \"*\"). This means that the delta is unlikely to be attributed
   to chance, hence the system is significantly \"different\" than the baseline.
   Otherwise, the p-values are highlighted in red.

 - NOTE: Significance does not tell whether a system is \"better\" than the baseline but rather
   emphasizes the \"difference\" of the systems in terms of the replicability of the delta.

";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        for (x, s) in [
            (0.0, "0.0"),
            (44.7, "44.7"),
            (45.0, "45.0"),
            (100.00000000000004, "100.00000000000004"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-07"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.029970029970029972, "0.029970029970029972"),
            (-2.5, "-2.5"),
            // Exact ties between two shortest strings: Python rounds half to even.
            (15_081_024.0 / 8_388_608.0, "1.7977981567382812"),
            (589_825.0 / 65_536.0, "9.000015258789062"),
            (f64::from(0.1f32), "0.10000000149011612"),
        ] {
            assert_eq!(py_repr(x), s);
        }
    }

    #[test]
    fn json_like_python() {
        let v = Json::Object(vec![
            ("a".into(), Json::Str("x\"é\u{1}\n".into())),
            (
                "b".into(),
                Json::Array(vec![Json::Int(1), Json::Float(0.5)]),
            ),
            ("c".into(), Json::Null),
        ]);
        assert_eq!(
            v.dumps(1, false),
            "{\n \"a\": \"x\\\"é\\u0001\\n\",\n \"b\": [\n  1,\n  0.5\n ],\n \"c\": null\n}"
        );
        assert_eq!(
            Json::Str("é😀".into()).dumps(4, true),
            "\"\\u00e9\\ud83d\\ude00\""
        );
    }
}
