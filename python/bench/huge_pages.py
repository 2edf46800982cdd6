#!/usr/bin/env python3
"""The bag sum through ``EmbeddingBag`` from a table in 4 KiB pages and in huge pages.

The modules move their ``weight`` into transparent huge pages as they are made
(``embedding_kernels.collapse_huge_pages``); a tensor assigned to ``weight``
afterwards is left as it is. This script makes both from the same values in
one process and times them in turns, with ``F.embedding_bag`` on PyTorch's own
tensor (4 KiB pages) beside them:

    python python/bench/huge_pages.py                  # minilm, gpt2, recsys
    python python/bench/huge_pages.py --workloads minilm --rounds 30

Bags of 16 consecutive ids, autograd off. Each case runs bursts of 30 ms of
calls in turn, ``--rounds`` times; a burst's figure is the median of its
calls, and the table shows the median burst and the range over bursts, µs.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import embedding_kernels as ek
from embedding_kernels.torch import EmbeddingBag

# compare.py's tables, ids and bags of 16 (this folder is on the path of a script run from it).
from compare import data

WORKLOADS = ("minilm", "gpt2", "recsys")
BURST_S = 0.03


def cases(name):
    weight, ids, offsets = data(name)
    table = weight.clone()
    start = time.perf_counter()
    huge = EmbeddingBag.from_pretrained(table, mode="sum")
    made_ms = 1e3 * (time.perf_counter() - start)
    # Whether the move succeeded: a second call finds the pages huge already.
    moved = ek.collapse_huge_pages(table.numpy())
    note = f"from_pretrained took {made_ms:.0f} ms, the table in huge pages: {moved}"
    small = EmbeddingBag.from_pretrained(weight.clone(), mode="sum")
    # Assigned after the module is made: left in the allocator's 4 KiB pages.
    small.weight = nn.Parameter(weight.clone(), requires_grad=False)
    return note, {
        "F.embedding_bag, 4 KiB pages": lambda: F.embedding_bag(ids, weight, offsets, mode="sum"),
        "EmbeddingBag, 4 KiB pages": lambda: small(ids, offsets),
        "EmbeddingBag, huge pages": lambda: huge(ids, offsets),
    }


def run(calls, rounds):
    for call in calls.values():
        start = time.perf_counter()
        while time.perf_counter() - start < 0.2:
            call()
    bursts = {case: [] for case in calls}
    for _ in range(rounds):
        for case, call in calls.items():
            times = []
            start = time.perf_counter()
            while time.perf_counter() - start < BURST_S:
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            bursts[case].append(1e6 * statistics.median(times))
    return bursts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'workload':8} {'case':30} {'median us':>10} {'range':>17}")
    with torch.no_grad():
        for name in args.workloads.split(","):
            if name not in WORKLOADS:
                p.error(f"unknown workload {name} (one of: {', '.join(WORKLOADS)})")
            note, calls = cases(name)
            for case, values in run(calls, args.rounds).items():
                spread = f"{min(values):.1f}-{max(values):.1f}"
                print(f"{name:8} {case:30} {statistics.median(values):10.1f} {spread:>17}")
            print(f"{name:8} ({note})")


if __name__ == "__main__":
    main()
