//! The shared library pieces the examples are built from: token files and vocabularies,
//! batches, evaluation, checkpoints, plots — hand-computed values and errors (the model and
//! the soft decoder are checked in `study.rs`, the real-data pipeline in `mo.rs`, `corpus.rs`
//! and `bpe.rs`).

use candle_bleu_research::data::tokens::{read_tsv, tokenize, write_lines, Tokens, Vocab};
use candle_bleu_research::data::{
    make_batch, reference_tensor, source_tensor, Batches, Encoded, BOS, EOS, PAD, UNK,
};
use candle_bleu_research::eval::{
    bleu_100, compare, mean_sd, measure_controls, paired_bootstrap, repeated_token_rate,
    segment_stats,
};
use candle_bleu_research::plot::{
    bar_panel, colour, curve_panel, register_font, Curve, CurvePanel, CurveStyle,
};
use candle_bleu_research::train::{learning_rate, restore, snapshot};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarMap};
use plotters::prelude::*;

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "candle-bleu-research-{}-{name}",
        std::process::id()
    ));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn tokenize_and_read_tsv() {
    assert_eq!(tokenize(" a  b\tc ", Tokens::Whitespace), ["a", "b", "c"]);
    assert_eq!(tokenize("ab c", Tokens::Char), ["a", "b", "\u{2581}", "c"]);
    let path = temp_file("ok.tsv", "the cat\tdie Katze\r\n\n  \na dog\tein Hund\n");
    let pairs = read_tsv(&path, Tokens::Whitespace).unwrap();
    assert_eq!(pairs.len(), 2);
    assert_eq!(pairs[0].src, ["the", "cat"]);
    assert_eq!(pairs[1].tgt, ["ein", "Hund"]);
    std::fs::remove_file(&path).unwrap();

    let path = temp_file("notab.tsv", "a\tb\nno tab here\n");
    let err = read_tsv(&path, Tokens::Whitespace).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}:2: expected `source<TAB>target`, found no tab",
            path.display()
        )
    );
    std::fs::remove_file(&path).unwrap();
    let path = temp_file("empty-side.tsv", "a\t \n");
    let err = read_tsv(&path, Tokens::Whitespace).unwrap_err().to_string();
    assert_eq!(err, format!("{}:1: empty source or target", path.display()));
    std::fs::remove_file(&path).unwrap();
    let path = temp_file("blank.tsv", "\n\n");
    let err = read_tsv(&path, Tokens::Whitespace).unwrap_err().to_string();
    assert_eq!(err, format!("{} holds no sentence pairs", path.display()));
    std::fs::remove_file(&path).unwrap();

    let path = temp_file("lines.txt", "");
    write_lines(&path, &[words("a b"), vec![], words("c")]).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "a b\n\nc\n");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn vocabulary_ids() {
    let sequences = [words("b a b"), words("c a")];
    let vocab = Vocab::build(sequences.iter());
    assert_eq!(vocab.len(), 7); // 4 special tokens, then b, a, c in order of appearance
    assert!(!vocab.is_empty());
    assert_eq!(vocab.encode(&words("a b c zebra")), [5, 4, 6, UNK]);
    assert_eq!(
        vocab.decode(&[BOS, 5, PAD, 4, EOS, 6]).unwrap(),
        ["a", "b"],
        "stops at EOS, skips BOS and PAD"
    );
    assert_eq!(vocab.decode(&[UNK]).unwrap(), ["<unk>"]);
    let err = vocab.decode(&[4, 7]).unwrap_err().to_string();
    assert_eq!(err, "id 7 is outside the vocabulary (size 7)");
}

#[test]
fn batches_pad_and_shift() {
    let examples = [
        Encoded {
            src: vec![9, 8, 7],
            tgt: vec![5, 6],
        },
        Encoded {
            src: vec![4],
            tgt: vec![7],
        },
    ];
    let refs: Vec<&Encoded> = examples.iter().collect();
    let batch = make_batch(&refs, &Device::Cpu).unwrap();
    let rows = |t: &Tensor| t.to_vec2::<u32>().unwrap();
    assert_eq!(rows(&batch.src), [[9, 8, 7], [4, PAD, PAD]]);
    assert_eq!(rows(&batch.dec_in), [[BOS, 5, 6], [BOS, 7, PAD]]);
    assert_eq!(rows(&batch.dec_out), [[5, 6, EOS], [7, EOS, PAD]]);
    assert_eq!(rows(&batch.refs), [[5, 6], [7, PAD]]);
    assert_eq!(batch.ref_len.to_vec1::<u32>().unwrap(), [2, 1]);
    assert_eq!(
        rows(&source_tensor(&refs[1..], &Device::Cpu).unwrap()),
        [[4]]
    );

    // Every epoch visits each index once; the same seed gives the same batches.
    let mut a = Batches::new(10, 3, 7).unwrap();
    let mut b = Batches::new(10, 3, 7).unwrap();
    let mut epoch: Vec<usize> = (0..3).flat_map(|_| a.next_indices()).collect();
    let again: Vec<usize> = (0..3).flat_map(|_| b.next_indices()).collect();
    assert_eq!(epoch, again);
    epoch.sort();
    epoch.dedup();
    assert_eq!(epoch.len(), 9, "three batches of 3 distinct indices");
    assert_eq!(Batches::new(2, 64, 1).unwrap().next_indices().len(), 2);
    let err = Batches::new(0, 4, 1).err().unwrap().to_string();
    assert_eq!(
        err,
        "Batches: len (0) and batch_size (4) must be at least 1"
    );
}

#[test]
fn averaging_measure_controls_by_hand() {
    // Training targets: p(a) = 2/3, p(b) = 1/3; the constant predictor says `a`.
    let controls = measure_controls(&[words("a b a")], &[words("a b")]).unwrap();
    assert_eq!(controls.most_frequent_token, "a");
    let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
    // Position 0 (gold a): `a` elsewhere? no. Position 1 (gold b): `a` at position 0: yes.
    assert!(close(controls.constant.argmax_other_ref_rate, 0.5));
    assert_eq!(controls.constant.argmax_top_token_share, 1.0);
    assert!(close(controls.constant.argmax_ref_bag_coverage, 0.5)); // {a} of {a, b}
                                                                    // Unigram draws: position 0 scores p(b), position 1 p(a); mean 1/2.
    assert!(close(controls.unigram.argmax_other_ref_rate, 0.5));
    assert!(close(controls.unigram.argmax_top_token_share, 2.0 / 3.0));
    // Two draws: P(a hit) = 1 - (1/3)^2, P(b hit) = 1 - (2/3)^2; mean 13/18.
    assert!(close(controls.unigram.argmax_ref_bag_coverage, 13.0 / 18.0));
    assert_eq!(controls.references.argmax_other_ref_rate, 0.0);
    assert!(close(controls.references.argmax_top_token_share, 0.5));
    assert_eq!(controls.references.argmax_ref_bag_coverage, 1.0);
    let err = measure_controls(&[], &[words("a")])
        .unwrap_err()
        .to_string();
    assert_eq!(err, "measure_controls: train_targets has no tokens");
}

#[test]
fn evaluation_values() {
    let refs = vec![
        words("the cat sat on the mat"),
        words("a dog ran in the park"),
    ];
    // 100 up to rounding (sacrebleu prints 100.00000000000004 here too).
    assert!((bleu_100(&refs, &refs).unwrap() - 100.0).abs() < 1e-12);
    let disjoint = vec![words("x y z w v"), words("q r s t u")];
    assert_eq!(bleu_100(&disjoint, &refs).unwrap(), 0.0);

    let (mean, sd) = mean_sd(&[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(mean, 2.5);
    assert!((sd - (5.0f64 / 3.0).sqrt()).abs() < 1e-15);
    assert_eq!(mean_sd(&[7.0]), (7.0, 0.0));
    assert_eq!(
        repeated_token_rate(&[words("a b a"), words("c c c")]),
        0.5 // a (once), c (twice) out of 6 tokens
    );
    assert_eq!(repeated_token_rate(&[]), 0.0);

    // The two bootstrap entry points agree (both sacrebleu's, seed 12345).
    let hyps_a = vec![words("the cat sat on a mat"), words("a dog ran in a park")];
    let hyps_b = vec![
        words("the cat sat on the mat"),
        words("the dog ran in the park"),
    ];
    let a = segment_stats(&hyps_a, &refs).unwrap();
    let b = segment_stats(&hyps_b, &refs).unwrap();
    let pair = paired_bootstrap(&a, &b, 100, 12345).unwrap();
    let many = compare(&a, std::slice::from_ref(&b), 100).unwrap();
    assert_eq!(many.len(), 1);
    assert_eq!(pair.delta, many[0].delta);
    assert_eq!(pair.p_value, many[0].p_value);
    assert_eq!(pair.system_mean, many[0].mean);
    assert_eq!(
        pair.delta,
        bleu_100(&hyps_b, &refs).unwrap() - bleu_100(&hyps_a, &refs).unwrap()
    );
    assert!(
        pair.ci_low <= pair.delta && pair.delta <= pair.ci_high,
        "{pair:?}"
    );
    let same = paired_bootstrap(&a, &a, 100, 12345).unwrap();
    assert_eq!((same.delta, same.ci_low, same.ci_high), (0.0, 0.0, 0.0));
    let err = paired_bootstrap(&a, &b, 0, 12345).unwrap_err().to_string();
    assert_eq!(err, "paired bootstrap: resamples must be at least 1");
}

#[test]
fn snapshot_and_restore() {
    let varmap = VarMap::new();
    let w = varmap
        .get((2, 3), "w", Init::Const(1.5), DType::F32, &Device::Cpu)
        .unwrap();
    let saved = snapshot(&varmap).unwrap();
    varmap.data().lock().unwrap()["w"]
        .set(&Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap())
        .unwrap();
    assert_eq!(w.sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0);
    restore(&varmap, &saved).unwrap();
    assert_eq!(w.sum_all().unwrap().to_scalar::<f32>().unwrap(), 9.0);
    // The snapshot is a copy, not a view of the variable.
    assert_eq!(
        saved[0].1.sum_all().unwrap().to_scalar::<f32>().unwrap(),
        9.0
    );
    let other = vec![("v".to_string(), saved[0].1.clone())];
    let err = restore(&varmap, &other).unwrap_err().to_string();
    assert_eq!(err, "restore: the model has no variable `v`");
    // The schedule: warm-up, peak, cosine to 10 %.
    assert!(learning_rate(1.0, 4, 20, 0) < learning_rate(1.0, 4, 20, 3));
    assert_eq!(learning_rate(1.0, 4, 20, 4), 1.0);
    assert!((learning_rate(1.0, 4, 20, 20) - 0.1).abs() < 1e-15);
}

#[test]
fn plot_panels_draw() {
    register_font().unwrap();
    let (w, h) = (400u32, 300u32);
    let mut pixels = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area();
        root.fill(&WHITE).unwrap();
        let (left, right) = root.split_horizontally(200);
        let curves = [Curve {
            label: "ce".into(),
            colour: colour(0),
            points: vec![(0.0, 1.0), (50.0, 0.5), (100.0, 0.25)],
        }];
        let panel = CurvePanel {
            title: "loss",
            log_scale: false,
            x_max: 100.0,
            marker: Some((40.0, "switch")),
            legend: Some(SeriesLabelPosition::UpperRight),
            style: CurveStyle {
                caption: 12,
                margin: 4,
                x_label_area: 20,
                y_label_area: 30,
                y_labels: Some(5),
                label_size: 10,
                line_alpha: 1.0,
                legend_stroke: 2,
                legend_background: 0.8,
                legend_font: 10,
            },
        };
        curve_panel(&left, &panel, &curves).unwrap();
        // No points at all is drawable too (an empty [0, 1] range).
        curve_panel(&left, &panel, &[]).unwrap();
        bar_panel(
            &right,
            "bars",
            &[(0, vec![1.0, 2.0]), (1, vec![f64::NAN])],
            Some((1.5, "ref")),
        )
        .unwrap();
        root.present().unwrap();
    }
    // The line colour of objective 0 is somewhere in the picture.
    let blue = colour(0);
    assert!(pixels.chunks(3).any(|p| p == [blue.0, blue.1, blue.2]));
}

#[test]
fn output_distribution_of_a_small_model() -> anyhow::Result<()> {
    use candle_bleu_research::model::transformer::{PositionAdd, Transformer, TransformerConfig};
    use candle_bleu_research::translate::batches::{BatchIds, IdPairs};
    use candle_bleu_research::translate::evaluate::{output_distribution, TileFilter};
    let filter = |tau, block_rows, vocab_tile| TileFilter {
        tau,
        block_rows,
        vocab_tile,
    };
    let vocab = 40;
    let config = TransformerConfig {
        src_vocab: vocab,
        tgt_vocab: vocab,
        d_model: 16,
        heads: 4,
        d_ff: 32,
        encoder_layers: 1,
        decoder_layers: 1,
        max_len: 16,
        dropout: 0.0,
        tie_all: true,
        positions: PositionAdd::Broadcast,
    };
    let model = Transformer::new(config, &VarMap::new(), 7, &Device::Cpu)?;
    let pairs = IdPairs {
        src: vec![vec![5, 6, 7], vec![8, 9], vec![10, 11, 12, 13]],
        tgt: vec![vec![14, 15], vec![16, 17, 18, 19], vec![20]],
    };
    let ids = BatchIds {
        pad: PAD,
        bos: BOS,
        eos: EOS,
    };
    // Every target token and its EOS, no padding: 3 + 5 + 2 positions.
    let measured = output_distribution(&model, &pairs, ids, 2, filter(1e-30, 3, 8))?;
    assert_eq!(measured.positions, 10);
    assert!(measured.mean_entropy_nats > 0.0);
    assert!(measured.mean_entropy_nats <= (vocab as f64).ln() + 1e-6);
    assert!(measured.mean_target_prob > 0.0 && measured.mean_target_prob < 1.0);
    // No probability lies below 1e-30: nothing is below τ, no tile is skippable.
    assert_eq!(measured.share_below_tau, 0.0);
    assert_eq!(measured.skipped_tile_share, 0.0);
    // Batch size does not change the per-position numbers (batching changes only padding).
    let one_by_one = output_distribution(&model, &pairs, ids, 1, filter(1e-30, 3, 8))?;
    assert_eq!(one_by_one.positions, 10);
    assert!((one_by_one.mean_entropy_nats - measured.mean_entropy_nats).abs() < 1e-4);
    // Every probability of this untrained model is below 0.999: every tile is skippable.
    let all = output_distribution(&model, &pairs, ids, 2, filter(0.999, 3, 8))?;
    assert_eq!((all.share_below_tau, all.skipped_tile_share), (1.0, 1.0));
    // Bad arguments are named errors.
    for (tau, block, tile) in [(0.0, 3, 8), (1.0, 3, 8), (1e-5, 0, 8), (1e-5, 3, 0)] {
        let err =
            output_distribution(&model, &pairs, ids, 2, filter(tau, block, tile)).unwrap_err();
        assert!(err.to_string().contains("output_distribution"), "{err}");
    }
    Ok(())
}

/// References of uneven count and length become one `[B, R, T]` tensor padded with `PAD`,
/// which `References::from_ids` reads back as the same references.
#[test]
fn reference_tensor_pads_counts_and_lengths() -> anyhow::Result<()> {
    let refs = vec![vec![vec![4, 5, 6]], vec![vec![7], vec![8, 9]]];
    let ids = reference_tensor(&refs, PAD, &Device::Cpu)?;
    assert_eq!(
        ids.to_vec3::<u32>()?,
        vec![
            vec![vec![4, 5, 6], vec![PAD; 3]],
            vec![vec![7, PAD, PAD], vec![8, 9, PAD]],
        ]
    );
    let references = candle_bleu::loss::References::from_ids(&ids, PAD)?;
    assert_eq!(
        references.ids(),
        Some(&[vec![vec![4, 5, 6]], vec![vec![7], vec![8, 9]]][..])
    );
    Ok(())
}
