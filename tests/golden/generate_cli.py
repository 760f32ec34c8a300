#!/usr/bin/env python3
"""Golden outputs of the `candle-bleu` command line, from the real sacrebleu 2.6.0 CLI.

    python3 -m venv /work/venv-cli && /work/venv-cli/bin/pip install sacrebleu==2.6.0
    /work/venv-cli/bin/python tests/golden/generate_cli.py   # from anywhere

Writes, deterministically (splitmix64, no other randomness):
- data/sample.ref.txt, data/sample.hyp.txt, data/sample.sys2.txt: 300 lines of generated
  English-like text (a reference and two noisy "systems"), also used by docs/CLI.md;
- tests/golden/cli/inputs/*: small files for the edge cases (CRLF, trailing whitespace, a lone
  CR, Unicode, tab-separated references, short and empty lines, ...);
- tests/golden/cli/cases.json: for every case the arguments, the environment, the standard
  input (if any), and sacrebleu's exit status and standard output.

Every case runs `python -m sacrebleu ARGS` in the repository root (file names appear in the
multi-system tables, so both tools are run with the same relative paths). sacrebleu's CLI has
no max-n-gram-order option: the `api` cases build `BLEU(max_ngram_order=N, ...)` in-process and
print what the CLI would print with that metric (`Score.format` with its signature).

chrF and TER cases (`-m chrf`, `-m ter`, `-m bleu chrf ter`, the `--chrf-*` and `--ter-*`
options, `-ci`, `-pbs`, `-par`) run the real CLI too, except three: sacrebleu 2.6.0's `-pbs -f
json` raises TypeError on chrF and TER (their bootstrap means are numpy.float32, which `json`
cannot serialize), so those cases run sacrebleu's own `main()` with
`json.dumps(..., default=float)` and are marked `sacrebleu_json_float32_patched`.

Single-system corpus cases also record sacrebleu's full-precision statistics (`full`: score,
counts, totals, precisions, bp, ratio, sys_len, ref_len) for the numeric checks of the extra
JSON fields. tests/cli.rs replays all cases against the release binary.
"""
import json
import os
import subprocess
import sys

import sacrebleu
from sacrebleu.metrics import BLEU

assert sacrebleu.__version__ == "2.6.0", sacrebleu.__version__

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")
GOLD = os.path.join(ROOT, "tests", "golden", "cli")
INPUTS = os.path.join(GOLD, "inputs")
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


DET = ["the", "a", "this", "that", "every", "no", "some", "our", "their", "its"]
ADJ = ["new", "old", "small", "large", "quick", "quiet", "bright", "dark", "local", "public",
       "early", "late", "strong", "weak", "green", "red", "simple", "careful", "recent", "main"]
NOUN = ["cat", "dog", "city", "river", "council", "report", "market", "teacher", "student",
        "company", "road", "house", "garden", "window", "child", "doctor", "train", "book",
        "letter", "government", "team", "game", "price", "water", "village", "bridge",
        "machine", "story", "system", "meeting"]
VERB = ["sees", "builds", "opens", "closes", "finds", "writes", "reads", "moves", "crosses",
        "visits", "approves", "rejects", "follows", "reaches", "describes", "repairs",
        "announces", "expects", "supports", "changes"]
ADV = ["quickly", "slowly", "today", "yesterday", "again", "already", "finally", "rarely",
       "often", "suddenly"]
PREP = ["on", "in", "near", "under", "behind", "across", "with", "without", "after", "before"]
NAME = ["Anna", "Peter", "Maria", "John", "Chen", "Fatima", "Lukas", "Sofia", "Omar", "Yuki"]
NUM = ["two", "three", "12", "1,000", "3.5", "45", "2019", "100", "7.25", "$20"]
CONJ = ["and", "but", "because", "while", "although"]


def noun_phrase(rng):
    words = [rng.pick(DET)]
    if rng.below(2):
        words.append(rng.pick(ADJ))
    words.append(rng.pick(NOUN))
    return words


def clause(rng):
    subj = [rng.pick(NAME)] if rng.below(4) == 0 else noun_phrase(rng)
    words = subj + [rng.pick(VERB)] + noun_phrase(rng)
    r = rng.below(6)
    if r == 0:
        words += [rng.pick(PREP)] + noun_phrase(rng)
    elif r == 1:
        words += [rng.pick(ADV)]
    elif r == 2:
        words += ["for", rng.pick(NUM), rng.pick(NOUN) + "s"]
    return words


def sentence_tokens(rng):
    words = clause(rng)
    r = rng.below(8)
    if r < 3:
        words += [","] + [rng.pick(CONJ)] + clause(rng)
    elif r == 3:
        words += ["(", rng.pick(ADV), ")"]
    elif r == 4:
        words = [rng.pick(NAME), "said", ":", '"'] + words + ['"']
    elif r == 5:
        words += [";", "it", "is", "n't", rng.pick(ADJ)]
    words[0] = words[0][:1].upper() + words[0][1:]
    words.append(rng.pick([".", ".", ".", "!", "?"]))
    return words


def detok(tokens):
    out = ""
    open_quote = False
    for i, t in enumerate(tokens):
        if i == 0:
            out = t
            continue
        prev = tokens[i - 1]
        if t in {",", ".", "!", "?", ";", ":", ")"} or t == "n't":
            out += t
        elif t == '"':
            if open_quote:
                out += t
            else:
                out += " " + t
            open_quote = not open_quote
        elif prev == "(" or (prev == '"' and open_quote):
            out += t
        else:
            out += " " + t
    return out


def perturb(rng, tokens, keep):
    """Word-level noise: substitute, drop, insert, swap; `keep` out of 100 kept as is."""
    vocab = ADJ + NOUN + VERB + ADV + PREP
    out = []
    for t in tokens:
        r = rng.below(100)
        if r < keep:
            out.append(t)
        elif r < keep + (100 - keep) // 2:
            out.append(rng.pick(vocab) if t.isalpha() else t)
        elif r < keep + 3 * (100 - keep) // 4:
            continue
        else:
            out.append(t)
            out.append(rng.pick(vocab))
    for i in range(len(out) - 1):
        if rng.below(40) == 0:
            out[i], out[i + 1] = out[i + 1], out[i]
    return out or ["."]


def write(path, text, newline=True):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def write_bytes(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def make_data():
    rng = SplitMix64(20260202)
    refs, hyps, sys2, refs2 = [], [], [], []
    for _ in range(300):
        tokens = sentence_tokens(rng)
        refs.append(detok(tokens))
        hyps.append(detok(perturb(rng, tokens, 72)))
        sys2.append(detok(perturb(rng, tokens, 80)))
        refs2.append(detok(perturb(rng, tokens, 85)))
    write(os.path.join(DATA, "sample.ref.txt"), "\n".join(refs) + "\n")
    write(os.path.join(DATA, "sample.hyp.txt"), "\n".join(hyps) + "\n")
    write(os.path.join(DATA, "sample.sys2.txt"), "\n".join(sys2) + "\n")
    return refs, hyps, sys2, refs2


def make_inputs(refs, hyps, sys2, refs2):
    p = lambda name: os.path.join(INPUTS, name)
    write(p("ref2.txt"), "\n".join(refs2) + "\n")
    write(p("nr2.ref.txt"), "\n".join(f"{a}\t{b}" for a, b in zip(refs, refs2)) + "\n")
    # Three references per line, the last one holding a stray tab (maxsplit keeps it).
    write(p("nr3.ref.txt"),
          "\n".join(f"{a}\t{b}\t{c}\textra words" for a, b, c in zip(refs, refs2, sys2)) + "\n")
    # CRLF, and a last line without a newline.
    write(p("crlf.ref.txt"), "\r\n".join(refs[:40]))
    write(p("crlf.hyp.txt"), "\r\n".join(hyps[:40]) + "\r\n")
    write(p("lf40.hyp.txt"), "\n".join(hyps[:40]) + "\n")
    # Trailing and leading whitespace of every kind Python strips; a lone CR inside a line
    # (a file line, not a line break, for sacrebleu's newline='\n').
    tails = [" ", "\t", "  \t ", "\u00a0", "\u3000", "\x1c", "\x0b", "\x0c", " \r", "\u2028", ""]
    ws_h = []
    ws_r = []
    for i in range(30):
        ws_h.append((" " if i % 3 == 0 else "") + hyps[i] + tails[i % len(tails)])
        ws_r.append(refs[i] + tails[(i + 4) % len(tails)])
    ws_h[5] = hyps[5].replace(" ", "\r", 2)
    ws_h[6] = ""
    ws_r[7] = "   "
    write(p("ws.hyp.txt"), "\n".join(ws_h) + "\n")
    write(p("ws.ref.txt"), "\n".join(ws_r) + "\n")
    uni_r = [
        "Der Bürgermeister begrüßt die Gäste im Rathaus.",
        "Η ΟΔΟΣ ΕΙΝΑΙ ΣΚΟΤΕΙΝΗ ΚΑΙ ΜΑΚΡΙΑ ΟΔΟΣ.",
        "İstanbul'da hava çok güzel, değil mi?",
        "我们今天去北京参观故宫和长城。",
        "東京の天気は晴れです、明日は雨でしょう。",
        "«Bonjour», dit-elle… puis elle partit — vite!",
        "The price rose 3.5% to $1,000.50 in 2019-2020 (U.S. data).",
        "Tom &amp; Jerry &lt;3 the “quoted” text <skipped> here.",
        "مرحبا بكم في المدينة الجديدة.",
        "Emoji 👍🏽 and 👨‍👩‍👧 families ❤️ text.",
        "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ ａｎｄ ＡＢＣ １２３。",
        "Ωραία μέρα σήμερα, ΟΔΥΣΣΕΥΣ ΚΑΙ ΣΟΦΟΣ.",
    ]
    uni_h = [
        "Der Bürgermeister begrüsst die Gäste im Rathaus!",
        "Η οδος ειναι σκοτεινη και μακρια οδος.",
        "istanbul'da hava çok güzel değil mi ?",
        "我们今天去北京参观长城和故宫。",
        "東京の天気は晴れ、明日は雨でしょう。",
        "« Bonjour », dit-elle... puis elle partit - vite !",
        "The price rose 3.5 % to $ 1,000.50 in 2019 - 2020 (U.S. data) .",
        "Tom & Jerry <3 the \"quoted\" text here.",
        "مرحبا بكم في المدينة.",
        "Emoji 👍 and 👨‍👩‍👧 families ❤ text.",
        "FULLWIDTH text and ABC 123.",
        "ωραία μέρα σήμερα, οδυσσευς και σοφος.",
    ]
    write(p("unicode.ref.txt"), "\n".join(uni_r) + "\n")
    write(p("unicode.hyp.txt"), "\n".join(uni_h) + "\n")
    short_r = ["a b c d e", "one two", "", "x", "same same same", "just words here", "z"]
    short_h = ["a b", "one two", "nothing", "", "same", "just words", "z z z"]
    write(p("short.ref.txt"), "\n".join(short_r) + "\n")
    write(p("short.hyp.txt"), "\n".join(short_h) + "\n")
    write(p("zero.hyp.txt"), "\n".join("qqq www eee rrr" for _ in refs[:40]) + "\n")
    write(p("ref40.txt"), "\n".join(refs[:40]) + "\n")
    write(p("tok.hyp.txt"), "\n".join(" ".join(sentence_tokens(SplitMix64(i))) for i in range(120)) + "\n")
    write(p("tok.ref.txt"), "\n".join(detok(sentence_tokens(SplitMix64(i))) for i in range(120)) + "\n")


def run_cli(args, stdin=None, env=None):
    full_env = dict(os.environ)
    full_env.pop("SACREBLEU_FORMAT", None)
    full_env.pop("SACREBLEU_SEED", None)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "sacrebleu", *args],
        input=None if stdin is None else stdin.encode("utf-8"),
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        cwd=ROOT,
        env=full_env,
    )
    return proc.returncode, proc.stdout.decode("utf-8")


def full_stats(ref_paths, hyp_path, **kw):
    """sacrebleu's full-precision corpus statistics for the same inputs (files read as the CLI
    reads them)."""
    def lines(path):
        with open(os.path.join(ROOT, path), encoding="utf-8", newline="\n") as f:
            return [line.rstrip() for line in f]
    refs = [lines(r) for r in ref_paths]
    bleu = BLEU(**kw)
    s = bleu.corpus_score(lines(hyp_path), refs)
    return {
        "score": s.score, "counts": list(map(float, s.counts)), "totals": list(map(float, s.totals)),
        "precisions": s.precisions, "bp": s.bp, "ratio": float(s.ratio),
        "sys_len": s.sys_len, "ref_len": s.ref_len,
    }


def main():
    refs, hyps, sys2, refs2 = make_data()
    make_inputs(refs, hyps, sys2, refs2)
    R, H, S2 = "data/sample.ref.txt", "data/sample.hyp.txt", "data/sample.sys2.txt"
    I = lambda name: f"tests/golden/cli/inputs/{name}"
    cases = []

    def case(name, args, stdin=None, env=None, full=None):
        code, out = run_cli(args, stdin, env)
        entry = {"name": name, "args": args, "exit": code, "stdout": out}
        if stdin is not None:
            entry["stdin"] = stdin
        if env:
            entry["env"] = env
        if full is not None:
            entry["full"] = full
        cases.append(entry)

    tok_flag = {"none": "none", "13a": "13a", "intl": "intl", "char": "char", "zh": "zh"}
    # Single system, every format and width.
    case("default_json", [R, "-i", H], full=full_stats([R], H))
    case("text", [R, "-i", H, "-f", "text"])
    case("score_only", [R, "-i", H, "-b"])
    case("score_only_text", [R, "-i", H, "-b", "-f", "text"])
    for w in range(5):
        case(f"width{w}_text", [R, "-i", H, "-f", "text", "-w", str(w)])
        case(f"width{w}_json", [R, "-i", H, "-w", str(w)])
    case("short_signature", [R, "-i", H, "-f", "text", "--short"])
    case("short_signature_json", [R, "-i", H, "-sh"])
    case("lowercase", [R, "-i", H, "-lc"], full=full_stats([R], H, lowercase=True))
    case("lowercase_text", [R, "-i", H, "-lc", "-f", "text"])
    for tok in ["none", "13a", "intl", "char", "zh"]:
        case(f"tok_{tok}", [R, "-i", H, "-tok", tok], full=full_stats([R], H, tokenize=tok))
        case(f"tok_{tok}_lc_text", [R, "-i", H, "--tokenize", tok, "-lc", "-f", "text"])
        case(f"unicode_tok_{tok}", [I("unicode.ref.txt"), "-i", I("unicode.hyp.txt"), "-tok", tok, "-f", "text", "-w", "4"])
        case(f"unicode_tok_{tok}_lc", [I("unicode.ref.txt"), "-i", I("unicode.hyp.txt"), "-tok", tok, "-lc"],
             full=full_stats([I("unicode.ref.txt")], I("unicode.hyp.txt"), tokenize=tok, lowercase=True))
    # Smoothing.
    for method, values in [("none", [None]), ("exp", [None, "7"]), ("floor", [None, "0.3", "0"]),
                           ("add-k", [None, "0.5", "2", "0"])]:
        for v in values:
            args = ["-s", method] + ([] if v is None else ["-sv", v])
            kw = {"smooth_method": method}
            if v is not None:
                kw["smooth_value"] = float(v)
            case(f"smooth_{method}_{v}", [R, "-i", H, *args], full=full_stats([R], H, **kw))
            case(f"smooth_{method}_{v}_short", [I("short.ref.txt"), "-i", I("short.hyp.txt"), *args, "-f", "text", "-w", "6"])
            case(f"smooth_{method}_{v}_sl", [I("short.ref.txt"), "-i", I("short.hyp.txt"), *args, "-sl", "-w", "4"])
    case("smooth_long_option", [R, "-i", H, "--smooth-method", "floor", "--smooth-value", "0.05", "-f", "text"])
    # Sentence level.
    case("sl", [R, "-i", H, "-sl"])
    case("sl_b", [R, "-i", H, "-sl", "-b", "-w", "3"])
    case("sl_json_is_text", [R, "-i", H, "-sl", "-f", "json"])
    case("sl_char_lc", [I("unicode.ref.txt"), "-i", I("unicode.hyp.txt"), "-sl", "-tok", "char", "-lc"])
    case("sl_multi_ref", [R, I("ref2.txt"), "-i", H, "-sl", "--short"])
    case("sl_none", [R, "-i", H, "-sl", "-s", "none", "-w", "2"])
    # References.
    case("two_refs", [R, I("ref2.txt"), "-i", H], full=full_stats([R, I("ref2.txt")], H))
    case("two_refs_text", [R, I("ref2.txt"), "-i", H, "-f", "text"])
    case("num_refs_2", [I("nr2.ref.txt"), "-i", H, "--num-refs", "2", "-f", "text"])
    case("num_refs_2_short", [I("nr2.ref.txt"), "-i", H, "-nr", "2"])
    case("num_refs_3_extra_tab", [I("nr3.ref.txt"), "-i", H, "-nr", "3", "-f", "text"])
    # Line endings, whitespace.
    case("crlf", [I("crlf.ref.txt"), "-i", I("crlf.hyp.txt")],
         full=full_stats([I("crlf.ref.txt")], I("crlf.hyp.txt")))
    case("crlf_vs_lf", [I("crlf.ref.txt"), "-i", I("lf40.hyp.txt"), "-f", "text"])
    case("crlf_sl", [I("crlf.ref.txt"), "-i", I("crlf.hyp.txt"), "-sl", "-tok", "char"])
    case("whitespace", [I("ws.ref.txt"), "-i", I("ws.hyp.txt"), "-f", "text", "-w", "5"])
    case("whitespace_sl", [I("ws.ref.txt"), "-i", I("ws.hyp.txt"), "-sl", "-w", "3"])
    case("whitespace_none", [I("ws.ref.txt"), "-i", I("ws.hyp.txt"), "-tok", "none"],
         full=full_stats([I("ws.ref.txt")], I("ws.hyp.txt"), tokenize="none"))
    # Edge statistics.
    case("short_lines", [I("short.ref.txt"), "-i", I("short.hyp.txt"), "-f", "text", "-w", "4"])
    case("zero_matches", [I("ref40.txt"), "-i", I("zero.hyp.txt")])
    case("identical", [R, "-i", R, "-w", "14"])
    case("identical_text", [R, "-i", R, "-f", "text"])
    case("tokenized_input", [I("tok.ref.txt"), "-i", I("tok.hyp.txt"), "-f", "text"])
    case("tokenized_input_force", [I("tok.ref.txt"), "-i", I("tok.hyp.txt"), "-f", "text", "--force"])
    # Standard input.
    with open(os.path.join(ROOT, H), encoding="utf-8") as f:
        hyp_text = f.read()
    with open(os.path.join(ROOT, S2), encoding="utf-8") as f:
        sys2_text = f.read()
    case("stdin", [R], stdin=hyp_text)
    case("stdin_text", [R, "-f", "text"], stdin=hyp_text)
    case("stdin_crlf_and_cr", [I("ref40.txt"), "-f", "text"],
         stdin="\r\n".join(hyps[:20]) + "\r" + "\r".join(hyps[20:40]) + "\n")
    paste = "".join(f"{a}\t{b}\n" for a, b in zip(hyp_text.splitlines(), sys2_text.splitlines()))
    case("stdin_two_systems", [R, "-f", "text"], stdin=paste)
    case("stdin_two_systems_json", [R], stdin=paste)
    case("stdin_paired_bs", [R, "-pbs", "-f", "text"], stdin=paste)
    # Environment.
    case("env_format_text", [R, "-i", H], env={"SACREBLEU_FORMAT": "text"})
    case("env_format_ignored_value", [R, "-i", H], env={"SACREBLEU_FORMAT": "yaml"})
    # Confidence intervals (sacrebleu's own resamples: the numbers must match).
    case("ci", [R, "-i", H, "-ci"])
    case("ci_text", [R, "-i", H, "-ci", "-f", "text"])
    case("ci_n100_w3", [R, "-i", H, "-ci", "-cin", "100", "-w", "3", "-f", "text"])
    case("ci_n1_no_interval", [R, "-i", H, "-ci", "-cin", "1"])
    case("ci_b", [R, "-i", H, "-ci", "-b"])
    case("ci_seed", [R, "-i", H, "-ci", "-f", "text", "-w", "4"], env={"SACREBLEU_SEED": "42"})
    case("ci_floor_lc", [R, "-i", H, "-ci", "-s", "floor", "-lc", "-tok", "intl", "-w", "6"])
    case("ci_add_k", [R, "-i", H, "-ci", "-cin", "300", "-s", "add-k", "-sv", "0.3", "-f", "text", "-w", "8"])
    case("ci_short_lines", [I("short.ref.txt"), "-i", I("short.hyp.txt"), "-ci", "-cin", "200", "-f", "text", "-w", "6"])
    case("ci_two_refs", [R, I("ref2.txt"), "-i", H, "-ci", "-f", "text", "-w", "3"])
    # Several systems.
    case("multi_text", [R, "-i", H, S2, "-f", "text"])
    case("multi_json", [R, "-i", H, S2])
    case("multi_latex", [R, "-i", H, S2, "-f", "latex"])
    case("multi_w0", [R, "-i", H, S2, R, "-f", "text", "-w", "0"])
    case("paired_bs_text", [R, "-i", H, S2, "-pbs", "-f", "text"])
    case("paired_bs_json", [R, "-i", H, S2, "--paired-bs"])
    case("paired_bs_latex", [R, "-i", H, S2, "-pbs", "-f", "latex"])
    case("paired_bs_n200_three", [R, "-i", H, S2, R, "-pbs", "-pbsn", "200", "-f", "text", "-w", "3"])
    case("paired_bs_three_json", [R, "-i", H, S2, R, "-pbs", "-pbsn", "300"])
    case("paired_bs_dup_baseline", [R, "-i", H, S2, H, "-pbs", "-pbsn", "100", "-f", "text"])
    case("paired_bs_seed_json", [R, "-i", S2, H, "-pbs", "-pbsn", "250"], env={"SACREBLEU_SEED": "7"})
    case("paired_bs_add_k", [R, "-i", H, S2, "-pbs", "-s", "add-k", "-sv", "0.3", "-lc"])
    case("paired_bs_short_sig", [R, "-i", H, S2, "-pbs", "-f", "text", "-sh"])
    case("paired_ar_text", [R, "-i", H, S2, "-par", "-parn", "2000", "-f", "text"])
    case("paired_ar_json", [R, "-i", H, S2, "-par", "-parn", "1000"])
    case("paired_ar_default_n", [R, "-i", H, S2, "--paired-ar", "-f", "text"])
    case("paired_ar_add_k_trunc", [R, "-i", H, S2, "-par", "-parn", "1000", "-s", "add-k", "-sv", "0.5"])
    case("paired_ar_three_latex", [R, "-i", H, S2, R, "-par", "-parn", "500", "-f", "latex"])

    # chrF and chrF++ (-m chrf), alone and with BLEU.
    U = [I("unicode.ref.txt"), "-i", I("unicode.hyp.txt")]
    case("chrf_json", [R, "-i", H, "-m", "chrf"])
    case("chrf_text", [R, "-i", H, "-m", "chrf", "-f", "text"])
    case("chrf_b", [R, "-i", H, "-m", "chrf", "-b"])
    case("chrf_short", [R, "-i", H, "-m", "chrf", "-f", "text", "--short"])
    for w in [0, 3, 10]:
        case(f"chrf_w{w}", [R, "-i", H, "-m", "chrf", "-f", "text", "-w", str(w)])
    case("chrfpp_json", [R, "-i", H, "-m", "chrf", "--chrf-word-order", "2", "-w", "10"])
    case("chrfpp_text_short_flags", [R, "-i", H, "-m", "chrf", "-cw", "2", "-cc", "4", "-f", "text", "-w", "8"])
    for beta in ["1", "3"]:
        case(f"chrf_beta{beta}", [R, "-i", H, "-m", "chrf", "--chrf-beta", beta, "-f", "text", "-w", "8"])
    case("chrf_whitespace", [R, "-i", H, "-m", "chrf", "--chrf-whitespace", "-w", "8"])
    case("chrf_lowercase", [R, "-i", H, "-m", "chrf", "--chrf-lowercase", "-cw", "2", "-w", "8"])
    case("chrf_eps", [R, "-i", H, "-m", "chrf", "--chrf-eps-smoothing", "-f", "text", "-w", "8"])
    case("chrf_all_flags", [R, "-i", H, "-m", "chrf", "-cc", "3", "-cw", "3", "--chrf-beta", "1",
                            "--chrf-whitespace", "--chrf-lowercase", "--chrf-eps-smoothing", "-w", "8"])
    case("chrf_word_only", [R, "-i", H, "-m", "chrf", "-cc", "0", "-cw", "2", "-f", "text", "-w", "8"])
    case("chrf_unicode", U + ["-m", "chrf", "-f", "text", "-w", "8"])
    case("chrfpp_unicode_lc_ws", U + ["-m", "chrf", "-cw", "2", "--chrf-lowercase", "--chrf-whitespace", "-w", "8"])
    case("chrf_unicode_sl", U + ["-m", "chrf", "-cw", "2", "-sl", "-w", "6"])
    case("chrf_whitespace_file", [I("ws.ref.txt"), "-i", I("ws.hyp.txt"), "-m", "chrf", "--chrf-whitespace", "-w", "8"])
    case("chrf_whitespace_file_sl", [I("ws.ref.txt"), "-i", I("ws.hyp.txt"), "-m", "chrf", "-cw", "2", "-sl", "-w", "4"])
    case("chrf_short_lines", [I("short.ref.txt"), "-i", I("short.hyp.txt"), "-m", "chrf", "-cw", "2", "-f", "text", "-w", "8"])
    case("chrf_short_lines_eps_sl", [I("short.ref.txt"), "-i", I("short.hyp.txt"), "-m", "chrf", "--chrf-eps-smoothing", "-sl", "-w", "8"])
    case("chrf_crlf", [I("crlf.ref.txt"), "-i", I("crlf.hyp.txt"), "-m", "chrf", "-w", "8"])
    case("chrf_two_refs", [R, I("ref2.txt"), "-i", H, "-m", "chrf", "-cw", "2", "-f", "text", "-w", "8"])
    case("chrf_num_refs_3", [I("nr3.ref.txt"), "-i", H, "-nr", "3", "-m", "chrf", "-w", "8"])
    case("chrf_sl", [R, "-i", H, "-m", "chrf", "-sl"])
    case("chrf_sl_b", [R, "-i", H, "-m", "chrf", "-sl", "-b", "-w", "3"])
    case("chrf_sl_multi_ref_short", [R, I("ref2.txt"), "-i", H, "-m", "chrf", "-sl", "--short", "-w", "5"])
    case("chrf_stdin", [R, "-m", "chrf", "-cw", "2"], stdin=hyp_text)
    case("chrf_identical", [R, "-i", R, "-m", "chrf", "-w", "14"])
    case("chrf_zero_matches", [I("ref40.txt"), "-i", I("zero.hyp.txt"), "-m", "chrf", "-w", "8"])
    # Both metrics: sacrebleu prints them sorted (BLEU first) whatever the order given.
    case("both_json", [R, "-i", H, "-m", "bleu", "chrf"])
    case("both_json_reversed", [R, "-i", H, "-m", "chrf", "bleu", "-w", "6"])
    case("both_text", [R, "-i", H, "-m", "chrf", "bleu", "-f", "text"])
    case("both_text_short_w4", [R, "-i", H, "-m", "bleu", "chrf", "-cw", "2", "-f", "text", "-w", "4", "-sh"])
    case("both_b", [R, "-i", H, "-m", "bleu", "chrf", "-b"])
    case("both_b_text", [R, "-i", H, "-m", "bleu", "chrf", "-b", "-f", "text", "-w", "3"])
    case("both_repeated", [R, "-i", H, "-m", "chrf", "bleu", "chrf", "-f", "text"])
    case("both_unicode_tok_lc", U + ["-m", "bleu", "chrf", "-tok", "intl", "-lc", "--chrf-lowercase", "-f", "text", "-w", "6"])
    # Confidence intervals on chrF (float32 resamples).
    case("chrf_ci", [R, "-i", H, "-m", "chrf", "-ci", "-w", "10"])
    case("chrf_ci_text", [R, "-i", H, "-m", "chrf", "-ci", "-f", "text"])
    case("chrfpp_ci_n300", [R, "-i", H, "-m", "chrf", "-cw", "2", "-ci", "-cin", "300", "-f", "text", "-w", "10"])
    case("chrf_ci_eps_seed", [R, "-i", H, "-m", "chrf", "--chrf-eps-smoothing", "-ci", "-cin", "200", "-w", "10"],
         env={"SACREBLEU_SEED": "42"})
    case("chrf_ci_short_lines", [I("short.ref.txt"), "-i", I("short.hyp.txt"), "-m", "chrf", "-ci", "-cin", "100", "-f", "text", "-w", "8"])
    case("both_ci", [R, "-i", H, "-m", "bleu", "chrf", "-ci", "-cin", "200", "-w", "10"])
    case("both_ci_text", [R, "-i", H, "-m", "chrf", "bleu", "-ci", "-f", "text", "-w", "4"])
    case("both_ci_b_text", [R, "-i", H, "-m", "chrf", "bleu", "-ci", "-cin", "100", "-b", "-f", "text"])
    # Several systems, and paired tests on chrF.
    case("chrf_multi_text", [R, "-i", H, S2, "-m", "chrf", "-f", "text", "-w", "6"])
    case("chrf_multi_json", [R, "-i", H, S2, "-m", "chrf", "-cw", "2"])
    case("both_multi_text", [R, "-i", H, S2, R, "-m", "chrf", "bleu", "-f", "text"])
    case("both_multi_json", [R, "-i", H, S2, "-m", "bleu", "chrf", "-w", "3"])
    case("both_multi_latex", [R, "-i", H, S2, "-m", "chrf", "bleu", "-f", "latex"])
    case("chrf_paired_bs_text", [R, "-i", H, S2, "-m", "chrf", "-pbs", "-f", "text", "-w", "10"])
    case("chrfpp_paired_bs_three", [R, "-i", H, S2, R, "-m", "chrf", "-cw", "2", "-pbs", "-pbsn", "300", "-f", "text", "-w", "8"])
    case("chrf_paired_bs_latex_seed", [R, "-i", S2, H, "-m", "chrf", "-pbs", "-pbsn", "250", "-f", "latex", "-w", "6"],
         env={"SACREBLEU_SEED": "7"})
    case("both_paired_bs_text", [R, "-i", H, S2, "-m", "chrf", "bleu", "-pbs", "-pbsn", "400", "-f", "text", "-w", "6"])
    case("both_paired_bs_text_bleu_first", [R, "-i", H, S2, "-m", "bleu", "chrf", "-pbs", "-pbsn", "200", "-f", "text", "-sh"])
    case("chrf_paired_ar_text", [R, "-i", H, S2, "-m", "chrf", "-par", "-parn", "2000", "-f", "text", "-w", "10"])
    case("chrf_paired_ar_json", [R, "-i", H, S2, R, "-m", "chrf", "-cw", "2", "-par", "-parn", "1000"])
    case("both_paired_ar_latex", [R, "-i", H, S2, "-m", "chrf", "bleu", "-par", "-parn", "500", "-f", "latex"])
    case("both_paired_ar_json", [R, "-i", H, S2, "-m", "bleu", "chrf", "-par", "-parn", "500"])
    case("chrf_stdin_paired_bs", [R, "-m", "chrf", "-pbs", "-pbsn", "200", "-f", "text"], stdin=paste)

    # TER (-m ter), alone and with BLEU and chrF: every --ter-* combination, references,
    # sentence level, confidence intervals and paired tests.
    case("ter_json", [R, "-i", H, "-m", "ter"])
    case("ter_text", [R, "-i", H, "-m", "ter", "-f", "text", "-w", "8"])
    case("ter_b", [R, "-i", H, "-m", "ter", "-b", "-w", "6"])
    case("ter_short", [R, "-i", H, "-m", "ter", "-f", "text", "--short"])
    case("ter_short_json", [R, "-i", H, "-m", "ter", "-sh", "-w", "4"])
    ter_flags = ["--ter-normalized", "--ter-no-punct", "--ter-asian-support", "--ter-case-sensitive"]
    for bits in range(16):
        flags = [f for k, f in enumerate(ter_flags) if bits >> k & 1]
        case(f"ter_unicode_flags{bits}", U + ["-m", "ter", *flags, "-f", "text", "-w", "10"])
        if bits in (0, 3, 5, 9, 15):
            case(f"ter_flags{bits}", [R, "-i", H, "-m", "ter", *flags, "-w", "10"])
    case("ter_unicode_sl_norm_asian", U + ["-m", "ter", "--ter-normalized", "--ter-asian-support", "-sl", "-w", "6"])
    case("ter_sl", [R, "-i", H, "-m", "ter", "-sl"])
    case("ter_sl_b", [R, "-i", H, "-m", "ter", "-sl", "-b", "-w", "3"])
    case("ter_sl_multi_ref_short", [R, I("ref2.txt"), "-i", H, "-m", "ter", "-sl", "--short", "-w", "5"])
    case("ter_two_refs", [R, I("ref2.txt"), "-i", H, "-m", "ter", "-f", "text", "-w", "10"])
    case("ter_num_refs_3", [I("nr3.ref.txt"), "-i", H, "-nr", "3", "-m", "ter", "-w", "10"])
    case("ter_short_lines", [I("short.ref.txt"), "-i", I("short.hyp.txt"), "-m", "ter", "-f", "text", "-w", "8"])
    case("ter_short_lines_sl", [I("short.ref.txt"), "-i", I("short.hyp.txt"), "-m", "ter", "-sl", "-w", "8"])
    case("ter_whitespace_file", [I("ws.ref.txt"), "-i", I("ws.hyp.txt"), "-m", "ter", "--ter-normalized", "-w", "8"])
    case("ter_crlf", [I("crlf.ref.txt"), "-i", I("crlf.hyp.txt"), "-m", "ter", "-w", "8"])
    case("ter_stdin", [R, "-m", "ter", "--ter-no-punct"], stdin=hyp_text)
    case("ter_identical", [R, "-i", R, "-m", "ter", "-w", "14"])
    case("ter_zero_matches", [I("ref40.txt"), "-i", I("zero.hyp.txt"), "-m", "ter", "-w", "8"])
    case("all_three_json", [R, "-i", H, "-m", "bleu", "chrf", "ter"])
    case("all_three_text_reversed", [R, "-i", H, "-m", "ter", "chrf", "bleu", "-f", "text", "-w", "4"])
    case("all_three_b", [R, "-i", H, "-m", "ter", "bleu", "chrf", "-b"])
    case("ter_bleu_short_text", [R, "-i", H, "-m", "ter", "bleu", "-f", "text", "-sh", "--ter-case-sensitive"])
    case("ter_ci", [R, "-i", H, "-m", "ter", "-ci", "-cin", "300", "-w", "10"])
    case("ter_ci_text", [R, "-i", H, "-m", "ter", "-ci", "-f", "text"])
    case("ter_ci_two_refs_seed", [R, I("ref2.txt"), "-i", H, "-m", "ter", "-ci", "-cin", "200", "-f", "text", "-w", "8"],
         env={"SACREBLEU_SEED": "42"})
    case("all_three_ci_text", [R, "-i", H, "-m", "ter", "bleu", "chrf", "-ci", "-cin", "200", "-f", "text", "-w", "4"])
    case("ter_multi_text", [R, "-i", H, S2, "-m", "ter", "-f", "text", "-w", "6"])
    case("ter_multi_json", [R, "-i", H, S2, R, "-m", "ter", "--ter-normalized"])
    case("all_three_multi_latex", [R, "-i", H, S2, "-m", "chrf", "ter", "bleu", "-f", "latex"])
    case("ter_paired_bs_text", [R, "-i", H, S2, "-m", "ter", "-pbs", "-pbsn", "300", "-f", "text", "-w", "10"])
    case("ter_paired_bs_three_refs2", [R, I("ref2.txt"), "-i", H, S2, R, "-m", "ter", "-pbs", "-pbsn", "200", "-f", "text", "-w", "8"])
    case("all_three_paired_bs_text", [R, "-i", H, S2, "-m", "ter", "bleu", "chrf", "-pbs", "-pbsn", "200", "-f", "text", "-w", "6"])
    case("ter_paired_ar_text", [R, "-i", H, S2, "-m", "ter", "-par", "-parn", "1000", "-f", "text", "-w", "10"])
    case("ter_paired_ar_json_refs2", [R, I("ref2.txt"), "-i", H, S2, "-m", "ter", "-par", "-parn", "500"])
    case("ter_stdin_paired_ar", [R, "-m", "ter", "-par", "-parn", "300", "-f", "latex"], stdin=paste)

    # sacrebleu 2.6.0's -pbs -f json dies on chrF (json cannot serialize its numpy.float32
    # means: TypeError, exit 1, nothing on stdout). These cases run sacrebleu's own CLI code
    # with json.dumps(..., default=float), i.e. what it would print if it could.
    def patched_case(name, args):
        code, out = run_cli(args)
        assert code == 1 and out == "", (name, code, out)
        script = (
            "import sys, json, sacrebleu.utils as u\n"
            "class J:\n"
            "    dumps = staticmethod(lambda o, **k: json.dumps(o, default=float, **k))\n"
            "u.json = J\n"
            "from sacrebleu.sacrebleu import main\n"
            "sys.argv = ['sacrebleu'] + sys.argv[1:]\n"
            "main()\n"
        )
        full_env = dict(os.environ)
        full_env.pop("SACREBLEU_FORMAT", None)
        full_env.pop("SACREBLEU_SEED", None)
        proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                              cwd=ROOT, env=full_env, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        cases.append({"name": name, "args": args, "exit": 0, "stdout": proc.stdout.decode("utf-8"),
                      "sacrebleu_json_float32_patched": True})

    patched_case("chrf_paired_bs_json", [R, "-i", H, S2, "-m", "chrf", "-pbs", "-pbsn", "300"])
    patched_case("both_paired_bs_json", [R, "-i", H, S2, R, "-m", "bleu", "chrf", "-cw", "2", "-pbs", "-pbsn", "200"])
    patched_case("ter_paired_bs_json", [R, "-i", H, S2, "-m", "ter", "-pbs", "-pbsn", "200"])

    # --max-ngram-order: not a sacrebleu CLI option; the API's max_ngram_order, printed the
    # way the CLI prints a score (signature without an n-gram field).
    def api_case(name, order, sentence=False, width=1, is_json=False, **kw):
        def lines(path):
            with open(os.path.join(ROOT, path), encoding="utf-8", newline="\n") as f:
                return [line.rstrip() for line in f]
        hyp_lines, ref_lines = lines(H), lines(R)
        metric = BLEU(max_ngram_order=order, effective_order=sentence, references=[ref_lines], **kw)
        sig = metric.get_signature().format(False)
        args = [R, "-i", H, "--max-ngram-order", str(order), "-w", str(width)]
        if kw.get("smooth_method"):
            args += ["-s", kw["smooth_method"]]
        if sentence:
            args.append("-sl")
            out = "".join(
                metric.sentence_score(h, [r]).format(width, False, sig) + "\n"
                for h, r in zip(hyp_lines, ref_lines))
        else:
            args += ["-f", "json" if is_json else "text"]
            out = metric.corpus_score(hyp_lines, None).format(width, False, sig, is_json) + "\n"
        cases.append({"name": name, "args": args, "exit": 0, "stdout": out, "api": True,
                      "max_order": order})

    api_case("order1_text", 1)
    api_case("order2_json", 2, is_json=True)
    api_case("order6_text", 6, width=4)
    api_case("order6_none", 6, smooth_method="none")
    api_case("order3_sl", 3, sentence=True, width=2)

    with open(os.path.join(GOLD, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"sacrebleu": sacrebleu.__version__, "cases": cases}, f, ensure_ascii=False,
                  indent=1)
        f.write("\n")
    print(f"{len(cases)} cases -> {os.path.relpath(os.path.join(GOLD, 'cases.json'), ROOT)}")


if __name__ == "__main__":
    main()
