#!/usr/bin/env python3
"""Golden vectors for `candle_bleu::exact` from sacrebleu 2.6.0 and NLTK 3.10.4.

    pip install sacrebleu==2.6.0 nltk==3.10.4
    python3 tests/golden/generate_scores.py      # writes tests/golden/scores.json

Deterministic (fixed seed). Every case records its inputs (token ids or text tokens, references
per segment, possibly a different number per segment), the configuration, and either the full
output of the reference implementation or the name of the exception it raised.

- sacrebleu cases run `BLEU(tokenize='none', ...)` on the tokens joined by single spaces, so
  sacrebleu's `str.split()` gives back exactly these tokens (no token holds whitespace);
  corpora go through `corpus_score` with reference streams padded with `None` (variable
  reference counts), sentences through `sentence_score`.
- NLTK cases call `corpus_bleu` / `sentence_bleu` on the token lists themselves (ints for ids),
  with `SmoothingFunction().methodK` wrapped to record the smoothed precisions it returns.

tests/exact_golden.rs checks every case to 1e-12 relative (integer statistics exactly).
"""
import json
import logging
import math
import os
import random
import warnings
from fractions import Fraction

import nltk
import sacrebleu
from nltk.translate import bleu_score as nb
from sacrebleu.metrics import BLEU

assert sacrebleu.__version__ == "2.6.0", sacrebleu.__version__
assert nltk.__version__ == "3.10.4", nltk.__version__

warnings.simplefilter("ignore")
logging.getLogger("sacrebleu").setLevel(logging.ERROR)

SEED = 20240602
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scores.json")

WORDS = (
    "the a of to and in is it that for on with as was he be at by this had not are but from or "
    "have an they which one you were her all she there would their we him been has when who will "
    "cat mat dog sat party military guide action ensures obeys commands always , . ; : ' \" ( ) "
    "naïve café 中文 日本語 über Straße don't it's 1998. 3.14 -- ... « » “ ” € € ☃ 😀 x y z"
).split()


# ---------------------------------------------------------------------------------------------
# reference implementations


def sacre_run(case):
    n = case["max_order"]
    bleu = BLEU(
        tokenize="none",
        force=True,
        smooth_method=case["smooth"],
        smooth_value=case["smooth_value"],
        effective_order=case["effective_order"],
        max_ngram_order=n,
    )
    join = lambda toks: " ".join(str(t) for t in toks)
    hyps = [join(h) for h in case["hyps"]]
    if case["level"] == "sentence":
        s = bleu.sentence_score(hyps[0], [join(r) for r in case["refs"][0]])
    else:
        width = max((len(r) for r in case["refs"]), default=0)
        streams = [
            [join(r[j]) if j < len(r) else None for r in case["refs"]] for j in range(width)
        ]
        s = bleu.corpus_score(hyps, streams)
    return {
        "score": float(s.score),
        "precisions": [float(p) for p in s.precisions],
        "bp": float(s.bp),
        "ratio": float(s.ratio),
        "hyp_len": int(s.sys_len),
        "ref_len": int(s.ref_len),
        "counts": [float(c) for c in s.counts],
        "totals": [float(t) for t in s.totals],
    }


def nltk_stats(hyps, refs, n):
    """NLTK's own corpus statistics: summed numerators and floored denominators."""
    nums, dens = [0] * n, [0] * n
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs):
        for i in range(1, n + 1):
            p = nb.modified_precision(r, h, i)
            nums[i - 1] += p.numerator
            dens[i - 1] += p.denominator
        hyp_len += len(h)
        ref_len += nb.closest_ref_length(r, len(h))
    return nums, dens, hyp_len, ref_len


def nltk_run(case):
    n = case["max_order"]
    weights = tuple(case["weights"]) if case["weights"] is not None else (1.0 / n,) * n
    method = getattr(nb.SmoothingFunction(), "method%d" % case["smooth"])
    recorded = {}

    def smoothing(p_n, references, hypothesis, hyp_len):
        out = method(p_n, references=references, hypothesis=hypothesis, hyp_len=hyp_len)
        recorded["p"] = [float(p) for p in out]
        return out

    # Tokens as NLTK users pass them: ints for ids, strings for text.
    hyps = [list(h) for h in case["hyps"]]
    refs = [[list(x) for x in r] for r in case["refs"]]
    if case["level"] == "sentence":
        value = nb.sentence_bleu(refs[0], hyps[0], weights, smoothing_function=smoothing)
    else:
        value = nb.corpus_bleu(refs, hyps, weights, smoothing_function=smoothing)
    nums, dens, hyp_len, ref_len = nltk_stats(hyps, refs, n)
    precisions = recorded.get("p", [float(Fraction(m, d)) for m, d in zip(nums, dens)])
    return {
        "bleu": float(value),
        "precisions": precisions,
        "bp": float(nb.brevity_penalty(ref_len, hyp_len)),
        "ratio": hyp_len / ref_len if ref_len else 0.0,
        "hyp_len": hyp_len,
        "ref_len": ref_len,
        "counts": [float(m) for m in nums],
        "totals": [float(d) for d in dens],
    }


def run(case):
    try:
        case["expected"] = sacre_run(case) if case["impl"] == "sacrebleu" else nltk_run(case)
    except Exception as e:  # the Rust side must return an error here
        case["error"] = type(e).__name__
    return case


# ---------------------------------------------------------------------------------------------
# inputs

rng = random.Random(SEED)


def rand_ids(length, vocab, big=False):
    base = 4_000_000_000 if big else 1
    return [base + rng.randrange(vocab) for _ in range(length)]


def mutate(tokens, vocab, rate, big=False):
    """A noisy copy: substitutions, deletions and insertions, so n-grams partly match."""
    base = 4_000_000_000 if big else 1
    out = []
    for t in tokens:
        r = rng.random()
        if r < rate / 3:
            continue
        if r < 2 * rate / 3:
            out.append(base + rng.randrange(vocab))
            continue
        out.append(t)
        if r > 1 - rate / 3:
            out.append(base + rng.randrange(vocab))
    return out


def rand_segment(kind, nrefs, max_len=30, big=False):
    vocab = rng.choice([3, 6, 12, 40, 200])
    length = rng.choice([0, 1, 2, 3, 4, 5]) if rng.random() < 0.15 else rng.randrange(max_len + 1)
    ref_base = rand_ids(length, vocab, big)
    hyp = mutate(ref_base, vocab, rng.choice([0.0, 0.1, 0.3, 0.6, 1.0]), big)
    refs = [mutate(ref_base, vocab, rng.choice([0.0, 0.2, 0.4]), big) for _ in range(nrefs)]
    if rng.random() < 0.05:
        refs[rng.randrange(nrefs)] = []
    if kind == "text":
        table = {}
        words = WORDS[:]
        rng.shuffle(words)
        conv = lambda seq: [words[t % len(words)] for t in seq]
        return conv(hyp), [conv(r) for r in refs]
    return hyp, refs


def rand_corpus(kind, nseg, max_refs, variable, max_len=30, big=False):
    hyps, refs = [], []
    fixed = rng.randint(1, max_refs)
    for _ in range(nseg):
        nrefs = rng.randint(1, max_refs) if variable else fixed
        h, r = rand_segment(kind, nrefs, max_len, big)
        hyps.append(h)
        refs.append(r)
    return hyps, refs


SACRE_SMOOTHINGS = [
    ("none", None),
    ("floor", None),
    ("floor", 0.01),
    ("floor", 0.5),
    ("floor", 0.0),
    ("add-k", None),
    ("add-k", 0),
    ("add-k", 0.5),
    ("add-k", 2),
    ("exp", None),
]


def sacre_case(name, level, kind, hyps, refs, n, smooth, value, eff):
    return {
        "name": name,
        "impl": "sacrebleu",
        "level": level,
        "tokens": kind,
        "hyps": hyps,
        "refs": refs,
        "max_order": n,
        "smooth": smooth,
        "smooth_value": value,
        "effective_order": eff,
        "weights": None,
    }


def nltk_case(name, level, kind, hyps, refs, n, method, weights=None):
    return {
        "name": name,
        "impl": "nltk",
        "level": level,
        "tokens": kind,
        "hyps": hyps,
        "refs": refs,
        "max_order": n,
        "smooth": method,
        "smooth_value": None,
        "effective_order": False,
        "weights": weights,
    }


def random_weights(n):
    kind = rng.random()
    if kind < 0.3:
        w = [rng.random() for _ in range(n)]
        s = sum(w)
        return [x / s for x in w]
    if kind < 0.5:
        w = [rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(n)]
        return w
    if kind < 0.7:
        return [1.0 / n] * n
    return [round(rng.uniform(0, 1), 3) for _ in range(n)]


cases = []

# 1. sacrebleu: every smoothing x effective order x level, random inputs, orders 1..6.
for smooth, value in SACRE_SMOOTHINGS:
    for eff in (False, True):
        for level in ("corpus", "sentence"):
            for rep in range(6):
                kind = "text" if rep % 3 == 2 else "ids"
                n = [4, 4, 1, 2, 3, 5, 6][rng.randrange(7)]
                if level == "sentence":
                    h, r = rand_segment(kind, rng.randint(1, 4), big=(rep == 4))
                    hyps, refs = [h], [r]
                else:
                    hyps, refs = rand_corpus(
                        kind, rng.randint(1, 25), 4, rng.random() < 0.5, big=(rep == 4)
                    )
                cases.append(
                    sacre_case(
                        "sacre/%s-%s/eff=%s/%s/%d" % (smooth, value, eff, level, rep),
                        level, kind, hyps, refs, n, smooth, value, eff,
                    )
                )

# 2. NLTK: every method x level x order, uniform weights; then custom weights.
for method in range(8):
    for level in ("corpus", "sentence"):
        for rep in range(8):
            kind = "text" if rep % 3 == 2 else "ids"
            n = [4, 4, 4, 1, 2, 3, 5, 6][rep]
            if level == "sentence":
                h, r = rand_segment(kind, rng.randint(1, 4), big=(rep == 5))
                hyps, refs = [h], [r]
            else:
                hyps, refs = rand_corpus(
                    kind, rng.randint(1, 25), 4, rng.random() < 0.5, big=(rep == 5)
                )
            cases.append(
                nltk_case("nltk/m%d/%s/%d" % (method, level, rep), level, kind, hyps, refs, n, method)
            )
        for rep in range(4):
            n = rng.randint(1, 6)
            kind = "ids" if rep % 2 else "text"
            level = "corpus" if rep < 2 else "sentence"
            if level == "sentence":
                h, r = rand_segment(kind, rng.randint(1, 4))
                hyps, refs = [h], [r]
            else:
                hyps, refs = rand_corpus(kind, rng.randint(1, 20), 3, True)
            cases.append(
                nltk_case(
                    "nltk/m%d/weights/%d" % (method, rep), level, kind, hyps, refs, n, method,
                    random_weights(n),
                )
            )

# 3. Larger corpora (big rationals in NLTK methods 5-7, long sums in sacrebleu).
for rep in range(6):
    hyps, refs = rand_corpus("ids", 300, 2, True, max_len=40)
    for smooth, value in [("exp", None), ("none", None), ("floor", 0.1), ("add-k", 1)]:
        cases.append(
            sacre_case("large/sacre/%s/%d" % (smooth, rep), "corpus", "ids", hyps, refs, 4,
                       smooth, value, rep % 2 == 1)
        )
    for method in range(8):
        cases.append(
            nltk_case("large/nltk/m%d/%d" % (method, rep), "corpus", "ids", hyps, refs,
                      [4, 6, 3, 5, 4, 2][rep], method)
        )

# 4. Edge cases, each through every sacrebleu smoothing (both effective-order settings) and
#    every NLTK method.
EDGES = [
    ("empty-hyp", [[]], [[[1, 2, 3]]]),
    ("empty-ref", [[1, 2, 3]], [[[]]]),
    ("empty-both", [[]], [[[]]]),
    ("empty-ref-among-others", [[1, 2, 3, 4]], [[[], [1, 2, 3, 9, 9]]]),
    ("tie-4-6", [[1, 2, 3, 4, 5]], [[[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]]),
    ("tie-6-4", [[1, 2, 3, 4, 5]], [[[1, 2, 3, 4, 5, 6], [1, 2, 3, 4]]]),
    ("tie-corpus", [[1, 2, 3, 4, 5], [7, 7]], [[[1, 2, 3, 4, 5, 6], [1, 2, 3, 4]], [[7, 7, 7], [7]]]),
    ("hyp-shorter-than-n-1", [[5]], [[[5, 6, 7, 8]]]),
    ("hyp-shorter-than-n-2", [[5, 6]], [[[5, 6, 7, 8]]]),
    ("hyp-shorter-than-n-3", [[5, 6, 7]], [[[5, 6, 7, 8]]]),
    ("one-token-match", [[5]], [[[5]]]),
    ("clipping", [[1, 1, 1, 1, 1, 1, 1]], [[[1, 2, 1, 3], [1, 1, 4]]]),
    ("clipping-bigrams", [[1, 2, 1, 2, 1, 2, 1, 2]], [[[1, 2, 3, 1, 2], [2, 1, 2]]]),
    ("identical", [[1, 2, 3, 4, 5, 6]], [[[1, 2, 3, 4, 5, 6]]]),
    ("no-match", [[1, 2, 3, 4]], [[[5, 6, 7, 8]]]),
    ("unigrams-only", [[1, 2, 3, 4]], [[[4, 3, 2, 1]]]),
    ("no-trigram", [[1, 2, 9, 3, 4]], [[[1, 2, 3, 4, 5]]]),
    ("large-ids", [[4_000_000_000, 4_000_000_001, 4_294_967_295, 4_000_000_000]],
     [[[4_000_000_000, 4_000_000_001, 4_294_967_295, 7]]]),
    ("large-ids-u64", [[2**40, 2**40 + 1, 2**53, 3]], [[[2**40, 2**40 + 1, 2**53, 2**53 + 2]]]),
    ("corpus-with-empty-hyp", [[1, 2, 3, 4, 5], []], [[[1, 2, 3, 4, 5]], [[1, 2]]]),
    ("corpus-short-last", [[1, 2, 3, 4, 5, 6, 7], [1, 2]], [[[1, 2, 3, 4, 5, 6, 8]], [[1, 2, 3]]]),
    ("corpus-empty-last", [[1, 2, 3, 4, 5, 6, 7], []], [[[1, 2, 3, 4, 5, 6, 8]], [[1, 2, 3]]]),
    ("hyp-longer", [[1, 2, 3, 4, 5, 6, 7, 8, 9]], [[[1, 2, 3, 4, 5]]]),
    ("variable-refs", [[1, 2, 3], [4, 5, 6, 7], [8, 9]],
     [[[1, 2, 3]], [[4, 5, 6], [4, 5, 6, 7, 8], [5, 6, 7]], [[8, 9, 9], [9, 8]]]),
]
for name, hyps, refs in EDGES:
    n_choices = [4, 2, 6]
    for smooth, value in SACRE_SMOOTHINGS:
        for eff in (False, True):
            n = n_choices[(len(cases)) % 3]
            level = "sentence" if len(hyps) == 1 else "corpus"
            cases.append(
                sacre_case("edge/%s/sacre/%s-%s/eff=%s/n=%d" % (name, smooth, value, eff, n),
                           level, "ids", hyps, refs, n, smooth, value, eff)
            )
    for method in range(8):
        for n in (4, 2, 5):
            level = "sentence" if len(hyps) == 1 else "corpus"
            cases.append(
                nltk_case("edge/%s/nltk/m%d/n=%d" % (name, method, n), level, "ids", hyps, refs,
                          n, method)
            )

# 5. Inputs the reference implementations reject (the Rust side must return an error).
for name, hyps, refs in [
    ("no-reference", [[1, 2]], [[]]),
    ("empty-corpus", [], []),
]:
    cases.append(sacre_case("error/%s/sacre" % name, "corpus", "ids", hyps, refs, 4, "exp", None, False))
    cases.append(nltk_case("error/%s/nltk" % name, "corpus", "ids", hyps, refs, 4, 0))
for method in range(8):
    cases.append(nltk_case("error/method6-n2/m%d" % method, "sentence", "ids",
                           [[1, 2, 3, 4]], [[[1, 2, 3, 4]]], 2, method))

# 6. Worked examples from the write-ups the project grew from: 002's guide-to-action sentences
#    (NLTK sentence_bleu = 0.5045666840058485), "this is a test", BLEU-2 with weights
#    (1/2, 1/2, 0, 0) = 0.49999999999999994, the "the the the" clipping examples of 002 and
#    004, 004's NASA rover candidates, 001's Korean sentence pair.
split = str.split
SEEDS = [
    ("guide-to-action-1",
     split("It is a guide to action which ensures that the military always obeys the commands of the party"),
     [split("It is a guide to action that ensures that the military will forever heed Party commands"),
      split("It is the guiding principle which guarantees the military forces always being under the command of the Party"),
      split("It is the practical guide for the army always to heed the directions of the party")]),
    ("guide-to-action-2",
     split("It is to insure the troops forever hearing the activity guidebook that party direct"),
     [split("It is a guide to action that ensures that the military will forever heed Party commands"),
      split("It is the guiding principle which guarantees the military forces always being under the command of the Party"),
      split("It is the practical guide for the army always to heed the directions of the party")]),
    ("this-is-a-test", ["this", "is", "a", "test"],
     [["this", "is", "a", "test"], ["this", "is" "test"]]),
    ("this-is-small-test", ["this", "is", "a", "test"], [["this", "is", "small", "test"]]),
    ("the-the-the-002", split("the the the the the the the"),
     [split("It is a guide to action that ensures that the military will forever heed Party commands"),
      split("It is the guiding principle which guarantees the military forces always being under the command of the Party"),
      split("It is the practical guide for the army always to heed the directions of the party")]),
    ("the-the-the-cat", split("the the the the the the the"), [split("there is a cat on the mat")]),
    ("the-the-the-cat-mat", split("the the the cat mat"), [split("the cat is on the mat")]),
    ("nasa-1", split("The Opportunity rover is combating a big sandstorm on Mars ."),
     [split("The NASA Opportunity rover is battling a massive dust storm on Mars .")]),
    ("nasa-2", split("A NASA rover is fighting a massive storm on Mars ."),
     [split("The NASA Opportunity rover is battling a massive dust storm on Mars .")]),
    ("korean-001",
     split("빛이 쐬는 노인은 완벽한 어두운곳에서 잠든 사람과 비교할 때 강박증이 심해질 기회가 훨씬 높았다"),
     [split("빛이 쐬는 사람은 완벽한 어둠에서 잠든 사람과 비교할 때 우울증이 심해질 가능성이 훨씬 높았다")]),
    ("korean-001-short", split("빛이 쐬는 노인은 완벽한 어두운곳에서 잠듬"),
     [split("빛이 쐬는 사람은 완벽한 어둠에서 잠든 사람과 비교할 때 우울증이 심해질 가능성이 훨씬 높았다")]),
]
for name, hyp, refs in SEEDS:
    for method in range(8):
        cases.append(nltk_case("seed/%s/nltk/m%d" % (name, method), "sentence", "text", [hyp], [refs], 4, method))
    cases.append(nltk_case("seed/%s/nltk/bleu2" % name, "sentence", "text", [hyp], [refs], 4, 0,
                           [1 / 2, 1 / 2, 0, 0]))
    for smooth, value in [("exp", None), ("none", None), ("floor", None), ("add-k", None)]:
        for eff in (False, True):
            cases.append(sacre_case("seed/%s/sacre/%s/eff=%s" % (name, smooth, eff), "sentence",
                                    "text", [hyp], [refs], 4, smooth, value, eff))
# The seeds' corpus: both guide-to-action candidates as one corpus.
g1, g2 = SEEDS[0], SEEDS[1]
for method in range(8):
    cases.append(nltk_case("seed/guide-corpus/nltk/m%d" % method, "corpus", "text",
                           [g1[1], g2[1]], [g1[2], g2[2]], 4, method))
cases.append(sacre_case("seed/guide-corpus/sacre/exp", "corpus", "text", [g1[1], g2[1]],
                        [g1[2], g2[2]], 4, "exp", None, False))

for c in cases:
    run(c)

# The numbers the seeds print must come out of the reference implementation as printed.
by_name = {c["name"]: c for c in cases}
assert by_name["seed/guide-to-action-1/nltk/m0"]["expected"]["bleu"] == 0.5045666840058485
assert by_name["seed/this-is-a-test/nltk/m0"]["expected"]["bleu"] == 1.0
assert by_name["seed/this-is-small-test/nltk/bleu2"]["expected"]["bleu"] == 0.49999999999999994

# Many cases share a corpus: store each distinct corpus once, cases refer to it by index.
inputs, index = [], {}
for c in cases:
    key = json.dumps([c["tokens"], c["hyps"], c["refs"]], ensure_ascii=False)
    if key not in index:
        index[key] = len(inputs)
        inputs.append({"tokens": c["tokens"], "hyps": c["hyps"], "refs": c["refs"]})
    c["input"] = index[key]
    del c["tokens"], c["hyps"], c["refs"]

with open(OUT, "w", encoding="utf-8") as f:
    json.dump({"generator": "tests/golden/generate_scores.py", "seed": SEED,
               "sacrebleu": sacrebleu.__version__, "nltk": nltk.__version__,
               "inputs": inputs, "cases": cases},
              f, ensure_ascii=False, indent=None, separators=(",", ":"))
    f.write("\n")

n_err = sum("error" in c for c in cases)
print("%d cases (%d errors), %d distinct inputs -> %s" % (len(cases), n_err, len(inputs), OUT))
