//! Command-line arguments: sacrebleu 2.6.0's BLEU and chrF options, long and short spellings.
//!
//! sacrebleu (argparse) has single-dash options of several letters (`-tok`, `-lc`, `-sl`,
//! `-nr`, `-ci`, `-pbs`, `-cc`, ...), which clap cannot express; [`rewrite_argv`] turns them into their
//! long forms before clap parses the command line.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// sacrebleu's multi-letter single-dash options and the long option each stands for.
/// (`-pb`/`-pbn` are accepted too; sacrebleu itself rejects `-pb` as ambiguous.)
const SHORT_ALIASES: &[(&str, &str)] = &[
    ("-tok", "--tokenize"),
    ("-lc", "--lowercase"),
    ("-sv", "--smooth-value"),
    ("-sl", "--sentence-level"),
    ("-nr", "--num-refs"),
    ("-ci", "--confidence"),
    ("-cin", "--confidence-n"),
    ("-pbs", "--paired-bs"),
    ("-pbsn", "--paired-bs-n"),
    ("-pb", "--paired-bs"),
    ("-pbn", "--paired-bs-n"),
    ("-par", "--paired-ar"),
    ("-parn", "--paired-ar-n"),
    ("-sh", "--short"),
    ("-nc", "--no-color"),
    ("-ol", "--origlang"),
    ("-cc", "--chrf-char-order"),
    ("-cw", "--chrf-word-order"),
];

/// Rewrites sacrebleu's multi-letter single-dash options (`-tok 13a`, `-tok=13a`) into long
/// options; everything after a bare `--` is left alone.
pub fn rewrite_argv(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut literal = false;
    for arg in args {
        if literal {
            out.push(arg);
            continue;
        }
        if arg == "--" {
            literal = true;
            out.push(arg);
            continue;
        }
        let rewritten = arg.to_str().and_then(|s| {
            let (flag, value) = match s.split_once('=') {
                Some((f, v)) => (f, Some(v)),
                None => (s, None),
            };
            SHORT_ALIASES
                .iter()
                .find(|(short, _)| *short == flag)
                .map(|(_, long)| match value {
                    Some(v) => OsString::from(format!("{long}={v}")),
                    None => OsString::from(*long),
                })
        });
        out.push(rewritten.unwrap_or(arg));
    }
    out
}

/// `--smooth-method` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SmoothArg {
    None,
    Floor,
    #[value(name = "add-k")]
    AddK,
    Exp,
}

impl SmoothArg {
    /// sacrebleu's name (signature `smooth:` field).
    pub fn name(self) -> &'static str {
        match self {
            SmoothArg::None => "none",
            SmoothArg::Floor => "floor",
            SmoothArg::AddK => "add-k",
            SmoothArg::Exp => "exp",
        }
    }

    /// sacrebleu's `BLEU.SMOOTH_DEFAULTS`: the value used when `--smooth-value` is not given.
    pub fn default_value(self) -> Option<f64> {
        match self {
            SmoothArg::Floor => Some(0.1),
            SmoothArg::AddK => Some(1.0),
            _ => None,
        }
    }
}

/// `--format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Json,
    Text,
    Latex,
}

/// Computes BLEU, chrF and TER exactly as sacrebleu 2.6.0 does, much faster.
///
/// Reads the hypotheses from the -i files (one system per file) or from standard input (one
/// system per tab-separated field), and the references from the REF files (one line per
/// segment; several files or --num-refs for several references).
#[derive(Debug, Parser)]
#[command(
    name = "candle-bleu",
    version = concat!(env!("CARGO_PKG_VERSION"), " (sacrebleu 2.6.0 compatible BLEU, chrF and TER)"),
    infer_long_args = true,
    allow_negative_numbers = true,
    args_override_self = true,
    after_help = "Exit status: 0 on success, 2 on any error (bad arguments or input: the message \
                  on stderr names the file and line). sacrebleu's multi-letter short options \
                  (-tok, -lc, -sv, -sl, -nr, -ci, -cin, -pbs, -pbsn, -par, -parn, -sh, -nc, -cc, \
                  -cw) are accepted. See docs/CLI.md."
)]
pub struct Args {
    /// Reference files, one segment per line (give them before -i).
    #[arg(value_name = "REF")]
    pub refs: Vec<PathBuf>,

    /// Hypothesis files, one system per file (default: standard input).
    #[arg(short = 'i', long = "input", num_args = 1.., value_name = "HYP")]
    pub input: Option<Vec<PathBuf>>,

    /// Split each reference line on tabs into this many references (-nr).
    #[arg(long = "num-refs", default_value_t = 1, value_name = "N")]
    pub num_refs: i64,

    /// Input encoding; only utf-8 is supported (-e).
    #[arg(short = 'e', long = "encoding", default_value = "utf-8")]
    pub encoding: String,

    /// Metrics: bleu, chrf, ter, or several (-m bleu chrf ter).
    #[arg(short = 'm', long = "metrics", num_args = 1.., default_value = "bleu")]
    pub metrics: Vec<String>,

    /// One score per segment, effective order on (-sl).
    #[arg(long = "sentence-level")]
    pub sentence_level: bool,

    /// Smoothing: exp (NIST), floor, add-k or none (-s).
    #[arg(short = 's', long = "smooth-method", value_enum, default_value = "exp")]
    pub smooth_method: SmoothArg,

    /// Value for floor (default 0.1) and add-k (default 1) (-sv).
    #[arg(long = "smooth-value", value_name = "V")]
    pub smooth_value: Option<f64>,

    /// Tokenizer: 13a (default), none, intl, char, zh (-tok).
    #[arg(long = "tokenize", value_name = "TOK")]
    pub tokenize: Option<String>,

    /// Case-insensitive BLEU (-lc).
    #[arg(long = "lowercase")]
    pub lowercase: bool,

    /// Do not warn about input that looks tokenized.
    #[arg(long = "force")]
    pub force: bool,

    /// Largest n-gram order (not a sacrebleu CLI option: its API's max_ngram_order); shown
    /// as `ngram:N` in the signature when not 4.
    #[arg(
        long = "max-ngram-order",
        visible_alias = "bleu-max-ngram-order",
        default_value_t = 4,
        value_name = "N"
    )]
    pub max_ngram_order: i64,

    /// chrF: character n-gram order (-cc).
    #[arg(long = "chrf-char-order", default_value_t = 6, value_name = "N")]
    pub chrf_char_order: i64,

    /// chrF: word n-gram order; 2 is chrF++ (-cw).
    #[arg(long = "chrf-word-order", default_value_t = 0, value_name = "N")]
    pub chrf_word_order: i64,

    /// chrF: importance of recall against precision.
    #[arg(long = "chrf-beta", default_value_t = 2, value_name = "B")]
    pub chrf_beta: i64,

    /// chrF: keep whitespace in the character n-grams.
    #[arg(long = "chrf-whitespace")]
    pub chrf_whitespace: bool,

    /// chrF: case-insensitive.
    #[arg(long = "chrf-lowercase")]
    pub chrf_lowercase: bool,

    /// chrF: epsilon smoothing (chrF++.py, NLTK, Moses) instead of effective order.
    #[arg(long = "chrf-eps-smoothing")]
    pub chrf_eps_smoothing: bool,

    /// TER: case-sensitive (by default every line is lowercased).
    #[arg(long = "ter-case-sensitive")]
    pub ter_case_sensitive: bool,

    /// TER: special treatment of Asian (CJK) characters with --ter-normalized or
    /// --ter-no-punct.
    #[arg(long = "ter-asian-support")]
    pub ter_asian_support: bool,

    /// TER: remove punctuation.
    #[arg(long = "ter-no-punct")]
    pub ter_no_punct: bool,

    /// TER: tercom's normalization and tokenization (punctuation split off, XML entities).
    #[arg(long = "ter-normalized")]
    pub ter_normalized: bool,

    /// Report a bootstrap 95% confidence interval (-ci).
    #[arg(long = "confidence")]
    pub confidence: bool,

    /// Number of bootstrap resamples for -ci (-cin).
    #[arg(long = "confidence-n", default_value_t = 1000, value_name = "N")]
    pub confidence_n: i64,

    /// Paired bootstrap resampling test; the first -i system is the baseline (-pbs).
    #[arg(long = "paired-bs", conflicts_with = "paired_ar")]
    pub paired_bs: bool,

    /// Paired approximate randomization test; the first -i system is the baseline (-par).
    #[arg(long = "paired-ar")]
    pub paired_ar: bool,

    /// Number of resamples for the paired bootstrap test (-pbsn).
    #[arg(long = "paired-bs-n", default_value_t = 1000, value_name = "N")]
    pub paired_bs_n: i64,

    /// Number of trials for approximate randomization (-parn).
    #[arg(long = "paired-ar-n", default_value_t = 10000, value_name = "N")]
    pub paired_ar_n: i64,

    /// Accepted for compatibility and ignored (the tests are deterministic and fast).
    #[arg(
        short = 'j',
        long = "paired-jobs",
        default_value_t = 1,
        value_name = "N"
    )]
    pub paired_jobs: i64,

    /// Suppress informational messages (-q).
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,

    /// Short signature (-sh).
    #[arg(long = "short")]
    pub short: bool,

    /// Print only the score (-b).
    #[arg(short = 'b', long = "score-only")]
    pub score_only: bool,

    /// Decimal places of the scores (-w).
    #[arg(short = 'w', long = "width", default_value_t = 1, value_name = "W")]
    pub width: i64,

    /// Accepted for compatibility; output is never colored (-nc).
    #[arg(long = "no-color")]
    pub no_color: bool,

    /// Output format: json (default; overridden by $SACREBLEU_FORMAT), text, latex (-f).
    #[arg(short = 'f', long = "format", value_enum, default_value = "json")]
    pub format: Format,

    /// Not supported (sacrebleu test sets need downloads) (-t).
    #[arg(short = 't', long = "test-set", hide = true)]
    pub test_set: Option<String>,

    /// Not supported (-l).
    #[arg(short = 'l', long = "language-pair", hide = true)]
    pub langpair: Option<String>,

    /// Not supported.
    #[arg(long = "origlang", hide = true)]
    pub origlang: Option<String>,

    /// Not supported.
    #[arg(long = "subset", hide = true)]
    pub subset: Option<String>,

    /// Not supported.
    #[arg(long = "download", hide = true)]
    pub download: Option<String>,

    /// Not supported.
    #[arg(long = "echo", num_args = 1.., hide = true)]
    pub echo: Option<Vec<String>>,

    /// Not supported.
    #[arg(long = "list", hide = true)]
    pub list: bool,

    /// Not supported.
    #[arg(long = "citation", visible_alias = "cite", hide = true)]
    pub citation: bool,

    /// Not supported (-d).
    #[arg(short = 'd', long = "detail", hide = true)]
    pub detail: bool,
}

impl Args {
    /// The first sacrebleu option given that this tool does not implement, if any.
    pub fn unsupported(&self) -> Option<&'static str> {
        if self.test_set.is_some() {
            Some("--test-set/-t (sacrebleu's downloadable test sets)")
        } else if self.langpair.is_some() {
            Some("--language-pair/-l")
        } else if self.origlang.is_some() {
            Some("--origlang/-ol")
        } else if self.subset.is_some() {
            Some("--subset")
        } else if self.download.is_some() {
            Some("--download")
        } else if self.echo.is_some() {
            Some("--echo")
        } else if self.list {
            Some("--list")
        } else if self.citation {
            Some("--citation")
        } else if self.detail {
            Some("--detail/-d")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_multi_letter_short_options() {
        let argv = [
            "candle-bleu",
            "r",
            "-tok",
            "none",
            "-lc",
            "-sv=0.5",
            "--",
            "-lc",
        ]
        .map(OsString::from);
        let out = rewrite_argv(argv);
        assert_eq!(
            out,
            [
                "candle-bleu",
                "r",
                "--tokenize",
                "none",
                "--lowercase",
                "--smooth-value=0.5",
                "--",
                "-lc"
            ]
            .map(OsString::from)
        );
    }
}
