//! `loss::distributed` in one process: N workers (threads, [`ThreadAllReduce`]) × B/N elements
//! give the single-process loss, cross-entropy, BLEU loss and parameter gradients of the whole
//! batch, in f64, for every form × length model × reduction, with and without padding, with
//! shards of unequal size and a shard of only padding; the parts on their own; the errors.

mod distributed_fixture;

use candle_bleu::loss::distributed::{
    self, shard_range, AllReduce, DataParallel, SingleWorker, ThreadAllReduce,
};
use candle_bleu::loss::{
    bleu_loss_from_logits, cross_entropy_from_logits, loss_from_stats, BleuLossConfig,
    CrossEntropyConfig, Reduction, References, TrainingLossConfig, TrainingTargets,
};
use candle_core::{DType, Device, Result, Tensor, Var};
use distributed_fixture::*;

/// Runs `f` on each worker of a new group of `world` threads; the results in rank order.
fn in_threads<T: Send>(
    world: usize,
    f: impl Fn(&ThreadAllReduce) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let group = ThreadAllReduce::group(world);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = group.iter().map(|r| s.spawn(move || f(r))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker panicked"))
            .collect()
    })
}

/// f64 round-off of a few hundred operations; observed ≤ 1e-15.
const TOLERANCE: f64 = 1e-12;

#[test]
fn workers_give_the_single_process_loss_and_gradients() -> Result<()> {
    let mut worst: f64 = 0.0;
    let mut checked = 0;
    for pad_shard in [false, true] {
        let fixture = Fixture::new(pad_shard)?;
        for cfg in configs() {
            let single = fixture.single(&cfg)?;
            for input in [Input::Logits, Input::Hidden] {
                for world in [1, 2, 3, 5] {
                    let outcomes = in_threads(world, |r| fixture.worker_from(&cfg, r, input));
                    let outcomes: Vec<Outcome> = outcomes.into_iter().collect::<Result<_>>()?;
                    for (rank, outcome) in outcomes.iter().enumerate() {
                        let d = outcome.max_difference(&single);
                        worst = worst.max(d);
                        assert!(
                            d < TOLERANCE,
                            "{} (pad shard {pad_shard}), {input:?}, worker {rank} of {world}: {outcome:?} vs single {single:?} (max difference {d:e})",
                            describe(&cfg)
                        );
                        // Every worker holds the same numbers: the all-reduce's, bit for bit.
                        assert_eq!(
                            outcome,
                            &outcomes[0],
                            "{} {input:?} world {world}",
                            describe(&cfg)
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 2 * 36 * 2 * 4);
    eprintln!("{checked} splits, max relative difference {worst:e}");
    Ok(())
}

#[test]
fn a_shard_of_only_padding_adds_nothing_but_its_bleu() -> Result<()> {
    let fixture = Fixture::new(true)?;
    let cfg = &configs()[0];
    assert_eq!(cfg.ce.pad_id, Some(PAD));
    // Worker 2 of 3 holds element 4 alone, whose targets are all padding: the single-process
    // cross-entropy of its shard errors, the distributed parts do not.
    assert_eq!(shard_range(BATCH, 2, 3)?, (4, 1));
    let vars = fixture.vars()?;
    let logits = fixture.logits(&vars, 4, 1)?;
    let targets = fixture.targets.narrow(0, 4, 1)?;
    let err = cross_entropy_from_logits(&logits, &targets, &cfg.ce).unwrap_err();
    assert!(err.to_string().contains("pad_id"), "{err}");

    let (sum, count) = distributed::cross_entropy_sum_and_count(&logits, &targets, &cfg.ce)?;
    assert_eq!(
        (sum.to_scalar::<f64>()?, count.to_scalar::<f64>()?),
        (0.0, 0.0)
    );
    let grads = sum.backward()?;
    let grad = grads.get(vars[0].as_tensor()).expect("a gradient");
    assert_eq!(grad.abs()?.max_all()?.to_scalar::<f64>()?, 0.0);

    // On a shard with targets, the sum and the count are the mean's parts.
    let (sum, count) = distributed::cross_entropy_sum_and_count(
        &fixture.logits(&vars, 0, 3)?,
        &fixture.targets.narrow(0, 0, 3)?,
        &cfg.ce,
    )?;
    let mean = cross_entropy_from_logits(
        &fixture.logits(&vars, 0, 3)?,
        &fixture.targets.narrow(0, 0, 3)?,
        &cfg.ce,
    )?
    .loss
    .to_scalar::<f64>()?;
    // 3 elements × 6 positions, 4 of them padding.
    assert_eq!(count.to_scalar::<f64>()?, 14.0);
    assert!((sum.to_scalar::<f64>()? - 14.0 * mean).abs() < 1e-12);
    Ok(())
}

#[test]
fn no_target_in_the_global_batch_is_an_error_on_every_worker() -> Result<()> {
    let mut fixture = Fixture::new(false)?;
    fixture.targets = Tensor::full(PAD, (BATCH, SEQ), &Device::Cpu)?;
    let cfg = &configs()[0];
    for result in in_threads(2, |r| fixture.worker(cfg, r)) {
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("every `targets` position of every worker"),
            "{err}"
        );
    }
    // `pad_id` 0 with a vocabulary of one id: no target can ever count. A shard's sum and count
    // are (0, 0); the mean of the group is the error, on every worker.
    let logits = Tensor::zeros((1, 2, 1), DType::F64, &Device::Cpu)?;
    let targets = Tensor::new(&[[0u32, 0]], &Device::Cpu)?;
    let (sum, count) = distributed::cross_entropy_sum_and_count(&logits, &targets, &cfg.ce)?;
    assert_eq!(
        (sum.to_scalar::<f64>()?, count.to_scalar::<f64>()?),
        (0.0, 0.0)
    );
    let results = in_threads(2, |r| {
        DataParallel::new(r).cross_entropy_from_logits(&logits, &targets, &cfg.ce)
    });
    for result in results {
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("every `targets` position of every worker"),
            "{err}"
        );
    }
    Ok(())
}

#[test]
fn the_parts_alone_equal_their_single_process_values() -> Result<()> {
    let fixture = Fixture::new(true)?;
    let vars = fixture.vars()?;
    let ce_cfg = CrossEntropyConfig {
        pad_id: Some(PAD),
        label_smoothing: 0.2,
        ..Default::default()
    };
    let full_logits = fixture.logits(&vars, 0, BATCH)?;
    let single_ce = cross_entropy_from_logits(&full_logits, &fixture.targets, &ce_cfg)?.loss;
    let full_refs = References::from_ids(&fixture.ref_ids, PAD)?;
    for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
        let bleu_cfg = BleuLossConfig {
            reduction,
            ..Default::default()
        };
        let single =
            bleu_loss_from_logits(&full_logits, Some(&fixture.lengths), &full_refs, &bleu_cfg)?;
        let results = in_threads(3, |r| -> Result<(f64, f64, Vec<f64>)> {
            let (start, len) = shard_range(BATCH, r.rank(), r.world_size())?;
            let dp = DataParallel::new(r);
            let logits = fixture.logits(&vars, start, len)?;
            let ce = dp
                .cross_entropy_from_logits(
                    &logits,
                    &fixture.targets.narrow(0, start, len)?,
                    &ce_cfg,
                )?
                .loss;
            let refs = References::from_ids(&fixture.ref_ids.narrow(0, start, len)?, PAD)?;
            let lengths = fixture.lengths.narrow(0, start, len)?;
            let out = bleu_loss_from_logits(&logits, Some(&lengths), &refs, &bleu_cfg)?;
            let bleu = dp.bleu_loss_from_stats(&out.stats, &bleu_cfg)?;
            let stats = dp.global_stats(&out.stats)?;
            let sums = Tensor::cat(
                &[
                    stats.matches.squeeze(0)?,
                    stats.totals.squeeze(0)?,
                    stats.hyp_len,
                    stats.ref_len,
                ],
                0,
            )?
            .to_vec1::<f64>()?;
            Ok((ce.to_scalar()?, bleu.to_scalar()?, sums))
        });
        let single_sums = Tensor::cat(
            &[
                single.stats.matches.sum(0)?,
                single.stats.totals.sum(0)?,
                single.stats.hyp_len.sum_keepdim(0)?,
                single.stats.ref_len.sum_keepdim(0)?,
            ],
            0,
        )?
        .to_vec1::<f64>()?;
        for result in results {
            let (ce, bleu, sums) = result?;
            assert!(
                (ce - single_ce.to_scalar::<f64>()?).abs() < TOLERANCE,
                "{ce}"
            );
            let single_bleu = single.loss.to_scalar::<f64>()?;
            assert!(
                (bleu - single_bleu).abs() < TOLERANCE,
                "{reduction:?}: {bleu} vs {single_bleu}"
            );
            for (a, b) in sums.iter().zip(&single_sums) {
                assert!((a - b).abs() < TOLERANCE, "{sums:?} vs {single_sums:?}");
            }
        }
        // The corpus loss of the global statistics is the corpus loss of the batch.
        if reduction == Reduction::Corpus {
            let stats = DataParallel::new(&SingleWorker).global_stats(&single.stats)?;
            let loss = loss_from_stats(&stats, &bleu_cfg)?.to_scalar::<f64>()?;
            assert!((loss - single.loss.to_scalar::<f64>()?).abs() < TOLERANCE);
        }
    }
    Ok(())
}

/// The data-parallel entry points from hidden states (and `bleu_loss_from_logits`) on their own:
/// each worker's cross-entropy and BLEU loss equal the single-process values of the whole batch,
/// and so do the summed parameter gradients.
#[test]
fn the_parts_from_hidden_states_equal_their_single_process_values() -> Result<()> {
    let fixture = Fixture::new(true)?;
    let ce_cfg = CrossEntropyConfig {
        pad_id: Some(PAD),
        label_smoothing: 0.2,
        ..Default::default()
    };
    let blocks = Input::blocks();
    let full_refs = References::from_ids(&fixture.ref_ids, PAD)?;
    for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
        let bleu_cfg = BleuLossConfig {
            reduction,
            ..Default::default()
        };
        // One process, from the logits: values and the gradients of W and b.
        let single = {
            let vars = fixture.vars()?;
            let logits = fixture.logits(&vars, 0, BATCH)?;
            let ce = cross_entropy_from_logits(&logits, &fixture.targets, &ce_cfg)?.loss;
            let lengths = Some(&fixture.lengths);
            let bleu = bleu_loss_from_logits(&logits, lengths, &full_refs, &bleu_cfg)?.loss;
            let grads = (&ce + &bleu)?.backward()?;
            let grad = |v: &Var| grads.get(v.as_tensor()).expect("a gradient").flatten_all();
            let mut grad_values = grad(&vars[0])?.to_vec1::<f64>()?;
            grad_values.extend(grad(&vars[1])?.to_vec1::<f64>()?);
            (
                ce.to_scalar::<f64>()?,
                bleu.to_scalar::<f64>()?,
                grad_values,
            )
        };
        let results = in_threads(3, |r| -> Result<[(f64, f64, Vec<f64>); 2]> {
            let (start, len) = shard_range(BATCH, r.rank(), r.world_size())?;
            let targets = fixture.targets.narrow(0, start, len)?;
            let refs = References::from_ids(&fixture.ref_ids.narrow(0, start, len)?, PAD)?;
            let lengths = fixture.lengths.narrow(0, start, len)?;
            let dp = DataParallel::new(r);
            let mut out = Vec::new();
            for input in [Input::Hidden, Input::Logits] {
                let vars = fixture.vars()?;
                let (ce, bleu) = match input {
                    Input::Hidden => {
                        let hidden = fixture.x.narrow(0, start, len)?;
                        let proj = candle_nn::Linear::new(
                            vars[0].as_tensor().t()?,
                            Some(vars[1].as_tensor().clone()),
                        );
                        let ce = dp
                            .cross_entropy_from_hidden(&hidden, &proj, &targets, &ce_cfg, &blocks)?
                            .loss;
                        let bleu = dp.bleu_loss_from_hidden(
                            &hidden,
                            &proj,
                            Some(&lengths),
                            &refs,
                            &bleu_cfg,
                            &blocks,
                        )?;
                        (ce, bleu.loss)
                    }
                    Input::Logits => {
                        let logits = fixture.logits(&vars, start, len)?;
                        let ce = dp
                            .cross_entropy_from_logits(&logits, &targets, &ce_cfg)?
                            .loss;
                        let bleu =
                            dp.bleu_loss_from_logits(&logits, Some(&lengths), &refs, &bleu_cfg)?;
                        (ce, bleu.loss)
                    }
                };
                let mut grads = (&ce + &bleu)?.backward()?;
                dp.sum_gradients(&mut grads, &vars)?;
                let grad = |v: &Var| grads.get(v.as_tensor()).expect("a gradient").flatten_all();
                let mut grad_values = grad(&vars[0])?.to_vec1::<f64>()?;
                grad_values.extend(grad(&vars[1])?.to_vec1::<f64>()?);
                out.push((
                    ce.to_scalar::<f64>()?,
                    bleu.to_scalar::<f64>()?,
                    grad_values,
                ));
            }
            let second = out.pop().expect("two inputs");
            let first = out.pop().expect("two inputs");
            Ok([first, second])
        });
        for (rank, result) in results.into_iter().enumerate() {
            for (input, (ce, bleu, grads)) in [Input::Hidden, Input::Logits].iter().zip(result?) {
                let what = format!("{reduction:?}, {input:?}, worker {rank} of 3");
                assert!(
                    (ce - single.0).abs() < TOLERANCE,
                    "{what}: {ce} vs {}",
                    single.0
                );
                assert!(
                    (bleu - single.1).abs() < TOLERANCE,
                    "{what}: {bleu} vs {}",
                    single.1
                );
                assert_eq!(grads.len(), single.2.len(), "{what}");
                for (a, b) in grads.iter().zip(&single.2) {
                    assert!(
                        (a - b).abs() < TOLERANCE * b.abs().max(1.0),
                        "{what}: {a} vs {b}"
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn averaging_the_workers_losses_would_be_wrong() -> Result<()> {
    // Why the module exists: the mean of two workers' own corpus losses is not the corpus loss.
    let fixture = Fixture::new(false)?;
    let cfg = TrainingLossConfig::default();
    let single = fixture.single(&cfg)?.bleu;
    let shards: Vec<f64> = [(0, 2), (2, 3)]
        .into_iter()
        .map(|range| Ok(fixture.run(&cfg, range, None, Input::Logits)?.bleu))
        .collect::<Result<_>>()?;
    let averaged = (shards[0] + shards[1]) / 2.0;
    assert!((averaged - single).abs() > 1e-3, "{averaged} vs {single}");
    Ok(())
}

#[test]
fn single_worker_is_the_identity() -> Result<()> {
    let fixture = Fixture::new(false)?;
    for cfg in configs().iter().step_by(5) {
        let single = fixture.single(cfg)?;
        let alone = fixture.worker(cfg, &SingleWorker)?;
        assert!(
            alone.max_difference(&single) < TOLERANCE,
            "{}",
            describe(cfg)
        );
    }
    let t = Tensor::new(&[1.5f32, -2.0], &Device::Cpu)?;
    assert_eq!(SingleWorker.sum(&t)?.to_vec1::<f32>()?, vec![1.5, -2.0]);
    assert_eq!((SingleWorker.rank(), SingleWorker.world_size()), (0, 1));
    Ok(())
}

#[test]
fn sum_gradients_sums_and_fills_missing_gradients() -> Result<()> {
    let results = in_threads(3, |r| -> Result<(Vec<f64>, Vec<f64>)> {
        let shared = Var::new(&[1f64, 2.0], &Device::Cpu)?;
        let only_first = Var::new(&[3f64], &Device::Cpu)?;
        let k = (r.rank() + 1) as f64;
        // Worker k: loss = k·Σ shared (+ only_first² on worker 0 alone).
        let mut loss = shared.as_tensor().sum_all()?.affine(k, 0.0)?;
        if r.rank() == 0 {
            loss = (loss + only_first.as_tensor().sqr()?.sum_all()?)?;
        }
        let mut grads = loss.backward()?;
        DataParallel::new(r).sum_gradients(&mut grads, &[shared.clone(), only_first.clone()])?;
        let get = |v: &Var| grads.get(v.as_tensor()).unwrap().to_vec1::<f64>();
        Ok((get(&shared)?, get(&only_first)?))
    });
    for result in results {
        let (shared, only_first) = result?;
        assert_eq!(shared, vec![6.0, 6.0]); // 1 + 2 + 3
        assert_eq!(only_first, vec![6.0]); // 2·3 from worker 0, zeros from the others
    }
    Ok(())
}

#[test]
fn global_sum_has_the_local_gradient() -> Result<()> {
    let results = in_threads(2, |r| -> Result<(f64, f64)> {
        let x = Var::new(&[1f64 + r.rank() as f64], &Device::Cpu)?;
        let total = DataParallel::new(r)
            .global_sum(&x.as_tensor().sqr()?)?
            .sum_all()?;
        let grad = total.backward()?.get(x.as_tensor()).unwrap().sum_all()?;
        Ok((total.to_scalar()?, grad.to_scalar()?))
    });
    let results: Vec<(f64, f64)> = results.into_iter().collect::<Result<_>>()?;
    assert_eq!(results, vec![(5.0, 2.0), (5.0, 4.0)]);
    Ok(())
}

#[test]
fn shard_ranges_cover_the_batch() -> Result<()> {
    for (total, world) in [(5, 2), (5, 3), (2, 3), (8, 4), (1, 1)] {
        let mut next = 0;
        for rank in 0..world {
            let (start, len) = shard_range(total, rank, world)?;
            assert_eq!(start, next);
            assert!(len == total / world || len == total / world + 1);
            next += len;
        }
        assert_eq!(next, total);
    }
    assert!(shard_range(4, 2, 2).is_err());
    assert!(shard_range(4, 0, 0).is_err());
    Ok(())
}

#[test]
fn mismatched_shapes_are_an_error_on_every_worker() {
    let results = in_threads(2, |r| {
        let t = Tensor::zeros(1 + r.rank(), DType::F32, &Device::Cpu)?;
        r.sum(&t)
    });
    for result in results {
        let err = result.unwrap_err().to_string();
        assert!(err.contains("same shape and dtype"), "{err}");
    }
}

/// A worker's negative statistics are refused before the all-reduce, where another worker's
/// positive ones could hide them in the global sums.
#[test]
fn negative_local_statistics_are_an_error() -> Result<()> {
    let cfg = BleuLossConfig::default();
    let ones = Tensor::ones((1, 4), DType::F64, &Device::Cpu)?;
    let length = Tensor::ones(1, DType::F64, &Device::Cpu)?;
    let negative = Tensor::new(&[[3.0f64, -1.0, 1.0, 1.0]], &Device::Cpu)?;
    let local = candle_bleu::loss::BleuStats {
        matches: negative,
        totals: ones.affine(4.0, 0.0)?,
        hyp_len: length.affine(4.0, 0.0)?,
        ref_len: length.affine(4.0, 0.0)?,
    };
    let err = DataParallel::new(&SingleWorker)
        .bleu_loss_from_stats(&local, &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`stats.matches`") && err.contains("negative"),
        "{err}"
    );
    Ok(())
}

#[test]
fn broadcast_parameters_gives_every_worker_the_first_workers_values() -> Result<()> {
    let results = in_threads(3, |r| -> Result<Vec<Vec<f64>>> {
        let varmap = candle_nn::VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
        // Different random values on every worker, as separate processes would have.
        let _ = vb.get_with_hints(
            (2, 3),
            "b",
            candle_nn::Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            },
        )?;
        let _ = vb.get_with_hints(4, "a", candle_nn::Init::Const(r.rank() as f64))?;
        let vars = distributed::vars_by_name(&varmap);
        assert_eq!(vars[0].dims(), &[4]); // "a" before "b"
        DataParallel::new(r).broadcast_parameters(&vars)?;
        vars.iter()
            .map(|v| v.as_tensor().flatten_all()?.to_vec1::<f64>())
            .collect()
    });
    let results: Vec<Vec<Vec<f64>>> = results.into_iter().collect::<Result<_>>()?;
    assert_eq!(results[0][0], vec![0.0; 4]);
    assert_eq!(results[1], results[0]);
    assert_eq!(results[2], results[0]);
    Ok(())
}

/// With `--features nccl` on a machine with a GPU: a one-rank NCCL communicator (every code
/// path of `NcclAllReduce`, one GPU) gives the CPU's single-process numbers. Skipped with a
/// note where no CUDA device opens. **Not yet run on a GPU.**
#[cfg(feature = "nccl")]
#[test]
fn nccl_single_rank_on_a_gpu_gives_the_single_process_numbers() -> Result<()> {
    use candle_bleu::loss::distributed::{nccl::Id, NcclAllReduce};
    use std::io::Write;
    let device = match Device::new_cuda(0) {
        Ok(device) => device,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "note: NCCL test skipped: no CUDA device ({e})"
            );
            return Ok(());
        }
    };
    let id = Id::new().map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
    let reduce = NcclAllReduce::new(&device, 0, 1, id)?;
    let t = Tensor::new(&[1.5f32, -2.0, 3.0], &device)?;
    assert_eq!(reduce.sum(&t)?.to_vec1::<f32>()?, vec![1.5, -2.0, 3.0]);
    for pad_shard in [false, true] {
        let cpu = Fixture::new(pad_shard)?;
        let gpu = cpu.on(&device)?;
        for cfg in configs() {
            let single = cpu.single(&cfg)?;
            let outcome = gpu.worker(&cfg, &reduce)?;
            let d = outcome.max_difference(&single);
            assert!(d < 1e-10, "{}: {d:e}", describe(&cfg));
        }
    }
    Ok(())
}

#[test]
fn the_loss_reads_one_number_to_the_host() -> Result<()> {
    // The global token count, checked to be positive: one counted copy per call, on any device;
    // the single-process call makes none with id references.
    let fixture = Fixture::new(false)?;
    let vars = fixture.vars()?;
    let logits = fixture.logits(&vars, 0, BATCH)?;
    let refs = References::from_ids(&fixture.ref_ids, PAD)?;
    let cfg = &configs()[0];
    let before = candle_bleu::loss::host_copies();
    let _ = candle_bleu::loss::ce_bleu_from_logits(
        &logits,
        &TrainingTargets::new(&fixture.targets, &refs).with_hyp_lengths(&fixture.lengths),
        cfg,
    )?;
    assert_eq!(candle_bleu::loss::host_copies() - before, 0);
    let before = candle_bleu::loss::host_copies();
    let _ = DataParallel::new(&SingleWorker).ce_bleu_from_logits(
        &logits,
        &TrainingTargets::new(&fixture.targets, &refs).with_hyp_lengths(&fixture.lengths),
        cfg,
    )?;
    assert_eq!(candle_bleu::loss::host_copies() - before, 1);
    Ok(())
}

/// The remaining entry points' data-parallel forms: the BLEU loss on probabilities
/// (`DataParallel::bleu_loss`) and on CTC outputs (`DataParallel::ctc_bleu_loss_from_logits`),
/// 2 workers of 3 + 2 elements against one process, both reductions: the loss of the global
/// batch on every worker, and each worker's gradient of its own inputs the single-process one.
#[test]
fn probabilities_and_ctc_outputs_data_parallel() -> Result<()> {
    use candle_bleu::loss::{bleu_loss, ctc_bleu_loss_from_logits};
    let fixture = Fixture::new(false)?;
    let vars = fixture.vars()?;
    let logits = fixture.logits(&vars, 0, BATCH)?.detach();
    let refs = References::from_ids(&fixture.ref_ids, PAD)?;
    for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
        let cfg = BleuLossConfig {
            max_order: 3,
            reduction,
            ..Default::default()
        };
        for ctc in [false, true] {
            // One process: the loss and the gradient of the whole batch's inputs.
            let input = |x: &Tensor| -> Result<Tensor> {
                if ctc {
                    Ok(x.clone())
                } else {
                    candle_nn::ops::softmax(x, candle_core::D::Minus1)
                }
            };
            let x = Var::from_tensor(&logits)?;
            let single = if ctc {
                ctc_bleu_loss_from_logits(x.as_tensor(), None, &refs, PAD, &cfg)?
            } else {
                bleu_loss(&input(x.as_tensor())?, Some(&fixture.lengths), &refs, &cfg)?
            };
            let single_grad = single.loss.backward()?.get(x.as_tensor()).unwrap().clone();
            let single_loss = single.loss.to_scalar::<f64>()?;
            let results = in_threads(2, |r| -> Result<(f64, Vec<f64>, Vec<f64>)> {
                let (start, len) = shard_range(BATCH, r.rank(), r.world_size())?;
                let x = Var::from_tensor(&logits.narrow(0, start, len)?)?;
                let shard_refs =
                    References::from_ids(&fixture.ref_ids.narrow(0, start, len)?, PAD)?;
                let out = if ctc {
                    DataParallel::new(r).ctc_bleu_loss_from_logits(
                        x.as_tensor(),
                        None,
                        &shard_refs,
                        PAD,
                        &cfg,
                    )?
                } else {
                    let lengths = fixture.lengths.narrow(0, start, len)?;
                    DataParallel::new(r).bleu_loss(
                        &input(x.as_tensor())?,
                        Some(&lengths),
                        &shard_refs,
                        &cfg,
                    )?
                };
                let grad = out
                    .loss
                    .backward()?
                    .get(x.as_tensor())
                    .unwrap()
                    .flatten_all()?;
                let expected = single_grad.narrow(0, start, len)?.flatten_all()?;
                Ok((out.loss.to_scalar()?, grad.to_vec1()?, expected.to_vec1()?))
            });
            for (rank, result) in results.into_iter().enumerate() {
                let (loss, grad, expected) = result?;
                let what = format!("{reduction:?}, ctc {ctc}, worker {rank}");
                assert!(
                    (loss - single_loss).abs() < TOLERANCE,
                    "{what}: {loss} vs {single_loss}"
                );
                for (a, b) in grad.iter().zip(&expected) {
                    assert!((a - b).abs() < TOLERANCE, "{what}: gradient {a} vs {b}");
                }
            }
        }
    }
    Ok(())
}

/// Under class weights a shard's `(sum, count)` are the weighted mean's parts: the count is
/// `Σ w_t` over the non-pad targets, so that `Σ_w sum_w / Σ_w count_w` over the shards is the
/// single-process weighted mean (here two shards of one element each). A z-loss with class
/// weights, whose weighted mean and z-term's mean take two different denominators, is a named
/// error.
#[test]
fn sum_and_count_under_class_weights_are_the_weighted_means_parts() -> Result<()> {
    let dev = Device::Cpu;
    let logits = Tensor::new(
        &[
            [[1f64, 2.0, 0.5, 0.0, -1.0], [0.3, -1.0, 2.0, 0.1, 0.2]],
            [[0.7, -0.4, 1.1, 2.0, 0.0], [-1.0, 0.5, 0.25, 1.5, 3.0]],
        ],
        &dev,
    )?;
    let targets = Tensor::new(&[[1u32, 2], [3, 0]], &dev)?;
    let weights = [0.0, 0.5, 2.0, 1.25, 1.0];
    let cfg = CrossEntropyConfig {
        pad_id: Some(0),
        class_weights: Some(weights.to_vec().into()),
        label_smoothing: 0.1,
        ..Default::default()
    };
    let mean = cross_entropy_from_logits(&logits, &targets, &cfg)?
        .loss
        .to_scalar::<f64>()?;
    let mut sums = 0.0;
    let mut counts = 0.0;
    for (shard, expected_count) in [(0, 0.5 + 2.0), (1, 1.25)] {
        let (sum, count) = distributed::cross_entropy_sum_and_count(
            &logits.narrow(0, shard, 1)?,
            &targets.narrow(0, shard, 1)?,
            &cfg,
        )?;
        let count = count.to_scalar::<f64>()?;
        assert_eq!(count, expected_count, "shard {shard}: Σ w_t");
        sums += sum.to_scalar::<f64>()?;
        counts += count;
    }
    assert!(
        (sums / counts - mean).abs() < 1e-12,
        "{sums} / {counts} vs {mean}"
    );
    let with_z = CrossEntropyConfig { z_loss: 0.1, ..cfg };
    let err = distributed::cross_entropy_sum_and_count(&logits, &targets, &with_z)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`class_weights` with `z_loss`"), "{err}");
    Ok(())
}
