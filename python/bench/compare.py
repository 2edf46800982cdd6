#!/usr/bin/env python3
"""PyTorch's nn.Embedding / nn.EmbeddingBag against embedding_kernels.torch, through Python.

Issue 13's speed comparison: both sides are called as a user calls them,
module call and autograd included, so the Python-level overhead of the
modules (argument checks, NumPy views, ``autograd.Function``) is in every
figure. It needs the package installed (``pip install ./python``, which
builds the optimised extension; ``.ci/run`` installs an unoptimised one
into its cached virtualenv, which this script refuses to time) and torch.

    python python/bench/compare.py                       # every workload and op
    python python/bench/compare.py --workloads tiny,minilm --ops forward,bag_max
    python python/bench/compare.py --json                # also the rows as JSON
    python python/bench/compare.py --markdown FILE       # also the tables in Markdown
    python python/bench/compare.py --compile             # both sides under torch.compile

The ops, each run by ``torch.nn``'s module and by ours with the same table
(a copy each) and the same ids:

* ``forward``: ``emb(ids)`` with autograd off (``torch.no_grad()`` around
  the whole loop, as inference runs).
* ``dense_backward``: ``weight.grad = None; emb(ids).sum().backward()``:
  the forward, and the backward into a fresh dense gradient.
* ``bag_sum``, ``bag_max``: ``bag(ids, offsets)``, autograd off as for
  ``forward``; bags of BAG_SIZE (16) consecutive ids.
* ``sparse_sgd``: ``opt.zero_grad(); emb(ids).sum().backward(); opt.step()``
  with ``sparse=True`` and ``torch.optim.SGD(lr=0.01)``: the forward, the
  sparse backward and the update. Ours hands SGD distinct rows (built
  coalesced; autograd drops the flag as it stores ``weight.grad``),
  PyTorch's a row per id.
* ``fused_sgd``: the same step, ours fused: PyTorch's side as in
  ``sparse_sgd``; ours ``emb(ids).sum().backward()`` on a module made with
  ``sgd_in_backward(lr=0.01)``, whose backward is the crate's fused sparse
  SGD step (no gradient, no optimiser).
* ``fused_adagrad``: as ``fused_sgd`` with Adagrad: PyTorch's side
  ``sparse=True`` and ``torch.optim.Adagrad(lr=0.01)``, ours
  ``adagrad_in_backward(lr=0.01)``. The issue sets no goal for it.

Timing: warm loops. Each side first runs ``--warmup-s`` seconds of calls
(0.2); then the two sides take turns in bursts of back-to-back calls (at
least ``--burst-s``, 0.05 s, and two calls a burst) until each side has
spent ``--budget-s`` seconds (0.5) and made ``--min-calls`` timed calls
(10). Every call is timed on its own; the first call of each burst is
dropped (the other side's burst has just run, so it starts colder than the
rest), and the figure is the median of the others, with the 10th and 90th
percentiles as a range. Taking turns lets both sides see the same moments
of a shared machine. Threads: torch's intra-op pool and the crate's rayon
pool both get ``--threads`` (2).

The overhead rows (on tiny, autograd off) put the module's forward beside
the NumPy function it calls, ``embedding_kernels.embedding(weight, ids)`` on
the same arrays, which allocates its output unzeroed as the module's call
does, and beside ``embedding(weight, ids, out=out)``. The NumPy function with
a preallocated ``out`` shows what allocating the output costs, and with a
single id what the call itself costs (argument conversion, checks, releasing
the GIL) around the kernel; the module on a single id, the same for the
module.

With ``--compile``, each side's module is ``torch.compile(module,
fullgraph=True)`` (the default inductor backend), compiled by the check
before the timing starts; the optimisers stay eager. Its goals: ours at
least as fast on every workload, and the dense backward and bag max 3x.

This script is not a test and asserts no speed; it checks once per row
that both sides compute the same values, so that it times the same work.
"""

import argparse
import json
import os
import platform
import sys
import time
import warnings

import numpy as np
import torch
from torch import nn

import embedding_kernels as ek
import embedding_kernels.torch as ekt

# PyTorch's Adagrad warns on every sparse step that it skips its invariant checks.
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")

THREADS_DEFAULT = 2

WORKLOADS = {
    # name: (num_embeddings, embedding_dim, num_ids), as benches/common/mod.rs
    "tiny": (1_000, 64, 4_096),
    "minilm": (30_522, 384, 8_192),
    "gpt2": (50_257, 768, 16_384),
    "recsys": (1_000_000, 128, 65_536),
}
BAG_SIZE = 16
# The learning rate of the optimiser steps (SGD and Adagrad).
LR = 0.01
OPS = ["forward", "dense_backward", "bag_sum", "bag_max", "sparse_sgd", "fused_sgd", "fused_adagrad"]
# The goals, as PyTorch's median over ours (above 1: ours faster),
# on the workloads it names. It sets none for tiny, where the overhead rows
# carry its goal (under 10 µs above the call of the kernel), nor one of its
# own for the bag sum, which is a forward (the forward's goal is shown).
GOALS = {
    "forward": 1.0,
    "bag_sum": 1.0,
    "dense_backward": 3.0,
    "bag_max": 3.0,
    "sparse_sgd": 1.5,
    "fused_sgd": 1.5,
}
GOAL_WORKLOADS = ("minilm", "gpt2", "recsys")
# Under `--compile` (issue 66): at least PyTorch's speed on every workload, tiny too,
# and the dense backward's and the bag max's lead kept.
COMPILED_GOALS = {op: 1.0 for op in OPS} | {"dense_backward": 3.0, "bag_max": 3.0}
# Set by `--compile`: each side's module runs through `torch.compile`.
COMPILE = False


class Timer:
    """Per-call timings of several sides taking turns in bursts."""

    def __init__(self, warmup_s, burst_s, budget_s, min_calls):
        self.warmup_s = warmup_s
        self.burst_s = burst_s
        self.budget_s = budget_s
        self.min_calls = min_calls

    def run(self, sides):
        """``sides``: name -> call. Returns name -> list of per-call seconds."""
        for call in sides.values():
            start = time.perf_counter()
            while time.perf_counter() - start < self.warmup_s:
                call()
        samples = {name: [] for name in sides}
        spent = dict.fromkeys(sides, 0.0)
        while any(
            spent[n] < self.budget_s or len(samples[n]) < self.min_calls for n in sides
        ):
            for name, call in sides.items():
                burst_start = time.perf_counter()
                calls = 0
                while calls < 2 or time.perf_counter() - burst_start < self.burst_s:
                    t0 = time.perf_counter()
                    call()
                    t1 = time.perf_counter()
                    if calls > 0:
                        samples[name].append(t1 - t0)
                    calls += 1
                spent[name] += time.perf_counter() - burst_start
        return samples


def summary(samples):
    """Median, 10th and 90th percentiles in ms, and the count."""
    ms = np.array(samples) * 1e3
    p10, med, p90 = np.percentile(ms, [10, 50, 90])
    return {"median_ms": float(med), "p10_ms": float(p10), "p90_ms": float(p90), "calls": len(ms)}


def data(name):
    """The workload's table, ids and offsets, from a fixed seed."""
    rows, dim, n = WORKLOADS[name]
    gen = torch.Generator().manual_seed(0x5EED + rows)
    weight = torch.randn(rows, dim, generator=gen)
    ids = torch.randint(0, rows, (n,), generator=gen)
    offsets = torch.arange(0, n, BAG_SIZE)
    return weight, ids, offsets


def pair(op, weight, ids, offsets):
    """The two sides' calls for ``op``, and a check that they agree."""
    rows, dim = weight.shape
    if op in ("forward", "dense_backward", "sparse_sgd", "fused_sgd", "fused_adagrad"):
        sparse = op in ("sparse_sgd", "fused_sgd", "fused_adagrad")
        theirs = nn.Embedding.from_pretrained(weight.clone(), freeze=False, sparse=sparse)
        ours = ekt.Embedding.from_pretrained(weight.clone(), freeze=False, sparse=sparse)
        if op == "fused_sgd":
            ours.sgd_in_backward(LR)
        elif op == "fused_adagrad":
            ours.adagrad_in_backward(LR)
    else:
        mode = op.removeprefix("bag_")
        theirs = nn.EmbeddingBag.from_pretrained(weight.clone(), freeze=False, mode=mode)
        ours = ekt.EmbeddingBag.from_pretrained(weight.clone(), freeze=False, mode=mode)

    def run(module):
        """The module as the timed loop calls it: compiled under ``--compile``."""
        return torch.compile(module, fullgraph=True) if COMPILE else module

    if op == "forward":

        def make(module):
            return run(module)

        def check():
            assert torch.equal(calls["torch"](), calls["ours"]()), "forward outputs differ"

    elif op in ("bag_sum", "bag_max"):

        def make(module):
            forward = run(module)
            return lambda: forward(ids, offsets)

        def check():
            assert torch.equal(calls["torch"](), calls["ours"]()), f"{op} outputs differ"

    elif op == "dense_backward":

        def make(module):
            forward = run(module)

            def call():
                module.weight.grad = None
                forward(ids).sum().backward()

            return call

        def check():
            calls["torch"]()
            calls["ours"]()
            assert torch.equal(theirs.weight.grad, ours.weight.grad), "gradients differ"

    elif op in ("sparse_sgd", "fused_sgd", "fused_adagrad"):

        def make(module):
            forward = run(module)
            if module is ours and op != "sparse_sgd":
                return lambda: forward(ids).sum().backward()
            optimizer = torch.optim.Adagrad if op == "fused_adagrad" else torch.optim.SGD
            opt = optimizer(module.parameters(), lr=LR)

            def call():
                opt.zero_grad(set_to_none=True)
                forward(ids).sum().backward()
                opt.step()

            return call

        def check():
            calls["torch"]()
            calls["ours"]()
            # One step from the same table: the same rows, each moved by lr times its
            # count. The sums differ in order (PyTorch's uncoalesced rows are summed by
            # the optimiser), hence a tolerance.
            assert torch.allclose(theirs.weight, ours.weight, rtol=0, atol=1e-5), "steps differ"

    else:
        raise ValueError(op)

    if op == "forward":
        forwards = {"torch": make(theirs), "ours": make(ours)}
        calls = {side: (lambda f=f: f(ids)) for side, f in forwards.items()}
        return calls, check
    calls = {"torch": make(theirs), "ours": make(ours)}
    return calls, check


# The forwards are timed as inference runs them: autograd off for the whole loop
# (entering torch.no_grad() on every call would add its own microsecond or two).
NO_GRAD_OPS = ("forward", "bag_sum", "bag_max")


def compare(name, op, timer):
    if COMPILE:
        # Each row compiles new modules: Dynamo's count of recompilations starts again.
        torch._dynamo.reset()
    weight, ids, offsets = data(name)
    calls, check = pair(op, weight, ids, offsets)
    with torch.set_grad_enabled(op not in NO_GRAD_OPS):
        check()
        samples = timer.run(calls)
    row = {"workload": name, "op": op}
    for side, s in samples.items():
        row[side] = summary(s)
    row["ratio"] = row["torch"]["median_ms"] / row["ours"]["median_ms"]
    if COMPILE:
        goal = COMPILED_GOALS.get(op)
    else:
        goal = GOALS.get(op) if name in GOAL_WORKLOADS else None
    row["goal"] = goal
    row["met"] = None if goal is None else row["ratio"] >= goal
    return row


def overhead(timer):
    """The module's forward against the NumPy function on tiny, in µs."""
    weight, ids, offsets = data("tiny")
    emb = ekt.Embedding.from_pretrained(weight.clone())
    bag = ekt.EmbeddingBag.from_pretrained(weight.clone(), mode="sum")
    w, i, o = weight.numpy(), ids.numpy(), offsets.numpy()
    out = np.empty(ids.shape + (weight.shape[1],), dtype=np.float32)
    bag_out = np.empty((len(o), weight.shape[1]), dtype=np.float32)
    one, ones = i[:1].copy(), ids[:1].clone()
    theirs = nn.Embedding.from_pretrained(weight.clone())

    sides = {
        "Embedding (ours)": lambda: emb(ids),
        "embedding()": lambda: ek.embedding(w, i),
        "embedding(out=)": lambda: ek.embedding(w, i, out=out),
        "embedding(), 1 id": lambda: ek.embedding(w, one),
        "Embedding (ours), 1 id": lambda: emb(ones),
        "nn.Embedding": lambda: theirs(ids),
        "EmbeddingBag sum (ours)": lambda: bag(ids, offsets),
        "embedding_bag()": lambda: ek.embedding_bag(w, i, o, mode="sum"),
        "embedding_bag(out=)": lambda: ek.embedding_bag(w, i, o, mode="sum", out=bag_out),
    }
    with torch.no_grad():
        samples = timer.run(sides)
    return {side: summary(s) for side, s in samples.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--threads", type=int, default=THREADS_DEFAULT,
                   help="torch's intra-op threads and the crate's rayon pool")
    p.add_argument("--warmup-s", type=float, default=0.2)
    p.add_argument("--burst-s", type=float, default=0.05)
    p.add_argument("--budget-s", type=float, default=0.5, help="timed seconds per side and row")
    p.add_argument("--min-calls", type=int, default=10, help="timed calls per side and row, at least")
    p.add_argument("--no-overhead", action="store_true")
    p.add_argument("--compile", action="store_true",
                   help="both sides' modules through torch.compile(fullgraph=True)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", metavar="FILE",
                   help="also write the tables to FILE in Markdown, headed by the date and machine")
    args = p.parse_args()
    workloads, ops = args.workloads.split(","), args.ops.split(",")
    for w in workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w} (one of: {', '.join(WORKLOADS)})")
    for op in ops:
        if op not in OPS:
            p.error(f"unknown op {op} (one of: {', '.join(OPS)})")
    level = ek._native.OPT_LEVEL
    if level in ("0", "1"):
        p.error(
            f"the installed extension is built at opt-level {level} (CI's quick build?); "
            "`pip install ./python` builds the optimised one to time"
        )
    global COMPILE
    COMPILE = args.compile
    torch.set_num_threads(args.threads)
    # The extension makes its rayon pool on its first kernel call, below.
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    timer = Timer(args.warmup_s, args.burst_s, args.budget_s, args.min_calls)

    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}; python {platform.python_version()}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads, "
        f"{torch.backends.cpu.get_cpu_capability()}), numpy {np.__version__}, "
        f"RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS')}, "
        f"embedding_kernels from {os.path.dirname(ek.__file__)}"
    )
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print("medians of per-call times, ms (10th-90th percentile); ratio = torch / ours")
    print(
        f"{'workload':8} {'op':15} {'torch ms':>9} {'(p10-p90)':>15} {'ours ms':>9} "
        f"{'(p10-p90)':>15} {'ratio':>6}  goal"
    )
    rows = []
    for name in workloads:
        for op in ops:
            row = compare(name, op, timer)
            rows.append(row)
            t, o = row["torch"], row["ours"]
            goal = "" if row["goal"] is None else (
                f">= {row['goal']:g}x {'met' if row['met'] else 'NOT MET'}"
            )
            print(
                f"{name:8} {op:15} {t['median_ms']:9.3f} "
                f"{'(' + format(t['p10_ms'], '.3f') + '-' + format(t['p90_ms'], '.3f') + ')':>15} "
                f"{o['median_ms']:9.3f} "
                f"{'(' + format(o['p10_ms'], '.3f') + '-' + format(o['p90_ms'], '.3f') + ')':>15} "
                f"{row['ratio']:6.2f}  {goal}",
                flush=True,
            )
    result = {"torch": torch.__version__, "threads": args.threads, "rows": rows,
              "compiled": args.compile}
    if not args.no_overhead and not args.compile:
        print()
        print("per-call cost on tiny (1000 x 64, 4096 ids), µs (10th-90th percentile)")
        costs = overhead(timer)
        for side, s in costs.items():
            print(
                f"  {side:24} {s['median_ms'] * 1e3:8.1f} "
                f"({s['p10_ms'] * 1e3:.1f}-{s['p90_ms'] * 1e3:.1f})"
            )
        emb_extra = (costs["Embedding (ours)"]["median_ms"] - costs["embedding()"]["median_ms"]) * 1e3
        bag_extra = (
            costs["EmbeddingBag sum (ours)"]["median_ms"] - costs["embedding_bag()"]["median_ms"]
        ) * 1e3
        emb_out_extra = (
            costs["Embedding (ours)"]["median_ms"] - costs["embedding(out=)"]["median_ms"]
        ) * 1e3
        one_extra = (
            costs["Embedding (ours), 1 id"]["median_ms"] - costs["embedding(), 1 id"]["median_ms"]
        ) * 1e3
        print(
            f"  module over NumPy function: Embedding {emb_extra:+.1f} µs (1 id: {one_extra:+.1f}), "
            f"EmbeddingBag {bag_extra:+.1f} µs"
        )
        print(f"  module over NumPy function into a given out: Embedding {emb_out_extra:+.1f} µs")
        result["overhead_us"] = {
            side: {k: v * 1e3 for k, v in s.items() if k.endswith("_ms")} for side, s in costs.items()
        }
        result["module_over_numpy_us"] = {
            "Embedding": emb_extra, "Embedding, 1 id": one_extra, "EmbeddingBag": bag_extra,
            "Embedding over out=": emb_out_extra,
        }
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps(result, indent=1))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(result, " ".join(["python", *sys.argv])))


def cpu_model():
    """The CPU's model name as Linux reports it, else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def markdown(result, command):
    """The run's tables in Markdown: the ops, then the per-call costs."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    title = "# Through Python: `torch.nn` against `embedding_kernels.torch`"
    if result.get("compiled"):
        title += ", both under `torch.compile`"
    lines = [
        title,
        "",
        f"_{when} · {cpu_model()}, {os.cpu_count()} CPUs · torch {result['torch']}, "
        f"{result['threads']} threads · `{command}`_",
        "",
        "Medians of per-call times in warm loops, the two sides taking turns; "
        "ratio = PyTorch's time / ours (above 1: ours is faster).",
        "",
        "| workload | op | PyTorch ms | ours ms | ratio |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['workload']} | `{row['op']}` | {row['torch']['median_ms']:.3f} | "
            f"{row['ours']['median_ms']:.3f} | {row['ratio']:.2f} |"
        )
    costs = result.get("overhead_us")
    if costs:
        lines += [
            "",
            "Per-call cost on tiny (1000 × 64, 4096 ids), µs, median (10th-90th percentile):",
            "",
            "| call | µs |",
            "| --- | ---: |",
        ]
        for side, c in costs.items():
            lines.append(
                f"| {side} | {c['median_ms']:.1f} ({c['p10_ms']:.1f}-{c['p90_ms']:.1f}) |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
