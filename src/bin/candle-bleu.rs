//! `candle-bleu`: sacrebleu 2.6.0's command line for BLEU, chrF/chrF++ and TER, same options, same
//! numbers, same output (JSON or text, sentence level, bootstrap confidence intervals, paired
//! bootstrap and approximate randomization tests), 30-100x faster. See docs/CLI.md.
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
    bootstrap_confidence, paired_approximate_randomization, paired_bootstrap_many, BootstrapConfig,
    Metric, SACREBLEU_SEED,
};
use candle_bleu::exact::chrf::{
    corpus_chrf, corpus_chrf_stats, score_chrf_stats, ChrfConfig, ChrfCounts,
};
use candle_bleu::exact::ter::{
    corpus_ter, corpus_ter_stats, score_ter_stats, TerConfig, TerScore, TerStats,
};
use candle_bleu::exact::tokenize::Tokenizer;
use candle_bleu::exact::{
    score_from_stats, BleuConfig, BleuCounts, MetricError, SmoothMethod, TextStatsConfig, MAX_ORDER,
};
use count::Counting;
use input::{read_corpus, Corpus, HypInput, Source};

use args::{Args, Format, SmoothArg};
use format::{
    bleu_extras, render, Body, Ci, MetricOut, MetricSignature, Row, ScoreExtras, Scored, Signature,
};

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
fn smoothing(args: &Args) -> Result<(SmoothMethod, String), Failure> {
    let method = args.smooth_method;
    let value = args.smooth_value.or(method.default_value());
    let smooth = match (method, value) {
        (SmoothArg::None, _) => SmoothMethod::None,
        (SmoothArg::Exp, _) => SmoothMethod::Exp,
        (SmoothArg::Floor, Some(v)) => SmoothMethod::Floor(v),
        (SmoothArg::AddK, Some(v)) => SmoothMethod::AddK(v),
        (_, None) => SmoothMethod::Exp,
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

/// A metric of `-m/--metrics`. The order is sacrebleu's `sorted(metrics)` (`BLEU` < `CHRF` <
/// `TER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum MetricKind {
    Bleu,
    Chrf,
    Ter,
}

/// Everything the command line asks for, validated before any file is read.
struct Options {
    format: Format,
    tok: Tokenizer,
    cfg: BleuConfig,
    /// The signature's `smooth:` text (`exp`, `floor[0.10]`, ...).
    smooth_text: String,
    chrf: ChrfConfig,
    ter: TerConfig,
    /// The metrics in the order given, without repeats (the order of the paired tests; other
    /// modes sort them).
    metrics: Vec<MetricKind>,
    width: usize,
    num_refs: usize,
    /// `--paired-bs` or `--paired-ar`.
    paired: bool,
}

/// `-m` values in the order given, without repeats.
fn metrics(args: &Args) -> Result<Vec<MetricKind>, Failure> {
    let mut kinds = Vec::new();
    for m in &args.metrics {
        let kind = match m.as_str() {
            "bleu" => MetricKind::Bleu,
            "chrf" => MetricKind::Chrf,
            "ter" => MetricKind::Ter,
            other => {
                return Err(format!(
                    "--metrics: invalid choice {other:?} (choose from bleu, chrf, ter)"
                ))
            }
        };
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    if args.sentence_level && args.metrics.len() > 1 {
        return Err("--sentence-level: only one metric can be used in sentence-level mode".into());
    }
    Ok(kinds)
}

/// The chrF options (`--chrf-*`).
fn chrf_config(args: &Args) -> Result<ChrfConfig, Failure> {
    let order = |option: &str, n: i64| {
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= MAX_ORDER)
            .ok_or_else(|| format!("{option}: must be in 0..={MAX_ORDER}, got {n}"))
    };
    let cfg = ChrfConfig {
        char_order: order("--chrf-char-order", args.chrf_char_order)?,
        word_order: order("--chrf-word-order", args.chrf_word_order)?,
        beta: args.chrf_beta as f64,
        lowercase: args.chrf_lowercase,
        whitespace: args.chrf_whitespace,
        eps_smoothing: args.chrf_eps_smoothing,
    };
    if cfg.orders() == 0 {
        return Err(
            "--chrf-char-order and --chrf-word-order are both 0: chrF has no n-gram to score"
                .into(),
        );
    }
    if args.chrf_beta < 1 {
        return Err(format!("--chrf-beta: must be >= 1, got {}", args.chrf_beta));
    }
    Ok(cfg)
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
    let metrics = metrics(args)?;
    let encoding = args.encoding.to_lowercase().replace(['-', '_'], "");
    if encoding != "utf8" {
        return Err(format!(
            "--encoding: only utf-8 is supported, got {:?}",
            args.encoding
        ));
    }
    let tok = tokenizer(args)?;
    let (smoothing, smooth_text) = smoothing(args)?;
    let chrf = chrf_config(args)?;
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
        chrf,
        ter: TerConfig {
            normalized: args.ter_normalized,
            no_punct: args.ter_no_punct,
            asian_support: args.ter_asian_support,
            case_sensitive: args.ter_case_sensitive,
        },
        metrics,
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
    // sacrebleu warns for BLEU only (chrF sets `_force`).
    if !args.force && opts.metrics.contains(&MetricKind::Bleu) {
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

fn metric_error(e: MetricError) -> Failure {
    e.to_string()
}

/// How one metric counts and scores a corpus.
trait CliMetric {
    /// The library's configuration, which the bootstrap resamples with.
    type Cfg: Metric;
    fn cfg(&self) -> &Self::Cfg;
    /// Per-segment statistics of system `system`.
    fn segments(&self, system: usize) -> Result<Vec<<Self::Cfg as Metric>::Counts>, MetricError>;
    /// The corpus score of system `system` (summed without keeping the segments).
    fn corpus(&self, system: usize) -> Result<Scored, MetricError>;
    /// The score of the sum of `stats`.
    fn score(&self, stats: &[<Self::Cfg as Metric>::Counts]) -> Result<Scored, MetricError>;
}

/// BLEU: the binary's own tokenizing counter (`count`), scored by the library.
struct BleuCli<'c> {
    corpus: &'c Corpus<'c>,
    counting: Counting,
    cfg: BleuConfig,
}

impl CliMetric for BleuCli<'_> {
    type Cfg = BleuConfig;
    fn cfg(&self) -> &BleuConfig {
        &self.cfg
    }
    fn segments(&self, system: usize) -> Result<Vec<BleuCounts>, MetricError> {
        self.counting.segment_stats(self.corpus, system)
    }
    fn corpus(&self, system: usize) -> Result<Scored, MetricError> {
        let stats = self.counting.stats_sum(self.corpus, system)?;
        self.score(std::slice::from_ref(&stats))
    }
    fn score(&self, stats: &[BleuCounts]) -> Result<Scored, MetricError> {
        let sum: BleuCounts = stats.iter().sum();
        let score = score_from_stats(&sum, &self.cfg)?;
        Ok(Scored {
            score: score.score,
            extras: bleu_extras(&score),
        })
    }
}

/// chrF: the library's counter on the lines (references by segment).
struct ChrfCli<'c> {
    corpus: &'c Corpus<'c>,
    refs: Vec<Vec<&'c str>>,
    cfg: ChrfConfig,
}

impl CliMetric for ChrfCli<'_> {
    type Cfg = ChrfConfig;
    fn cfg(&self) -> &ChrfConfig {
        &self.cfg
    }
    fn segments(&self, system: usize) -> Result<Vec<ChrfCounts>, MetricError> {
        corpus_chrf_stats(&self.corpus.systems[system].1, &self.refs, self.cfg)
    }
    fn corpus(&self, system: usize) -> Result<Scored, MetricError> {
        let score = corpus_chrf(&self.corpus.systems[system].1, &self.refs, self.cfg)?;
        Ok(Scored {
            score: score.score,
            extras: ScoreExtras {
                verbose: None,
                json: Vec::new(),
            },
        })
    }
    fn score(&self, stats: &[ChrfCounts]) -> Result<Scored, MetricError> {
        let sum: ChrfCounts = stats.iter().sum();
        let score = score_chrf_stats(&sum, self.cfg)?;
        Ok(Scored {
            score: score.score,
            extras: ScoreExtras {
                verbose: None,
                json: Vec::new(),
            },
        })
    }
}

/// TER: the library's counter on the lines (references by segment).
struct TerCli<'c> {
    corpus: &'c Corpus<'c>,
    refs: Vec<Vec<&'c str>>,
    cfg: TerConfig,
}

/// A TER score's output: no verbose text (as sacrebleu), nothing extra.
fn ter_scored(score: TerScore) -> Scored {
    Scored {
        score: score.score,
        extras: ScoreExtras {
            verbose: None,
            json: Vec::new(),
        },
    }
}

impl CliMetric for TerCli<'_> {
    type Cfg = TerConfig;
    fn cfg(&self) -> &TerConfig {
        &self.cfg
    }
    fn segments(&self, system: usize) -> Result<Vec<TerStats>, MetricError> {
        corpus_ter_stats(&self.corpus.systems[system].1, &self.refs, self.cfg)
    }
    fn corpus(&self, system: usize) -> Result<Scored, MetricError> {
        corpus_ter(&self.corpus.systems[system].1, &self.refs, self.cfg).map(ter_scored)
    }
    fn score(&self, stats: &[TerStats]) -> Result<Scored, MetricError> {
        let sum: TerStats = stats.iter().sum();
        score_ter_stats(&sum).map(ter_scored)
    }
}

/// Counts and scores one metric as the options ask: sentence by sentence, one corpus (with
/// `-ci`, its bootstrap estimate), or several systems (with `-pbs`/`-par`, paired tests
/// against the first). Records the resample count and seed in `signature`.
fn score_metric<C: CliMetric>(
    args: &Args,
    opts: &Options,
    num_sys: usize,
    metric: &C,
    signature: &mut Signature,
) -> Result<Body, Failure> {
    let cfg = metric.cfg();
    if args.sentence_level {
        return metric
            .segments(0)
            .map_err(metric_error)?
            .iter()
            .map(|s| metric.score(std::slice::from_ref(s)).map_err(metric_error))
            .collect::<Result<_, _>>()
            .map(Body::Sentences);
    }
    if num_sys == 1 {
        let n_bootstrap = if args.confidence {
            args.confidence_n
        } else {
            1
        };
        if n_bootstrap <= 1 {
            return Ok(Body::Corpus {
                scored: metric.corpus(0).map_err(metric_error)?,
                ci: None,
            });
        }
        let n = n_bootstrap as usize;
        let (seed, seed_text) = seed_from_env()?;
        let stats = metric.segments(0).map_err(metric_error)?;
        let conf = bootstrap_confidence(&stats, cfg, &BootstrapConfig { n_samples: n, seed })
            .map_err(metric_error)?;
        signature.bs = Some(n);
        signature.seed = Some(seed_text);
        return Ok(Body::Corpus {
            scored: metric.score(&stats).map_err(metric_error)?,
            ci: Some(Ci {
                mean: conf.mean,
                ci: conf.ci,
            }),
        });
    }
    if !opts.paired {
        return (0..num_sys)
            .map(|s| {
                Ok(Row {
                    score: metric.corpus(s).map_err(metric_error)?.score,
                    p_value: None,
                    mean_ci: None,
                })
            })
            .collect::<Result<_, Failure>>()
            .map(Body::Rows);
    }
    let (seed, _) = seed_from_env()?;
    signature.seed = Some(
        if std::env::var("SACREBLEU_SEED").is_ok_and(|s| s.trim().eq_ignore_ascii_case("none")) {
            "none".to_owned()
        } else {
            seed.to_string()
        },
    );
    let stats: Vec<Vec<_>> = (0..num_sys)
        .map(|s| metric.segments(s))
        .collect::<Result<_, _>>()
        .map_err(metric_error)?;
    let others: Vec<&[_]> = stats[1..].iter().map(Vec::as_slice).collect();
    let mut rows = Vec::with_capacity(num_sys);
    if args.paired_bs {
        let n = if args.paired_bs_n > 0 {
            args.paired_bs_n as usize
        } else {
            1000
        };
        signature.bs = Some(n);
        let (baseline, results) = paired_bootstrap_many(
            &stats[0],
            &others,
            cfg,
            &BootstrapConfig { n_samples: n, seed },
        )
        .map_err(metric_error)?;
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
            score: metric.score(&stats[0]).map_err(metric_error)?.score,
            p_value: None,
            mean_ci: None,
        });
        for other in &others {
            let r = paired_approximate_randomization(
                &stats[0],
                other,
                cfg,
                &BootstrapConfig { n_samples: n, seed },
            )
            .map_err(metric_error)?;
            rows.push(Row {
                score: r.score,
                p_value: Some(r.p_value),
                mean_ci: None,
            });
        }
    }
    Ok(Body::Rows(rows))
}

/// Scores every metric, in the order sacrebleu prints them: sorted (`BLEU`, `chrF`, `TER`),
/// except for the paired tests, which keep the order of `-m`.
fn score_all(args: &Args, opts: &Options, corpus: &Corpus<'_>) -> Result<Vec<MetricOut>, Failure> {
    let mut kinds = opts.metrics.clone();
    if !opts.paired {
        kinds.sort();
    }
    let num_sys = corpus.systems.len();
    let nrefs = corpus.refs.len();
    let mut outs = Vec::with_capacity(kinds.len());
    for kind in kinds {
        let out = match kind {
            MetricKind::Bleu => {
                let mut signature = Signature {
                    nrefs,
                    bs: None,
                    ar: None,
                    seed: None,
                    metric: MetricSignature::Bleu {
                        lowercase: args.lowercase,
                        effective_order: args.sentence_level,
                        tok: opts.tok.name(),
                        smooth: opts.smooth_text.clone(),
                        max_order: opts.cfg.max_order,
                    },
                };
                let metric = BleuCli {
                    corpus,
                    counting: Counting(TextStatsConfig {
                        tokenizer: opts.tok,
                        lowercase: args.lowercase,
                        max_order: opts.cfg.max_order,
                    }),
                    cfg: opts.cfg.clone(),
                };
                let body = score_metric(args, opts, num_sys, &metric, &mut signature)?;
                MetricOut {
                    name: "BLEU".into(),
                    signature,
                    body,
                }
            }
            MetricKind::Chrf => {
                let cfg = opts.chrf;
                let mut signature = Signature {
                    nrefs,
                    bs: None,
                    ar: None,
                    seed: None,
                    metric: MetricSignature::Chrf {
                        lowercase: cfg.lowercase,
                        eps_smoothing: cfg.eps_smoothing,
                        char_order: cfg.char_order,
                        word_order: cfg.word_order,
                        whitespace: cfg.whitespace,
                    },
                };
                let refs: Vec<Vec<&str>> = (0..corpus.systems[0].1.len())
                    .map(|i| corpus.refs.iter().map(|r| r[i]).collect())
                    .collect();
                let metric = ChrfCli { corpus, refs, cfg };
                let body = score_metric(args, opts, num_sys, &metric, &mut signature)?;
                MetricOut {
                    name: cfg.name(),
                    signature,
                    body,
                }
            }
            MetricKind::Ter => {
                let cfg = opts.ter;
                let mut signature = Signature {
                    nrefs,
                    bs: None,
                    ar: None,
                    seed: None,
                    metric: MetricSignature::Ter(cfg),
                };
                let refs: Vec<Vec<&str>> = (0..corpus.systems[0].1.len())
                    .map(|i| corpus.refs.iter().map(|r| r[i]).collect())
                    .collect();
                let metric = TerCli { corpus, refs, cfg };
                let body = score_metric(args, opts, num_sys, &metric, &mut signature)?;
                MetricOut {
                    name: "TER".into(),
                    signature,
                    body,
                }
            }
        };
        outs.push(out);
    }
    Ok(outs)
}

/// The whole command: options, reading, scoring, rendering.
fn run(args: &Args) -> Result<String, Failure> {
    let opts = options(args)?;
    let inputs = read_inputs(args)?;
    let (corpus, names) = parse_corpus(args, &opts, &inputs)?;
    let outs = score_all(args, &opts, &corpus)?;
    Ok(render(args, &opts, &names, &outs))
}
