//! Build the real-data corpus from gettext catalogues, print its summary, and optionally write
//! the splits and train the BPE vocabulary on them.
//!
//! ```text
//! cargo run --release --example corpus                       # English→German from /usr/share/locale
//! cargo run --release --example corpus -- --lang ko --catalogues
//! cargo run --release --example corpus -- --lang fr --out runs/corpus/fr --bpe-vocab 8000
//! cargo run --release --example corpus -- --catalogs DIR      # catalogues fetched by scripts/fetch-catalogs.sh DIR
//! ```
//!
//! With `--out DIR` it writes `train.tsv`, `dev.tsv`, `test.tsv` (`source<TAB>target`),
//! `corpus.json` (the summary) and, with `--bpe-vocab N`, `tokenizer.json`, and prints the
//! mean subword lengths. The rules are in `candle_bleu_research::data::corpus`'s docs.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_bleu_research::data::{build_corpus, Bpe, BpeConfig, CorpusConfig, Split};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Build the English→LANG corpus from gettext .mo catalogues")]
struct Args {
    /// Directory holding <lang>/LC_MESSAGES/*.mo.
    #[arg(long, default_value = "/usr/share/locale")]
    catalogs: PathBuf,
    /// Target language (the directory name under --catalogs).
    #[arg(long, default_value = "de")]
    lang: String,
    /// Fewest source words.
    #[arg(long, default_value_t = 3)]
    min_words: usize,
    /// Most source words.
    #[arg(long, default_value_t = 30)]
    max_words: usize,
    /// Print the per-catalogue table.
    #[arg(long)]
    catalogues: bool,
    /// Write the splits, corpus.json (and tokenizer.json) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Train a BPE vocabulary of this size on the training split.
    #[arg(long)]
    bpe_vocab: Option<usize>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let config = CorpusConfig {
        catalogs: args.catalogs,
        lang: args.lang,
        min_words: args.min_words,
        max_words: args.max_words,
        ..Default::default()
    };
    let start = Instant::now();
    let corpus = build_corpus(&config)?;
    if args.catalogues {
        println!("{:#}", corpus.summary);
    } else {
        println!("{}", corpus.summary);
    }
    println!("built in {:.2} s", start.elapsed().as_secs_f64());
    if let Some(out) = &args.out {
        corpus.write(out)?;
        println!(
            "wrote {}/{{train,dev,test}}.tsv and corpus.json",
            out.display()
        );
    }
    if let Some(vocab_size) = args.bpe_vocab {
        let start = Instant::now();
        let bpe = Bpe::train_on_pairs(
            &corpus.train,
            &BpeConfig {
                vocab_size,
                ..Default::default()
            },
        )?;
        println!(
            "BPE: {} ids, trained in {:.2} s",
            bpe.vocab_size(),
            start.elapsed().as_secs_f64()
        );
        for split in Split::ALL {
            let pairs = corpus.split(split);
            if pairs.is_empty() {
                continue;
            }
            let (mut src, mut tgt) = (0usize, 0usize);
            for p in pairs {
                let s = bpe.encode(&p.source)?;
                let t = bpe.encode(&p.target)?;
                if bpe.decode(&s)? != p.source || bpe.decode(&t)? != p.target {
                    bail!("round trip failed on {p:?}");
                }
                src += s.len();
                tgt += t.len();
            }
            println!(
                "  {split}: {:.1} source / {:.1} target subwords per sentence (round trip exact)",
                src as f64 / pairs.len() as f64,
                tgt as f64 / pairs.len() as f64
            );
        }
        if let Some(out) = &args.out {
            bpe.save(out.join("tokenizer.json"))?;
            println!("wrote {}/tokenizer.json", out.display());
        }
    }
    Ok(())
}
