#!/usr/bin/env python3
"""Golden vectors for `candle_bleu::exact::chrf` (and chrF bootstrap) from sacrebleu 2.6.0.

    python3 -m venv /work/venv-chrf && /work/venv-chrf/bin/pip install sacrebleu==2.6.0
    /work/venv-chrf/bin/python tests/golden/generate_chrf.py   # writes tests/golden/chrf.json

Deterministic (splitmix64, no other randomness). Every case records its text (hypotheses and
references per segment; a segment may have fewer references, sacrebleu's `None` placeholders),
the configuration, and sacrebleu's output:

- `level: corpus`: `CHRF(...).corpus_score(hyps, ref_streams)`, with the per-segment statistics
  (`_extract_corpus_statistics`, the best reference's `[hyp, ref, match]` per order) and their
  sum;
- `level: sentence`: `CHRF(...).sentence_score(hyp, refs)` for each segment;
- `error`: the exception sacrebleu raised (`char_order = word_order = 0` with eps smoothing).

The corpora cover every option (char_order 0-8, word_order 0-3, beta 1-3, lowercase,
whitespace, eps_smoothing), 1-4 references and variable reference counts, empty hypotheses and
references, Unicode (CJK, Hangul syllables and conjoining jamo, combining marks, emoji with
ZWJ and skin tones, Greek final sigma, Turkish dotted I, fullwidth forms, Python-only
whitespace such as U+001C and U+3000, U+200B which is not whitespace) and punctuation-heavy
text (every ASCII punctuation character at word starts and ends, `(hi)`, `...`, lone marks).

`bootstrap` cases record sacrebleu's own resampling of chrF statistics: the resample scores of
`_bootstrap_resample` (float32 arithmetic), `Score.estimate_ci` (`-ci`), and the paired
bootstrap (`_paired_bs_test`) and approximate randomization (`_paired_ar_test`) results.

tests/chrf_golden.rs checks every case: scores to 1e-9 absolute (on 0..100), statistics
exactly; bootstrap numbers exactly (they are sacrebleu's float32/float64 values).
"""
import json
import logging
import os
import warnings

import numpy as np
import sacrebleu
from sacrebleu.metrics import CHRF
from sacrebleu.significance import _bootstrap_resample, _paired_ar_test, _paired_bs_test, Result

assert sacrebleu.__version__ == "2.6.0", sacrebleu.__version__
warnings.simplefilter("ignore")
logging.getLogger("sacrebleu").setLevel(logging.ERROR)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chrf.json")
MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n

    def pick(self, items):
        return items[self.below(len(items))]


ENGLISH = (
    "the a of to and in is it that for on with as was he be at by this had not are but from or "
    "have an they which one you were her all she there would their we him been has when who will "
    "cat mat dog sat party military guide action ensures obeys commands always council report "
    "Market Teacher STUDENT Company"
).split()
PUNCT_WORDS = [
    "(hi)", "hello,", "world.", "\"quoted\"", "'single'", "...", "..", ".", ",", "!?", "a-b",
    "[x]", "{y}", "<z>", "#tag", "@user", "$5", "50%", "a&b", "*star*", "_u_", "~t", "`b`",
    "x^2", "a|b", "c\\d", "e/f", "g;", ":h", "i=j", "k+", "-l", "m:", ";n", "?o", "p?",
    "don't", "it's", "1,000.5", "3.14", "U.S.", "e.g.,", "(a)", "((b))", "x)", "(y",
]
UNICODE_WORDS = [
    # CJK and Japanese
    "中文", "我们", "今天", "北京", "故宫", "東京", "の", "天気", "晴れ", "です", "。", "、", "「引用」",
    # Hangul syllables and conjoining jamo (NFD)
    "한국어", "안녕하세요", "서울", "\u1112\u1161\u11ab\u1100\u1173\u11af", "\u1100\u1161",
    # combining marks (NFD) and precomposed forms
    "cafe\u0301", "café", "nai\u0308ve", "naïve", "Z\u0327\u0301", "a\u0308\u0304",
    # emoji, ZWJ sequences, skin tones, flags, variation selectors
    "👍", "👍🏽", "👨‍👩‍👧", "❤️", "❤", "🇩🇪", "😀!",
    # Greek (final sigma under lower()), Turkish, German, fullwidth
    "ΟΔΟΣ", "ΣΟΦΟΣ", "Σ", "İstanbul", "ISTANBUL", "Straße", "STRASSE", "ＦＵＬＬ", "ａｂｃ", "１２３",
    # RTL scripts, Devanagari with combining signs
    "مرحبا", "שלום", "नमस्ते", "हिन्दी",
    # punctuation beyond ASCII (not split off by chrF++)
    "«Bonjour»", "“quoted”", "—", "…", "¡Hola!", "¿qué?",
]
SPACES = [" ", " ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "\u001c", "\u2009", " \u200b"]


def sentence(rng, vocab, lo, hi):
    n = lo + rng.below(hi - lo + 1)
    words = [rng.pick(vocab) for _ in range(n)]
    out = ""
    for i, w in enumerate(words):
        if i:
            out += rng.pick(SPACES) if rng.below(4) == 0 else " "
        out += w
    return out


def perturb(rng, text, vocab, keep):
    """Word-level noise on a space-joined sentence: substitute, drop, insert, case changes."""
    out = []
    for w in text.split(" "):
        r = rng.below(100)
        if r < keep:
            out.append(w)
        elif r < keep + (100 - keep) // 3:
            out.append(rng.pick(vocab))
        elif r < keep + 2 * (100 - keep) // 3:
            continue
        else:
            out.append(w.upper() if rng.below(2) else w + rng.pick(vocab))
    return " ".join(out)


def make_corpus(seed, segments, vocab, lo, hi, max_refs, variable=False, empties=False):
    rng = SplitMix64(seed)
    hyps, refs = [], []
    for i in range(segments):
        base = sentence(rng, vocab, lo, hi)
        n_refs = 1 + rng.below(max_refs) if variable else max_refs
        rs = [perturb(rng, base, vocab, 70 + rng.below(25)) for _ in range(n_refs)]
        hyp = perturb(rng, base, vocab, 60 + rng.below(30))
        if empties:
            if i % 7 == 3:
                hyp = ""
            if i % 5 == 2:
                rs[0] = ""
            if i % 11 == 4:
                hyp = "   "
            if i % 13 == 6:
                rs[-1] = "\t \u3000"
        hyps.append(hyp)
        refs.append(rs)
    return hyps, refs


def streams(refs):
    """sacrebleu's reference streams: stream k holds reference k of every segment, or None."""
    width = max(len(r) for r in refs)
    return [[r[k] if k < len(r) else None for r in refs] for k in range(width)]


def config_dict(char_order, word_order, beta, lowercase, whitespace, eps):
    return {
        "char_order": char_order,
        "word_order": word_order,
        "beta": beta,
        "lowercase": lowercase,
        "whitespace": whitespace,
        "eps_smoothing": eps,
    }


def metric(cfg):
    return CHRF(
        char_order=cfg["char_order"],
        word_order=cfg["word_order"],
        beta=cfg["beta"],
        lowercase=cfg["lowercase"],
        whitespace=cfg["whitespace"],
        eps_smoothing=cfg["eps_smoothing"],
    )


CORPORA = {}


def corpus_ref(hyps, refs):
    """The name under which this corpus is stored in the JSON's `corpora` (each text once)."""
    key = json.dumps([hyps, refs], ensure_ascii=False)
    for name, value in CORPORA.items():
        if value[0] == key:
            return name
    name = f"c{len(CORPORA)}"
    CORPORA[name] = (key, {"hyps": hyps, "refs": refs})
    return name


def corpus_case(name, cfg, hyps, refs):
    chrf = metric(cfg)
    case = {"name": name, "level": "corpus", "config": cfg, "corpus": corpus_ref(hyps, refs)}
    try:
        seg = chrf._extract_corpus_statistics(hyps, streams(refs))
        score = chrf.corpus_score(hyps, streams(refs))
    except Exception as e:  # noqa: BLE001 - sacrebleu's own exception is the expectation
        case["error"] = type(e).__name__
        return case
    case["score"] = score.score
    case["name_sacrebleu"] = score.name
    case["segment_stats"] = [[int(x) for x in s] for s in seg]
    case["stats"] = [int(x) for x in np.sum(np.array(seg, dtype=np.int64), axis=0)]
    return case


def sentence_case(name, cfg, hyps, refs):
    chrf = metric(cfg)
    scores = []
    for h, rs in zip(hyps, refs):
        scores.append(chrf.sentence_score(h, rs).score)
    return {"name": name, "level": "sentence", "config": cfg, "corpus": corpus_ref(hyps, refs),
            "scores": scores}


def bootstrap_cases():
    """sacrebleu's resampling of chrF statistics, from its own functions."""
    out = []
    vocab = ENGLISH + PUNCT_WORDS[:10]
    base_h, refs = make_corpus(77, 60, vocab, 4, 14, 1)
    rng = SplitMix64(78)
    sys_h = [perturb(rng, r[0], vocab, 80) for r in refs]
    for cfg in [config_dict(6, 0, 2, False, False, False), config_dict(6, 2, 2, False, False, False),
                config_dict(4, 1, 3, True, True, True)]:
        for seed in ["12345", "7"]:
            os.environ["SACREBLEU_SEED"] = seed
            chrf = metric(cfg)
            bl_stats = chrf._extract_corpus_statistics(base_h, streams(refs))
            sys_stats = chrf._extract_corpus_statistics(sys_h, streams(refs))
            _, bs = _bootstrap_resample(bl_stats, chrf, 200)
            resample = [float(s.score) for s in bs]
            types = sorted({type(s.score).__name__ for s in bs})
            ci_score = chrf.corpus_score(base_h, streams(refs), n_bootstrap=200)
            bl_score = chrf._aggregate_and_compute(bl_stats)
            # The CLI's baseline estimate and the paired bootstrap (sacrebleu's PairedTest).
            _, bl_bs = _bootstrap_resample(bl_stats, chrf, 200)
            from sacrebleu.significance import estimate_ci
            bl_mean, bl_ci = estimate_ci(np.array([x.score for x in bl_bs]))
            info = {chrf_name(cfg): (bl_stats, Result(bl_score.score, mean=bl_mean, ci=bl_ci))}
            _, pbs = _paired_bs_test(info, "sys", sys_h, streams(refs), {chrf_name(cfg): chrf},
                                     n_samples=200, seed=int(seed))
            _, par = _paired_ar_test(info, "sys", sys_h, streams(refs), {chrf_name(cfg): chrf},
                                     n_samples=300, seed=int(seed))
            r_bs = pbs[chrf_name(cfg)]
            r_ar = par[chrf_name(cfg)]
            out.append({
                "config": cfg,
                "seed": int(seed),
                "baseline": corpus_ref(base_h, refs),
                "system": corpus_ref(sys_h, refs),
                "resample_200": resample,
                "resample_types": types,
                "ci": {"score": ci_score.score, "mean": float(ci_score._mean),
                       "ci": float(ci_score._ci)},
                "paired_bs_200": {"baseline_mean": float(bl_mean), "baseline_ci": float(bl_ci),
                                  "score": float(r_bs.score), "p_value": float(r_bs.p_value),
                                  "mean": float(r_bs.mean), "ci": float(r_bs.ci)},
                "paired_ar_300": {"score": float(r_ar.score), "p_value": float(r_ar.p_value)},
            })
    os.environ.pop("SACREBLEU_SEED", None)
    return out


def chrf_name(cfg):
    return f"chrF{cfg['beta']}" + "+" * cfg["word_order"]


def main():
    cases = []
    english = ENGLISH + PUNCT_WORDS
    everything = ENGLISH + PUNCT_WORDS + UNICODE_WORDS
    corpora = {
        "english": make_corpus(1, 40, english, 3, 20, 1),
        "unicode": make_corpus(2, 40, UNICODE_WORDS + ENGLISH[:20], 2, 16, 2),
        "mixed_4refs": make_corpus(3, 30, everything, 1, 18, 4),
        "variable_refs": make_corpus(4, 35, everything, 1, 15, 3, variable=True),
        "empties": make_corpus(5, 30, everything, 0, 10, 2, empties=True),
        "punct": make_corpus(6, 30, PUNCT_WORDS, 1, 12, 2),
        "cjk_hangul": make_corpus(7, 25, UNICODE_WORDS[:22], 1, 12, 1),
        "long": make_corpus(8, 12, everything, 40, 90, 2),
    }
    # Every option on the english, unicode and empties corpora.
    grid = []
    for char_order in [0, 1, 2, 3, 6, 8]:
        for word_order in [0, 1, 2, 3]:
            if char_order == 0 and word_order == 0:
                continue
            grid.append((char_order, word_order))
    k = 0
    for corpus_name in ["english", "unicode", "empties"]:
        hyps, refs = corpora[corpus_name]
        for char_order, word_order in grid:
            for beta in [1, 2, 3]:
                flags = [(False, False, False), (True, True, False), (False, True, True),
                         (True, False, True)][k % 4]
                k += 1
                cfg = config_dict(char_order, word_order, beta, *flags)
                cases.append(corpus_case(
                    f"{corpus_name}_c{char_order}_w{word_order}_b{beta}_l{int(flags[0])}"
                    f"_s{int(flags[1])}_e{int(flags[2])}", cfg, hyps, refs))
    # Every flag combination with the defaults and chrF++.
    for corpus_name, (hyps, refs) in corpora.items():
        for word_order in [0, 2]:
            for lowercase in [False, True]:
                for whitespace in [False, True]:
                    for eps in [False, True]:
                        cfg = config_dict(6, word_order, 2, lowercase, whitespace, eps)
                        cases.append(corpus_case(
                            f"{corpus_name}_flags_w{word_order}_l{int(lowercase)}"
                            f"_s{int(whitespace)}_e{int(eps)}", cfg, hyps, refs))
        for word_order in [0, 2]:
            for eps in [False, True]:
                cfg = config_dict(6, word_order, 2, corpus_name == "unicode", False, eps)
                cases.append(sentence_case(f"{corpus_name}_sentence_w{word_order}_e{int(eps)}",
                                           cfg, hyps, refs))
    # A non-integer beta (sacrebleu's API takes any number; its CLI an int).
    hyps, refs = corpora["mixed_4refs"]
    for beta in [0.5, 1.5]:
        cases.append(corpus_case(f"mixed_beta_{beta}", config_dict(6, 2, beta, False, False, False),
                                 hyps, refs))
    # Hand-written edge cases.
    edge = [
        ("identical", ["The cat sat on the mat."], [["The cat sat on the mat."]]),
        ("all_empty", [""], [[""]]),
        ("empty_hyp", [""], [["a b c"]]),
        ("empty_ref", ["a b c"], [[""]]),
        ("whitespace_only", ["  \t "], [["\u3000"]]),
        ("short_ref", ["abcdefgh"], [["ab"]]),
        ("ties_first_wins", ["abc abd"], [["abd abc", "abc abd", "abd abc"]]),
        ("best_of_many", ["the quick brown fox"], [["a slow dog", "the quick brown fax",
                                                    "the quick brown fox!", ""]]),
        ("paren", ["(hi) (hi)"], [["(hi (hi) )"]]),
        ("sigma", ["ΟΔΟΣ ΣΟΦΟΣ"], [["οδος σοφος"]]),
        ("dotted_i", ["İstanbul"], [["i̇stanbul"]]),
        ("zero_width", ["a\u200bb"], [["a b"]]),
        ("no_match", ["xyz"], [["abc"]]),
    ]
    for name, hyps, refs in edge:
        for cfg in [config_dict(6, 0, 2, False, False, False), config_dict(6, 2, 2, True, False, False),
                    config_dict(6, 2, 2, False, True, True), config_dict(3, 3, 1, True, True, False)]:
            tag = f"c{cfg['char_order']}w{cfg['word_order']}l{int(cfg['lowercase'])}" \
                  f"s{int(cfg['whitespace'])}e{int(cfg['eps_smoothing'])}"
            cases.append(corpus_case(f"edge_{name}_{tag}", cfg, hyps, refs))
            cases.append(sentence_case(f"edge_{name}_{tag}_sentence", cfg, hyps, refs))
    # sacrebleu raises (ZeroDivisionError) for no order at all with eps smoothing.
    cases.append(corpus_case("no_orders_eps", config_dict(0, 0, 2, False, False, True), ["a"], [["a"]]))
    bootstrap = bootstrap_cases()
    line = lambda v: json.dumps(v, ensure_ascii=False)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write('{"sacrebleu": %s, "numpy": %s,\n' % (line(sacrebleu.__version__), line(np.__version__)))
        f.write('"corpora": {\n' + ",\n".join(f"{line(k)}: {line(v[1])}" for k, v in CORPORA.items())
                + "\n},\n")
        f.write('"cases": [\n' + ",\n".join(line(c) for c in cases) + "\n],\n")
        f.write('"bootstrap": [\n' + ",\n".join(line(c) for c in bootstrap) + "\n]}\n")
    print(f"{len(cases)} cases -> {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
