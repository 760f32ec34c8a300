//! `candle-bleu`: sacrebleu 2.6.0's BLEU command line, same options, same numbers, same output
//! (JSON or text, sentence level, bootstrap confidence intervals, paired bootstrap and
//! approximate randomization tests), 30-100x faster. See docs/CLI.md.
//!
//! Exit status: 0 on success, 2 on any error; errors go to stderr and name the argument, file
//! and line, and nothing is printed on stdout.

#[path = "candle-bleu/args.rs"]
mod args;
#[path = "candle-bleu/count.rs"]
mod count;
#[path = "candle-bleu/format.rs"]
mod format;
#[path = "candle-bleu/input.rs"]
mod input;

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

use candle_bleu::exact::bootstrap::{
    bootstrap_confidence, paired_approximate_randomization, paired_bootstrap_many, SACREBLEU_SEED,
};
use candle_bleu::exact::tokenize::Tokenizer;
use candle_bleu::exact::{
    score_from_stats, BleuConfig, BleuError, BleuScore, BleuStats, Smoothing, MAX_ORDER,
};
use count::Counting;
use input::{read_corpus, Corpus, HypInput, Source};

use args::{Args, Format, SmoothMethod};
use format::{fancy_grid, latex_booktabs, score_format, Align, Ci, Json, Signature};

/// A failure: the message printed on stderr (exit status 2).
type Failure = String;

/// The largest number of resamples or trials accepted (sacrebleu's defaults are 1000/10000).
const MAX_SAMPLES: i64 = 10_000_000;

fn main() -> ExitCode {
    let argv = args::rewrite_argv(std::env::args_os());
    let args = match Args::try_parse_from(argv) {
        Ok(args) => args,
        // --help/--version print to stdout and exit 0; usage errors print to stderr, exit 2.
        Err(e) => e.exit(),
    };
    match run(&args) {
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(output.as_bytes())
                .and_then(|_| stdout.flush())
            {
                Ok(()) => ExitCode::SUCCESS,
                // `| head`: sacrebleu dies quietly on SIGPIPE; so do we.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("candle-bleu: error: cannot write to stdout: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Err(message) => {
            eprintln!("candle-bleu: error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Reads a whole file in one read, naming it in the error.
fn read_file(path: &Path, role: &str) -> Result<Vec<u8>, Failure> {
    let name = path.display();
    if path.extension().is_some_and(|e| e == "gz") {
        return Err(format!(
            "{role} file '{name}': gzip-compressed input is not supported; decompress it first \
             (e.g. `zcat {name} > file`)"
        ));
    }
    std::fs::read(path).map_err(|e| format!("cannot read {role} file '{name}': {e}"))
}

/// `SACREBLEU_SEED` as sacrebleu reads it: `(seed, signature text)`; `none` draws a seed from
/// the clock.
fn seed_from_env() -> Result<(u64, String), Failure> {
    let raw = std::env::var("SACREBLEU_SEED").unwrap_or_else(|_| SACREBLEU_SEED.to_string());
    if raw.trim().eq_ignore_ascii_case("none") {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        return Ok((nanos ^ ((std::process::id() as u64) << 32), "none".into()));
    }
    let digits: String = raw.trim().chars().filter(|&c| c != '_').collect();
    let digits = digits.strip_prefix('+').unwrap_or(&digits);
    match digits.parse::<u64>() {
        Ok(seed) => Ok((seed, raw.to_lowercase())),
        Err(_) => Err(format!(
            "SACREBLEU_SEED={raw:?}: expected a non-negative integer (< 2^64) or 'none'"
        )),
    }
}

/// The smoothing and its signature text (`exp`, `floor[0.10]`, ...).
fn smoothing(args: &Args) -> Result<(Smoothing, String), Failure> {
    let method = args.smooth_method;
    let value = args.smooth_value.or(method.default_value());
    let smooth = match (method, value) {
        (SmoothMethod::None, _) => Smoothing::None,
        (SmoothMethod::Exp, _) => Smoothing::Exp,
        (SmoothMethod::Floor, Some(v)) => Smoothing::Floor(v),
        (SmoothMethod::AddK, Some(v)) => Smoothing::AddK(v),
        (_, None) => Smoothing::Exp,
    };
    if let Some(v) = args.smooth_value {
        if !v.is_finite() || v < 0.0 {
            return Err(format!("--smooth-value: must be finite and >= 0, got {v}"));
        }
    }
    let text = match (method.default_value(), value) {
        (Some(_), Some(v)) => format!("{}[{}]", method.name(), format::fixed(v, 2)),
        _ => method.name().to_owned(),
    };
    Ok((smooth, text))
}

/// The tokenizer named by `--tokenize` (13a when not given).
fn tokenizer(args: &Args) -> Result<Tokenizer, Failure> {
    let name = args.tokenize.as_deref().unwrap_or("13a");
    name.parse::<Tokenizer>()
        .map_err(|e| format!("--tokenize: {e}"))
}

/// The systems' `Source`s after sacrebleu's duplicate-name rule: in a paired test a repeat of
/// the baseline is skipped, any other repeated name is an error.
fn dedup_inputs<'a>(
    files: &'a [(String, Vec<u8>)],
    paired: bool,
    quiet: bool,
) -> Result<Vec<Source<'a>>, Failure> {
    let mut sources: Vec<Source<'a>> = Vec::with_capacity(files.len());
    for (name, bytes) in files {
        if sources.iter().any(|s| s.name == name) {
            if paired && sources[0].name == name {
                if !quiet {
                    eprintln!(
                        "candle-bleu: ignoring {name:?} as it was also given as the baseline"
                    );
                }
                continue;
            }
            return Err(format!(
                "-i: {name:?} is given twice; every system needs a different file name"
            ));
        }
        sources.push(Source { name, bytes });
    }
    Ok(sources)
}

/// Everything the command line asks for, validated before any file is read.
struct Options {
    format: Format,
    tok: Tokenizer,
    cfg: BleuConfig,
    /// The signature's `smooth:` text (`exp`, `floor[0.10]`, ...).
    smooth_text: String,
    width: usize,
    num_refs: usize,
    /// `--paired-bs` or `--paired-ar`.
    paired: bool,
}

/// Checks the options in sacrebleu's order of complaints (format, unsupported options,
/// metric, encoding, tokenizer, smoothing, numbers) and gathers them.
fn options(args: &Args) -> Result<Options, Failure> {
    let mut format = args.format;
    if let Ok(env) = std::env::var("SACREBLEU_FORMAT") {
        match env.to_lowercase().as_str() {
            "json" => format = Format::Json,
            "text" => format = Format::Text,
            "latex" => format = Format::Latex,
            _ => {}
        }
    }
    if let Some(option) = args.unsupported() {
        return Err(format!("{option} is not supported by candle-bleu"));
    }
    if let Some(m) = args.metrics.iter().find(|m| m.as_str() != "bleu") {
        return Err(format!(
            "--metrics: only bleu is supported, got {m:?} (use sacrebleu for chrF and TER)"
        ));
    }
    let encoding = args.encoding.to_lowercase().replace(['-', '_'], "");
    if encoding != "utf8" {
        return Err(format!(
            "--encoding: only utf-8 is supported, got {:?}",
            args.encoding
        ));
    }
    let tok = tokenizer(args)?;
    let (smoothing, smooth_text) = smoothing(args)?;
    let width = usize::try_from(args.width)
        .map_err(|_| format!("--width: must be >= 0, got {}", args.width))?;
    let max_order = usize::try_from(args.max_ngram_order)
        .ok()
        .filter(|&n| (1..=MAX_ORDER).contains(&n))
        .ok_or_else(|| {
            format!(
                "--max-ngram-order: must be in 1..={MAX_ORDER}, got {}",
                args.max_ngram_order
            )
        })?;
    let num_refs = usize::try_from(args.num_refs)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| format!("--num-refs: must be >= 1, got {}", args.num_refs))?;
    if args.refs.is_empty() {
        return Err("no reference file given: give the references before -i \
                    (candle-bleu REF [REF ...] -i HYP)"
            .into());
    }
    if num_refs != 1 && args.refs.len() > 1 {
        return Err(format!(
            "--num-refs {num_refs} reads tab-separated references from ONE file, but {} \
             reference files were given",
            args.refs.len()
        ));
    }
    for (option, n) in [
        ("--confidence-n", args.confidence_n),
        ("--paired-bs-n", args.paired_bs_n),
        ("--paired-ar-n", args.paired_ar_n),
    ] {
        if n > MAX_SAMPLES {
            return Err(format!("{option}: at most {MAX_SAMPLES}, got {n}"));
        }
    }
    Ok(Options {
        format,
        tok,
        cfg: BleuConfig {
            max_order,
            weights: None,
            smoothing,
            effective_order: args.sentence_level,
        },
        smooth_text,
        width,
        num_refs,
        paired: args.paired_bs || args.paired_ar,
    })
}

/// The bytes of every input: reference files, hypothesis files, standard input.
struct Inputs {
    refs: Vec<(String, Vec<u8>)>,
    hyps: Vec<(String, Vec<u8>)>,
    stdin: Vec<u8>,
}

/// Reads every input in one read each: the references, then the `-i` files or standard input.
fn read_inputs(args: &Args) -> Result<Inputs, Failure> {
    let refs = args
        .refs
        .iter()
        .map(|p| Ok((p.display().to_string(), read_file(p, "reference")?)))
        .collect::<Result<_, Failure>>()?;
    let mut stdin = Vec::new();
    let hyps = match &args.input {
        Some(paths) => paths
            .iter()
            .map(|p| Ok((p.display().to_string(), read_file(p, "hypothesis")?)))
            .collect::<Result<_, Failure>>()?,
        None => {
            std::io::stdin()
                .lock()
                .read_to_end(&mut stdin)
                .map_err(|e| format!("cannot read standard input: {e}"))?;
            Vec::new()
        }
    };
    Ok(Inputs { refs, hyps, stdin })
}

/// Parses the inputs into a corpus (sacrebleu's line handling, `input::read_corpus`), checks
/// the number of systems against the options and warns about tokenized-looking input.
/// Returns the corpus and the systems' display names.
fn parse_corpus<'a>(
    args: &Args,
    opts: &Options,
    inputs: &'a Inputs,
) -> Result<(Corpus<'a>, Vec<String>), Failure> {
    let ref_sources: Vec<Source> = inputs
        .refs
        .iter()
        .map(|(name, bytes)| Source { name, bytes })
        .collect();
    let hyp_sources = dedup_inputs(&inputs.hyps, opts.paired, args.quiet)?;
    let hyps = match &args.input {
        Some(_) => HypInput::Files(&hyp_sources),
        None => HypInput::Stdin(&inputs.stdin),
    };
    let corpus = read_corpus(&ref_sources, hyps, opts.num_refs).map_err(|e| e.to_string())?;
    let num_sys = corpus.systems.len();
    let mut names: Vec<String> = corpus.systems.iter().map(|(n, _)| n.clone()).collect();
    if opts.paired {
        if args.input.is_none() {
            names = std::iter::once("Baseline".to_owned())
                .chain((1..num_sys).map(|i| format!("System {i}")))
                .collect();
        } else {
            names[0] = format!("Baseline: {}", names[0]);
        }
    }
    if args.sentence_level {
        if num_sys > 1 {
            return Err(format!(
                "--sentence-level: only one system can be scored, got {num_sys}"
            ));
        }
        if args.confidence || opts.paired {
            return Err(
                "--sentence-level: statistical tests (--confidence, --paired-*) are \
                 unavailable at sentence level"
                    .into(),
            );
        }
    }
    if opts.paired && num_sys == 1 {
        return Err(
            "--paired-bs/--paired-ar: paired tests need several systems (-i BASELINE SYSTEM ...)"
                .into(),
        );
    }
    if num_sys > 1 && args.confidence {
        return Err(
            "--confidence: several systems given; use a paired test (--paired-bs) instead".into(),
        );
    }
    if !args.force {
        for (name, lines) in &corpus.systems {
            if lines.iter().filter(|l| l.ends_with(" .")).count() >= 100 {
                eprintln!(
                    "candle-bleu: warning: {name}: 100 or more lines end in a tokenized period \
                     (' .'); it looks like you forgot to detokenize your test data, which may \
                     hurt your score (--force silences this)"
                );
            }
        }
    }
    Ok((corpus, names))
}

/// What was computed, ready to render.
enum Scores {
    /// `--sentence-level`: one score per segment.
    Sentences(Vec<BleuScore>),
    /// One system: its corpus score, and the bootstrap estimate with `-ci`.
    Corpus { score: BleuScore, ci: Option<Ci> },
    /// Several systems: one table row each, in order (the baseline first in a paired test).
    Table(Vec<Row>),
}

/// One system's row of the several-systems table.
struct Row {
    score: f64,
    /// Paired tests, systems after the baseline.
    p_value: Option<f64>,
    /// Paired bootstrap: the bootstrap mean and the 95% half-width.
    mean_ci: Option<(f64, f64)>,
}

fn bleu_error(e: BleuError) -> Failure {
    e.to_string()
}

/// Tokenizes and counts the corpus, then scores it as the options ask: sentence by sentence,
/// one corpus (with `-ci`, its bootstrap estimate), or several systems (with `-pbs`/`-par`,
/// paired tests against the first). Records the resample count and seed in `signature`.
fn score(
    args: &Args,
    opts: &Options,
    corpus: &Corpus<'_>,
    signature: &mut Signature,
) -> Result<Scores, Failure> {
    let cfg = &opts.cfg;
    let counting = Counting {
        tok: opts.tok,
        lowercase: args.lowercase,
        max_order: cfg.max_order,
    };
    let score = |stats: &BleuStats| score_from_stats(stats, cfg).map_err(bleu_error);
    let num_sys = corpus.systems.len();
    if args.sentence_level {
        return counting
            .segment_stats(corpus, 0)
            .map_err(bleu_error)?
            .iter()
            .map(score)
            .collect::<Result<_, _>>()
            .map(Scores::Sentences);
    }
    if num_sys == 1 {
        let n_bootstrap = if args.confidence {
            args.confidence_n
        } else {
            1
        };
        if n_bootstrap <= 1 {
            let stats = counting.stats_sum(corpus, 0).map_err(bleu_error)?;
            return Ok(Scores::Corpus {
                score: score(&stats)?,
                ci: None,
            });
        }
        let n = n_bootstrap as usize;
        let (seed, seed_text) = seed_from_env()?;
        let stats = counting.segment_stats(corpus, 0).map_err(bleu_error)?;
        let conf = bootstrap_confidence(&stats, cfg, n, seed).map_err(bleu_error)?;
        signature.bs = Some(n);
        signature.seed = Some(seed_text);
        return Ok(Scores::Corpus {
            score: score(&stats.iter().sum())?,
            ci: Some(Ci {
                mean: conf.mean,
                ci: conf.ci,
            }),
        });
    }
    if !opts.paired {
        return (0..num_sys)
            .map(|s| {
                let stats = counting.stats_sum(corpus, s).map_err(bleu_error)?;
                Ok(Row {
                    score: score(&stats)?.score,
                    p_value: None,
                    mean_ci: None,
                })
            })
            .collect::<Result<_, Failure>>()
            .map(Scores::Table);
    }
    let (seed, _) = seed_from_env()?;
    signature.seed = Some(
        if std::env::var("SACREBLEU_SEED").is_ok_and(|s| s.trim().eq_ignore_ascii_case("none")) {
            "none".to_owned()
        } else {
            seed.to_string()
        },
    );
    let stats: Vec<Vec<BleuStats>> = (0..num_sys)
        .map(|s| counting.segment_stats(corpus, s))
        .collect::<Result<_, _>>()
        .map_err(bleu_error)?;
    let others: Vec<&[BleuStats]> = stats[1..].iter().map(Vec::as_slice).collect();
    let mut rows = Vec::with_capacity(num_sys);
    if args.paired_bs {
        let n = if args.paired_bs_n > 0 {
            args.paired_bs_n as usize
        } else {
            1000
        };
        signature.bs = Some(n);
        let (baseline, results) =
            paired_bootstrap_many(&stats[0], &others, cfg, n, seed).map_err(bleu_error)?;
        rows.push(Row {
            score: baseline.score,
            p_value: None,
            mean_ci: Some((baseline.mean, baseline.ci)),
        });
        rows.extend(results.iter().map(|r| Row {
            score: r.score,
            p_value: Some(r.p_value),
            mean_ci: r.confidence.as_ref().map(|c| (c.mean, c.ci)),
        }));
    } else {
        let n = if args.paired_ar_n > 0 {
            args.paired_ar_n as usize
        } else {
            10000
        };
        signature.ar = Some(n);
        rows.push(Row {
            score: score(&stats[0].iter().sum())?.score,
            p_value: None,
            mean_ci: None,
        });
        for other in &others {
            let r = paired_approximate_randomization(&stats[0], other, cfg, n, seed)
                .map_err(bleu_error)?;
            rows.push(Row {
                score: r.score,
                p_value: Some(r.p_value),
                mean_ci: None,
            });
        }
    }
    Ok(Scores::Table(rows))
}

/// Prints the scores as sacrebleu does: one line per sentence, one score (JSON or text), or
/// the several-systems table (JSON list, `fancy_grid` text or LaTeX) with its notes.
fn render(
    args: &Args,
    opts: &Options,
    names: &[String],
    signature: &Signature,
    scores: &Scores,
) -> String {
    match scores {
        Scores::Sentences(sentences) => {
            let sig = signature.format(args.short);
            let mut out = String::new();
            for s in sentences {
                out.push_str(&score_format(
                    s,
                    opts.width,
                    args.score_only,
                    &sig,
                    false,
                    None,
                ));
                out.push('\n');
            }
            out
        }
        Scores::Corpus { score, ci } => {
            let is_json = opts.format == Format::Json;
            let sig = signature.format(args.short && !is_json);
            let mut out = score_format(score, opts.width, args.score_only, &sig, is_json, *ci);
            out.push('\n');
            out
        }
        Scores::Table(rows) => render_table(args, opts, names, signature, rows),
    }
}

/// The several-systems output: a JSON list, or a table with the paired-test notes and the
/// signature.
fn render_table(
    args: &Args,
    opts: &Options,
    names: &[String],
    signature: &Signature,
    rows: &[Row],
) -> String {
    let metric = "BLEU";
    let width = opts.width;
    if opts.format == Format::Json {
        let opt = |x: Option<f64>| x.map_or(Json::Null, Json::Float);
        let list: Vec<Json> = names
            .iter()
            .zip(rows)
            .map(|(name, row)| {
                let value = if opts.paired {
                    Json::Object(vec![
                        ("score".into(), Json::Float(row.score)),
                        ("p_value".into(), opt(row.p_value)),
                        ("mean".into(), opt(row.mean_ci.map(|m| m.0))),
                        ("ci".into(), opt(row.mean_ci.map(|m| m.1))),
                    ])
                } else {
                    Json::Str(format::fixed(row.score, width))
                };
                Json::Object(vec![
                    ("system".into(), Json::Str(name.clone())),
                    (metric.into(), value),
                ])
            })
            .collect();
        let mut out = Json::Array(list).dumps(4, true);
        out.push('\n');
        return out;
    }
    let multiline = opts.format != Format::Latex;
    let cells = rows.iter().map(|row| {
        let mut cell = format::fixed(row.score, width);
        if let Some((mean, ci)) = row.mean_ci {
            cell.push_str(&format!(
                " ({} ± {})",
                format::fixed(mean, width),
                format::fixed(ci, width)
            ));
        }
        if let Some(p) = row.p_value {
            cell.push(if multiline { '\n' } else { ' ' });
            cell.push_str(&format!("(p = {p:.4})"));
            if p <= 0.05 {
                cell.push('*');
            }
        }
        cell
    });
    let title = if rows.iter().any(|r| r.mean_ci.is_some()) {
        format!("{metric} (μ ± 95% CI)")
    } else {
        metric.to_owned()
    };
    let headers = vec!["System".to_owned(), title];
    let table_rows: Vec<Vec<String>> = names
        .iter()
        .zip(cells)
        .map(|(name, cell)| vec![name.clone(), cell])
        .collect();
    let aligns = [Align::Right, Align::Center];
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
    out.push_str(&format!(
        " - {metric:<10} {}\n",
        signature.format(args.short)
    ));
    out
}

/// The whole command: options, reading, scoring, rendering.
fn run(args: &Args) -> Result<String, Failure> {
    let opts = options(args)?;
    let inputs = read_inputs(args)?;
    let (corpus, names) = parse_corpus(args, &opts, &inputs)?;
    let mut signature = Signature {
        nrefs: corpus.refs.len(),
        bs: None,
        ar: None,
        seed: None,
        lowercase: args.lowercase,
        effective_order: args.sentence_level,
        tok: opts.tok.name(),
        smooth: opts.smooth_text.clone(),
        max_order: opts.cfg.max_order,
    };
    let scores = score(args, &opts, &corpus, &mut signature)?;
    Ok(render(args, &opts, &names, &signature, &scores))
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
