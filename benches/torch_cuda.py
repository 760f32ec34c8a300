#!/usr/bin/env python3
"""PyTorch on a CUDA GPU, eager and torch.compile: the rows of `benches/cuda.rs`, for comparison.

The loss is the independent PyTorch implementation of `benches/torch_bleu_loss.py` (self-checked
there against a pure-Python BLEU counter) and `benches/torch_hidden.py`, imported, not copied:

  logits rows, [B,S,T,V] = [32,64,64,32000] f32 and [64,128,128,50000] bf16 (inputs of
  torch_bleu_loss.make_inputs: logits N(0, 1), one reference of T ids in [1, V), targets = the
  reference's first S ids), forward + backward from the logits:
    cross_entropy   F.cross_entropy(logits, targets, ignore_index=0)
    expected, lower_bound, paired
                    torch_bleu_loss.bleu_loss(logits, refside, form, from_logits=True)
    ce_expected     torch_bleu_loss.ce_bleu_loss(logits, refside, targets, 1.0)
    ce_options      F.cross_entropy with class weights in [0.5, 1.5] and label smoothing 0.1,
                    plus the z-loss 1e-4 · mean lse² and the token accuracy (Liger's options)
  CTC rows, [B,T',L,V] = [32,128,48,8000] f32 (benches/ctc.rs's shape, blank 0, full lengths):
    ctc             F.ctc_loss(F.log_softmax(x, -1).transpose(0, 1), …, reduction="mean")
  bf16 logits are cast to f32 inside the loss function (`logits.float()`, part of what is timed
  and compiled; the candle loss computes f16/bf16 in f32 the same way, and autocast would run
  softmax/log_softmax in f32); `--no-upcast` computes in bf16 instead.
  hidden rows, [B,S,D,T,V] = [32,64,512,64,32000] and [32,64,512,64,128000] f32 (inputs of
  torch_hidden.make_inputs): hidden_ce_expected = torch_hidden.loss_step, which materialises the
  logits (F.linear), CE (ε = 0.1, pad 0) + 0.3 · expected BLEU loss, and calls backward itself.

Modes: `eager`, and `compile` = torch.compile(fn, mode="default", dynamic=False) of the loss
function (the logits rows; backward outside) or of torch_hidden.loss_step (whose backward is a
graph break). Static shapes: a group's rows share one shape, and torch._dynamo.reset() runs
between groups. The first warm-up step includes compilation (reported as warmup_s); a row whose
compilation or run fails gets its error string in the JSON and the run goes on. The
implementation has graph breaks of its own (the reference lengths' `.tolist()`; in loss_step the
boolean mask, `.backward()`, `float(loss)`): the graphs and breaks of each compiled row's first
call are recorded (`compiled_graphs`).

The implementation builds a few small tensors inside the loss (lengths, masks, the score's
constants) with torch.arange/full/ones/tensor and no device; torch.compile ignores
torch.set_default_device (pytorch/pytorch#151202), so those modules' `torch` global is swapped,
while the steps run, for a copy of the torch module whose factories default to the device.

Per shape: `--warmup` untimed steps per row, one memory step, then `--repeats` rounds alternating
the rows (eager and compile included); each step ends with torch.cuda.synchronize() inside the
timer. Peak memory: torch.cuda.reset_peak_memory_stats() before the step, then
torch.cuda.max_memory_allocated() after it minus torch.cuda.memory_allocated() before it (the
gradients released), i.e. what the step allocates above its inputs, gradients included; the
maximum over the memory step and the timed steps.

    python3 benches/torch_cuda.py --json out.json            # the GPU run
    python3 benches/torch_cuda.py --device cpu --quick       # a smoke test without a GPU
    python3 benches/torch_cuda.py --only paired,hidden --repeats 5 --modes eager
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bleu_loss as tbl  # noqa: E402
import torch_hidden as th  # noqa: E402

LOGITS_SHAPES = [((32, 64, 64, 32000), "f32"), ((64, 128, 128, 50000), "bf16")]
LOGITS_SHAPES_QUICK = [((4, 16, 16, 1000), "f32"), ((8, 16, 16, 2000), "bf16")]
HIDDEN_SHAPES = [(32, 64, 512, 64, 32000), (32, 64, 512, 64, 128000)]
HIDDEN_SHAPES_QUICK = [(4, 16, 64, 16, 1000), (4, 16, 64, 16, 4000)]
LOGITS_ROWS = ("cross_entropy", "ce_options", "expected", "lower_bound", "paired", "ce_expected")
# [B, T', L, V]: benches/ctc.rs's shape; the row `ctc` is F.ctc_loss(F.log_softmax(x)).
CTC_SHAPES = [(32, 128, 48, 8000)]
CTC_SHAPES_QUICK = [(4, 32, 8, 500)]
Z_LOSS = 1e-4
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
COMPILE = 'torch.compile(fn, mode="default", dynamic=False)'


# ---------------------------------------------------------------------------------------------
# Running the imported implementation on the device
# ---------------------------------------------------------------------------------------------

_NAMESPACES: dict[str, types.ModuleType] = {}


def device_namespace(device: torch.device) -> types.ModuleType:
    """A copy of the torch module whose tensor factories default to `device`; one object per
    device, so that torch.compile's guards on the module global keep holding."""
    key = str(device)
    if key not in _NAMESPACES:
        ns = types.ModuleType(f"torch_on_{device.type}")
        ns.__dict__.update({k: v for k, v in torch.__dict__.items() if not k.startswith("__")})

        def factory(fn):
            def make(*args, **kwargs):
                kwargs.setdefault("device", device)
                return fn(*args, **kwargs)

            return make

        for name in ("arange", "full", "ones", "zeros", "tensor", "empty"):
            setattr(ns, name, factory(getattr(torch, name)))
        _NAMESPACES[key] = ns
    return _NAMESPACES[key]


class OnDevice:
    """While active, torch_bleu_loss's functions create their tensors on `device`."""

    def __init__(self, device: torch.device):
        self.ns = device_namespace(device)

    def __enter__(self):
        tbl.torch = self.ns

    def __exit__(self, *exc):
        tbl.torch = torch


def refside_to(refside: tbl.ReferenceSide, device: torch.device) -> tbl.ReferenceSide:
    """The reference side, computed on the host as in torch_bleu_loss, moved to the device."""
    return tbl.ReferenceSide(
        refside.ref_cat.to(device),
        [x.to(device) for x in refside.nu],
        [x.to(device) for x in refside.kappa],
        refside.ref_lens,
    )


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


class Row:
    def __init__(self, name, mode, shape, dtype, logits_bytes, clear, call):
        self.name, self.mode, self.shape, self.dtype = name, mode, shape, dtype
        self.logits_bytes = logits_bytes
        self.clear = clear  # releases the gradients before a step
        self.call = call  # one forward + backward
        self.runs_ms: list[float] = []
        self.peaks: list[int] = []
        self.warmup_s: float | None = None
        self.graphs: dict | None = None  # compile: graphs and graph breaks of the first warm-up
        self.error: str | None = None


def compiled(fn):
    return torch.compile(fn, mode="default", dynamic=False)


def logits_group(shape, dtype_name, device, modes, only, upcast):
    logits_cpu, ref_ids = tbl.make_inputs(shape)
    batch, seq, _, vocab = shape
    refside = refside_to(tbl.reference_side(tbl.strip_references(ref_ids, tbl.PAD_ID), 4), device)
    targets = ref_ids[:, 0, :seq]
    if targets.shape[1] < seq:
        targets = F.pad(targets, (0, seq - targets.shape[1]), value=tbl.PAD_ID)
    targets = targets.to(device)
    dtype = DTYPES[dtype_name]
    logits = logits_cpu.to(device=device, dtype=dtype).requires_grad_(True)
    del logits_cpu
    cast = upcast and dtype != torch.float32

    def make_loss(name):
        def loss_fn(x):
            if cast:
                x = x.float()
            if name == "cross_entropy":
                return F.cross_entropy(x.reshape(-1, vocab), targets.reshape(-1), ignore_index=tbl.PAD_ID)
            if name == "ce_options":
                return ce_options_loss(x.reshape(-1, vocab), targets.reshape(-1), class_weights)
            if name == "ce_expected":
                return tbl.ce_bleu_loss(x, refside, targets, 1.0, tbl.PAD_ID)[0]
            return tbl.bleu_loss(x, refside, name, from_logits=True)[0]

        return loss_fn

    class_weights = 0.5 + torch.arange(vocab, device=device, dtype=torch.float32) / max(vocab, 2)

    def clear():
        logits.grad = None

    rows = []
    logits_bytes = logits.numel() * logits.element_size()
    for name in LOGITS_ROWS:
        if only and name not in only and "logits" not in only:
            continue
        for mode in modes:
            fn = make_loss(name) if mode == "eager" else compiled(make_loss(name))

            def call(fn=fn):
                fn(logits).backward()

            rows.append(Row(name, mode, list(shape), dtype_name, logits_bytes, clear, call))
    return rows


def ce_options_loss(x, targets, class_weights):
    """Liger-Kernel's options at once, as cuda.rs's `ce_options`: class weights, label smoothing
    0.1, the z-loss (Z_LOSS · lse², a mean over the non-pad tokens) and the token accuracy
    (computed, not differentiated), padding id 0."""
    ce = F.cross_entropy(x, targets, weight=class_weights, ignore_index=tbl.PAD_ID, label_smoothing=0.1)
    mask = targets != tbl.PAD_ID
    lse = torch.logsumexp(x, -1)
    z = Z_LOSS * (lse * lse * mask).sum() / mask.sum()
    with torch.no_grad():
        _accuracy = ((x.argmax(-1) == targets) & mask).sum() / mask.sum()
    return ce + z


def ctc_group(shape, device, modes, only):
    """F.ctc_loss(F.log_softmax(x, -1)) forward + backward (PyTorch's idiom; time-first inside),
    blank 0, full lengths, reduction mean: the `ctc` rows of cuda.rs."""
    if only and "ctc" not in only:
        return []
    b, t, l, v = shape
    gen = torch.Generator().manual_seed(2026)
    logits = torch.randn(b, t, v, generator=gen).to(device).requires_grad_(True)
    targets = torch.randint(1, v, (b, l), generator=gen).to(device)
    input_lengths = torch.full((b,), t, dtype=torch.long, device=device)
    target_lengths = torch.full((b,), l, dtype=torch.long, device=device)

    def loss_fn(x):
        log_probs = F.log_softmax(x, -1).transpose(0, 1)
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean")

    def clear():
        logits.grad = None

    rows = []
    for mode in modes:
        fn = loss_fn if mode == "eager" else compiled(loss_fn)

        def call(fn=fn):
            fn(logits).backward()

        rows.append(Row("ctc", mode, list(shape), "f32", b * t * v * 4, clear, call))
    return rows


def hidden_group(shape, device, modes, only):
    if only and "hidden_ce_expected" not in only and "hidden" not in only:
        return []
    hidden, weight, refs, targets, lengths = th.make_inputs(shape, peaked=1.0)
    refside = refside_to(tbl.reference_side(tbl.strip_references(refs, tbl.PAD_ID), 4), device)
    hidden = hidden.detach().to(device).requires_grad_(True)
    weight = weight.detach().to(device).requires_grad_(True)
    targets, lengths = targets.to(device), lengths.to(device)
    b, s, _, _, v = shape

    def clear():
        hidden.grad = None
        weight.grad = None

    rows = []
    for mode in modes:
        fn = th.loss_step if mode == "eager" else compiled(th.loss_step)

        def call(fn=fn):
            fn(hidden, weight, refside, targets, lengths)

        rows.append(Row("hidden_ce_expected", mode, list(shape), "f32", b * s * v * 4, clear, call))
    return rows


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def describe_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 4000 else text[:4000] + " …"


def run_step(row: Row, device: torch.device, measure: bool):
    cuda = device.type == "cuda"
    row.clear()
    if cuda:
        torch.cuda.synchronize(device)
        if measure:
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    row.call()
    if cuda:
        torch.cuda.synchronize(device)
    ms = (time.perf_counter() - t0) * 1e3
    peak = torch.cuda.max_memory_allocated(device) - before if cuda and measure else None
    return ms, peak


def run_group(rows, device, warmup, repeats):
    def attempt(row, what, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - record any failure (compile errors, OOM) and go on
            row.error = f"{what}: {describe_error(e)}"
            print(f"  {row.name} {row.mode}: {row.error.splitlines()[0][:300]}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    with OnDevice(device):
        for row in rows:
            for i in range(warmup):
                if i == 0:
                    counters.clear()
                t0 = time.perf_counter()
                if attempt(row, "warm-up", lambda: run_step(row, device, False)) is None:
                    break
                if i == 0:
                    row.warmup_s = time.perf_counter() - t0
                    if row.mode == "compile":
                        row.graphs = {
                            "unique_graphs": counters["stats"].get("unique_graphs", 0),
                            "graph_breaks": sum(counters["graph_break"].values()),
                            "break_reasons": sorted({r.splitlines()[0] for r in counters["graph_break"]}),
                        }
        for row in rows:
            if row.error is None:
                got = attempt(row, "memory step", lambda: run_step(row, device, True))
                if got is not None and got[1] is not None:
                    row.peaks.append(got[1])
        for _ in range(repeats):
            for row in rows:
                if row.error is not None:
                    continue
                got = attempt(row, "timed run", lambda: run_step(row, device, True))
                if got is not None:
                    row.runs_ms.append(got[0])
                    if got[1] is not None:
                        row.peaks.append(got[1])


def row_json(row: Row) -> dict:
    ok = row.error is None and row.runs_ms
    peak = max(row.peaks) if row.peaks else None
    return {
        "name": row.name,
        "shape": row.shape,
        "dtype": row.dtype,
        "mode": row.mode,
        "median_ms": statistics.median(row.runs_ms) if ok else None,
        "min_ms": min(row.runs_ms) if ok else None,
        "max_ms": max(row.runs_ms) if ok else None,
        "runs_ms": row.runs_ms,
        "peak_bytes": peak if ok else None,
        "peak_bytes_runs": row.peaks,
        "logits_bytes": row.logits_bytes,
        "peak_over_logits": peak / row.logits_bytes if ok and peak is not None else None,
        "warmup_s": row.warmup_s,
        "compiled_graphs": row.graphs,
        "error": row.error,
    }


def print_rows(title, rows):
    print(f"\n{title}")
    print(f"{'row':<20} {'mode':<8} {'median ms':>10} {'min-max ms':>17} {'peak MiB':>10} {'/logits':>8} "
          f"{'1st warm-up s':>13} {'graphs/breaks':>13}")
    for row in rows:
        r = row_json(row)
        if r["median_ms"] is None:
            print(f"{row.name:<20} {row.mode:<8} FAILED: {(row.error or 'no timed run').splitlines()[0][:200]}")
            continue
        peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.1f}"
        over = "-" if r["peak_over_logits"] is None else f"{r['peak_over_logits']:.2f}x"
        graphs = "-" if row.graphs is None else f"{row.graphs['unique_graphs']}/{row.graphs['graph_breaks']}"
        print(f"{row.name:<20} {row.mode:<8} {r['median_ms']:>10.2f} "
              f"{r['min_ms']:>8.2f}-{r['max_ms']:<8.2f} {peak:>10} {over:>8} {row.warmup_s or 0:>13.1f} "
              f"{graphs:>13}", flush=True)


def driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (the same as cuda.rs --quick)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per row (the first compiles)")
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--only", default="", help="comma-separated rows or groups: " + ", ".join(
        LOGITS_ROWS + ("ctc", "hidden_ce_expected", "logits", "hidden")))
    parser.add_argument("--no-upcast", action="store_true", help="compute bf16 logits in bf16")
    parser.add_argument("--json", default="", help="default: benches/results/torch-cuda-<unix time>.json")
    args = parser.parse_args()
    if args.repeats < 1 or args.warmup < 1:
        raise SystemExit("--repeats and --warmup must be at least 1 (the first warm-up compiles)")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch (torch.cuda.is_available() is False); "
                         "--device cpu runs a smoke test")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("eager", "compile") for m in modes):
        raise SystemExit("--modes: eager and/or compile")
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    # Each group compiles its rows afresh; rows of one group differ in guards, not shapes.
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        props = torch.cuda.get_device_properties(device)
        device_line = (f"device: {device} {name} (compute capability {props.major}.{props.minor}, "
                       f"{props.total_memory / 2**30:.1f} GiB); torch {torch.__version__}, CUDA "
                       f"{torch.version.cuda}, driver {driver_version()}")
    else:
        name = "cpu"
        device_line = (f"device: cpu (a smoke test: no device memory; {torch.get_num_threads()} threads); "
                       f"torch {torch.__version__}")
    print(device_line)
    print(f"python {platform.python_version()}; float32 matmul precision {torch.get_float32_matmul_precision()}; "
          f"compile = {COMPILE}; bf16 logits {'in bf16' if args.no_upcast else 'cast to f32 in the loss'}")
    print(f"forward + backward per step, synchronized; {args.warmup} warm-up step(s) (the first compiles), "
          f"1 memory step, then the median and min-max of {args.repeats} rounds alternating the rows of a shape")
    print("peak: torch.cuda.max_memory_allocated() after the step (reset_peak_memory_stats() before it) minus "
          "memory_allocated() before it")

    logits_shapes = LOGITS_SHAPES_QUICK if args.quick else LOGITS_SHAPES
    hidden_shapes = HIDDEN_SHAPES_QUICK if args.quick else HIDDEN_SHAPES
    all_rows = []
    ctc_shapes = CTC_SHAPES_QUICK if args.quick else CTC_SHAPES
    groups = [("logits", shape, dtype) for shape, dtype in logits_shapes] + [
        ("ctc", shape, "f32") for shape in ctc_shapes] + [
        ("hidden", shape, "f32") for shape in hidden_shapes]
    for kind, shape, dtype in groups:
        try:
            if kind == "logits":
                rows = logits_group(shape, dtype, device, modes, only, not args.no_upcast)
                b, s, _, v = shape
                title = (f"logits [B,S,T,V] = {list(shape)} {dtype}: logits "
                         f"{b * s * v * DTYPES[dtype].itemsize / 2**20:.1f} MiB")
            elif kind == "ctc":
                rows = ctc_group(shape, device, modes, only)
                b, t, _, v = shape
                title = f"CTC [B,T',L,V] = {list(shape)} f32: logits {b * t * v * 4 / 2**20:.1f} MiB"
            else:
                rows = hidden_group(shape, device, modes, only)
                b, s, _, _, v = shape
                title = (f"hidden states [B,S,D,T,V] = {list(shape)} f32: the logits would be "
                         f"{b * s * v * 4 / 2**20:.1f} MiB")
        except Exception as e:  # noqa: BLE001 - e.g. out of memory building the inputs
            print(f"\n{kind} {list(shape)} {dtype}: inputs failed: {describe_error(e)}")
            continue
        if not rows:
            continue
        run_group(rows, device, args.warmup, args.repeats)
        print_rows(title, rows)
        all_rows.extend(rows)
        del rows
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    path = args.json or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                     f"torch-cuda-{int(time.time())}.json")
    doc = {
        "unix_time": int(time.time()),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": name,
        "driver_version": driver_version() if device.type == "cuda" else None,
        "header": device_line,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "compile": COMPILE,
        "bf16_upcast": not args.no_upcast,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "quick": args.quick,
        "measure": "forward+backward, torch.cuda.synchronize() inside the timer; rounds alternate the rows "
                   "of a shape; peak = max_memory_allocated() after reset_peak_memory_stats() minus "
                   "memory_allocated() before the step (gradients released), max over the memory step "
                   "and the timed steps",
        "rows": [row_json(r) for r in all_rows],
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
