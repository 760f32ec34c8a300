#!/usr/bin/env python3
"""Golden vectors for `candle_bleu::exact::ter` (and TER bootstrap) from sacrebleu 2.6.0.

    pip install sacrebleu==2.6.0
    python3 tests/golden/generate_ter.py   # writes tests/golden/ter.json

Deterministic (splitmix64, no other randomness). Every case records its text (hypotheses and
references per segment; a segment may have fewer references, sacrebleu's `None` placeholders),
the configuration (`normalized`, `no_punct`, `asian_support`, `case_sensitive`) and sacrebleu's
output:

- `level: corpus`: `TER(...).corpus_score(hyps, ref_streams)`: score, `num_edits`,
  `ref_length`, and the per-segment statistics (`_extract_corpus_statistics`: the best
  reference's edits and the mean reference length);
- `level: sentence`: `TER(...).sentence_score(hyp, refs)` for each segment (score, edits,
  reference length).

The corpora cover every option combination (16), 1-3 references and variable reference counts,
empty hypotheses and references, CJK text with Asian and full-width punctuation, punctuation,
XML entities, line breaks, possessives and numbers (the normalizer's rules), mixed case, and
block moves: hypotheses made by moving blocks of the reference, in sentences of up to 130 words
(shift distances above 50, more than 1000 shift candidates).

`bootstrap` cases record sacrebleu's own resampling of TER statistics: the resample scores of
`_bootstrap_resample` (float32 arithmetic), `Score.estimate_ci` (`-ci`), and the paired
bootstrap (`_paired_bs_test`) and approximate randomization (`_paired_ar_test`) results.

tests/ter_golden.rs checks every case: scores, edits and reference lengths to 1e-9; bootstrap
numbers as documented there.
"""
import json
import logging
import os
import warnings

import numpy as np
import sacrebleu
from sacrebleu.metrics import TER
from sacrebleu.significance import _bootstrap_resample, _paired_ar_test, _paired_bs_test, Result, estimate_ci

assert sacrebleu.__version__ == "2.6.0", sacrebleu.__version__
warnings.simplefilter("ignore")
logging.getLogger("sacrebleu").setLevel(logging.ERROR)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ter.json")
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
    "Market Teacher STUDENT Company The A It"
).split()
PUNCT_WORDS = [
    "(hi)", "hello,", "world.", "\"quoted\"", "'single'", "...", "..", ".", ",", "!?", "a-b",
    "[x]", "{y}", "<z>", "#tag", "@user", "$5", "50%", "a&b", "*star*", "_u_", "~t", "`b`",
    "x^2", "a|b", "c\\d", "e/f", "g;", ":h", "i=j", "k+", "-l", "m:", ";n", "?o", "p?",
    "don't", "it's", "John's", "1,000.5", "3.14", "U.S.", "e.g.,", "(a)", "x)", "(y", "1-2",
    "2-", "-3", "a.b", "a,b", "1.a", "a.1", ",5", "5,", "&amp;", "&lt;b&gt;", "&quot;x&quot;",
    "&amp;quot;", "'s", "Bob's", "its'", "'", "s's",
]
CJK_WORDS = [
    "中文", "我们", "今天", "北京", "故宫", "東京", "の", "天気", "晴れ", "です", "。", "、", "「引用」",
    "，", "？", "！", "：", "；", "（注）", "＂", "．", "〈书〉", "《书名》", "【注】", "〔x〕", "・",
    "ｶﾀｶﾅ", "｡", "ひらがな", "カタカナ", "ㇰ", "㈱", "㌔", "豈", "︰", "⺀", "㐀", "㿿", "한국어",
]
UNICODE_WORDS = [
    "café", "cafe\u0301", "ΟΔΟΣ", "ΣΟΦΟΣ", "İstanbul", "Straße", "ＦＵＬＬ", "１２３", "«Bonjour»",
    "“quoted”", "—", "…", "¡Hola!", "👍🏽", "a\u200bb",
]
SPACES = [" ", " ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "\u001c", "\u2009"]


def sentence(rng, vocab, lo, hi, spaces=True):
    n = lo + rng.below(hi - lo + 1)
    words = [rng.pick(vocab) for _ in range(n)]
    out = ""
    for i, w in enumerate(words):
        if i:
            out += rng.pick(SPACES) if spaces and rng.below(4) == 0 else " "
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
            out.append(w.upper() if rng.below(2) else w + " " + rng.pick(vocab))
    return " ".join(out)


def move_blocks(rng, text, moves):
    """Moves `moves` random blocks of 1-12 words of a sentence elsewhere (TER's shifts)."""
    words = text.split(" ")
    for _ in range(moves):
        if len(words) < 3:
            break
        length = 1 + rng.below(min(12, len(words) - 1))
        start = rng.below(len(words) - length + 1)
        block = words[start:start + length]
        rest = words[:start] + words[start + length:]
        at = rng.below(len(rest) + 1)
        words = rest[:at] + block + rest[at:]
    return " ".join(words)


def make_corpus(seed, segments, vocab, lo, hi, max_refs, variable=False, empties=False,
                moves=0, keep=(60, 30), spaces=True):
    rng = SplitMix64(seed)
    hyps, refs = [], []
    for i in range(segments):
        base = sentence(rng, vocab, lo, hi, spaces)
        n_refs = 1 + rng.below(max_refs) if variable else max_refs
        rs = [perturb(rng, base, vocab, 70 + rng.below(25)) for _ in range(n_refs)]
        hyp = perturb(rng, base, vocab, keep[0] + rng.below(keep[1]))
        if moves:
            hyp = move_blocks(rng, hyp, 1 + rng.below(moves))
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


def cjk_corpus(seed, segments, max_refs):
    """CJK lines without spaces between words (only asian_support + normalized splits them)."""
    rng = SplitMix64(seed)
    hyps, refs = [], []
    for _ in range(segments):
        n = 2 + rng.below(10)
        words = [rng.pick(CJK_WORDS + ENGLISH[:8]) for _ in range(n)]
        joiner = lambda ws: "".join(w if rng.below(5) else w + " " for w in ws)
        rs = []
        for _ in range(max_refs):
            ws = [w if rng.below(5) else rng.pick(CJK_WORDS) for w in words]
            rs.append(joiner(ws))
        hw = [w for w in words if rng.below(6)]
        hyps.append(joiner(move_blocks(rng, " ".join(hw), 1).split(" ")))
        refs.append(rs)
    return hyps, refs


def streams(refs):
    """sacrebleu's reference streams: stream k holds reference k of every segment, or None."""
    width = max(len(r) for r in refs)
    return [[r[k] if k < len(r) else None for r in refs] for k in range(width)]


def config_dict(normalized, no_punct, asian_support, case_sensitive):
    return {"normalized": normalized, "no_punct": no_punct, "asian_support": asian_support,
            "case_sensitive": case_sensitive}


def metric(cfg):
    return TER(**cfg)


def tag(cfg):
    return "n%dp%da%dc%d" % (cfg["normalized"], cfg["no_punct"], cfg["asian_support"],
                             cfg["case_sensitive"])


ALL_CONFIGS = [config_dict(n, p, a, c) for n in [False, True] for p in [False, True]
               for a in [False, True] for c in [False, True]]

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
    ter = metric(cfg)
    case = {"name": name, "level": "corpus", "config": cfg, "corpus": corpus_ref(hyps, refs)}
    seg = ter._extract_corpus_statistics(hyps, streams(refs))
    score = ter.corpus_score(hyps, streams(refs))
    case["score"] = float(score.score)
    case["edits"] = float(score.num_edits)
    case["ref_len"] = float(score.ref_length)
    case["segment_stats"] = [[float(e), float(r)] for e, r in seg]
    return case


def sentence_case(name, cfg, hyps, refs):
    ter = metric(cfg)
    out = []
    for h, rs in zip(hyps, refs):
        s = ter.sentence_score(h, rs)
        out.append([float(s.score), float(s.num_edits), float(s.ref_length)])
    return {"name": name, "level": "sentence", "config": cfg, "corpus": corpus_ref(hyps, refs),
            "scores": out}


def bootstrap_cases():
    """sacrebleu's resampling of TER statistics, from its own functions."""
    out = []
    vocab = ENGLISH + PUNCT_WORDS[:10]
    base_h, refs = make_corpus(77, 60, vocab, 4, 14, 1, moves=2)
    rng = SplitMix64(78)
    sys_h = [perturb(rng, r[0], vocab, 80) for r in refs]
    _, refs3 = make_corpus(79, 60, vocab, 4, 14, 3, variable=True)
    for cfg, rs in [(config_dict(False, False, False, False), refs),
                    (config_dict(True, True, False, True), refs3)]:
        for seed in ["12345", "7"]:
            os.environ["SACREBLEU_SEED"] = seed
            ter = metric(cfg)
            bl_stats = ter._extract_corpus_statistics(base_h, streams(rs))
            _, bs = _bootstrap_resample(bl_stats, ter, 200)
            resample = [float(s.score) for s in bs]
            types = sorted({type(s.score).__name__ for s in bs})
            ci_score = ter.corpus_score(base_h, streams(rs), n_bootstrap=200)
            bl_score = ter._aggregate_and_compute(bl_stats)
            _, bl_bs = _bootstrap_resample(bl_stats, ter, 200)
            bl_mean, bl_ci = estimate_ci(np.array([x.score for x in bl_bs]))
            info = {"TER": (bl_stats, Result(bl_score.score, mean=bl_mean, ci=bl_ci))}
            _, pbs = _paired_bs_test(info, "sys", sys_h, streams(rs), {"TER": ter},
                                     n_samples=200, seed=int(seed))
            _, par = _paired_ar_test(info, "sys", sys_h, streams(rs), {"TER": ter},
                                     n_samples=300, seed=int(seed))
            r_bs = pbs["TER"]
            r_ar = par["TER"]
            out.append({
                "config": cfg,
                "seed": int(seed),
                "baseline": corpus_ref(base_h, rs),
                "system": corpus_ref(sys_h, rs),
                "resample_200": resample,
                "resample_types": types,
                "ci": {"score": float(ci_score.score), "mean": float(ci_score._mean),
                       "ci": float(ci_score._ci)},
                "paired_bs_200": {"baseline_mean": float(bl_mean), "baseline_ci": float(bl_ci),
                                  "score": float(r_bs.score), "p_value": float(r_bs.p_value),
                                  "mean": float(r_bs.mean), "ci": float(r_bs.ci)},
                "paired_ar_300": {"score": float(r_ar.score), "p_value": float(r_ar.p_value)},
            })
    os.environ.pop("SACREBLEU_SEED", None)
    return out


def main():
    cases = []
    english = ENGLISH + PUNCT_WORDS
    everything = ENGLISH + PUNCT_WORDS + CJK_WORDS + UNICODE_WORDS
    corpora = {
        "english": make_corpus(1, 30, english, 3, 20, 1),
        "refs3": make_corpus(2, 25, english, 2, 18, 3),
        "variable_refs": make_corpus(3, 25, everything, 1, 15, 3, variable=True),
        "empties": make_corpus(4, 30, everything, 0, 10, 2, empties=True),
        "punct": make_corpus(5, 25, PUNCT_WORDS, 1, 12, 2),
        "cjk": cjk_corpus(6, 30, 2),
        "unicode": make_corpus(7, 20, UNICODE_WORDS + CJK_WORDS + ENGLISH[:20], 2, 14, 2),
        "moves": make_corpus(8, 30, ENGLISH, 5, 30, 1, moves=3, keep=(85, 15), spaces=False),
        "long_moves": make_corpus(9, 8, ENGLISH + PUNCT_WORDS[:20], 50, 130, 2, moves=4,
                                  keep=(88, 12), spaces=False),
    }
    for corpus_name, (hyps, refs) in corpora.items():
        configs = ALL_CONFIGS if corpus_name != "long_moves" else ALL_CONFIGS[::5]
        for cfg in configs:
            cases.append(corpus_case(f"{corpus_name}_{tag(cfg)}", cfg, hyps, refs))
        for cfg in [ALL_CONFIGS[0], ALL_CONFIGS[-1], config_dict(True, False, True, False)]:
            cases.append(sentence_case(f"{corpus_name}_sentence_{tag(cfg)}", cfg, hyps, refs))
    # Hand-written edge cases.
    edge = [
        ("identical", ["The cat sat on the mat."], [["The cat sat on the mat."]]),
        ("all_empty", [""], [[""]]),
        ("empty_hyp", [""], [["a b c"]]),
        ("empty_ref", ["a b c"], [[""]]),
        ("empty_refs_2", ["a b c"], [["", ""]]),
        ("whitespace_only", ["  \t "], [["\u3000"]]),
        ("trailing_space", ["a b  \u3000"], [["a b\u001c"]]),
        ("block_move", ["d e a b c"], [["a b c d e"]]),
        ("swap", ["b a"], [["a b"]]),
        ("ties_first_ref", ["a b c"], [["a b d", "a x c", "a b c d"]]),
        ("best_of_many", ["the quick brown fox"], [["a slow dog", "the quick brown fax",
                                                    "the quick brown fox !", ""]]),
        ("case", ["THE Cat"], [["the cat"]]),
        ("newlines", ["a\n-b c\nd"], [["ab c d"]]),
        ("entities", ["&amp;lt; &quot;hi&quot; &amp;amp;"], [["< \" hi \" &amp;"]]),
        ("possessive", ["John's dog's bone's"], [["John 's dog 's bone 's"]]),
        ("numbers", ["1,000.5 3.14 1-2 a.b.c ,5"], [["1,000.5 3 . 14 1 - 2 a . b . c , 5"]]),
        ("cjk_punct", ["我爱北京天安门。你好！（测试）"], [["我爱 北京 天安门 。 你好 ！"]]),
        ("kana", ["ひらがな"], [["ひらがな カタカナ"]]),
        ("sigma", ["ΟΔΟΣ ΣΟΦΟΣ"], [["οδος σοφος"]]),
        ("dotted_i", ["İstanbul"], [["i̇stanbul"]]),
        ("repeats", ["a a a a b b b b a a a a"], [["b b b b a a a a a a a a"]]),
        ("long_ratio", ["a"], [[" ".join(["w%d" % i for i in range(120)]) + " a"]]),
        ("long_hyp", [" ".join(["w%d" % i for i in range(120)]) + " a"], [["a w3"]]),
    ]
    for name, hyps, refs in edge:
        for cfg in ALL_CONFIGS:
            cases.append(corpus_case(f"edge_{name}_{tag(cfg)}", cfg, hyps, refs))
        cases.append(sentence_case(f"edge_{name}_sentence", ALL_CONFIGS[0], hyps, refs))
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
