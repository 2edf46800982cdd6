#!/usr/bin/env python3
"""PyTorch's CPU kernels on the report's workloads, timed the report's way.

The issues quote PyTorch figures; this script measures them on the machine
at hand, so they can be set beside `cargo run --release --example report`
from the same session. It needs PyTorch (`pip install torch`); the crate
itself never does.

    python3 benches/pytorch_peer.py                 # every row, cold and warm
    python3 benches/pytorch_peer.py --workloads recsys --ops bag_sum --json
    python3 benches/pytorch_peer.py --ops bag_sum,forward --formats f32,int8
    python3 benches/pytorch_peer.py --serve   # for `report --loop`, see below

Each row is timed two ways:

* cold: as the report does it. The op and a memcpy of the same bytes run
  round-robin (the first case rotating each repetition), so every call
  starts after the other case has swept the caches, and the memcpy gives the
  row's same-run yardstick. The figure to compare with the report.
* warm: the op alone, back to back, as criterion and a plain timing loop do;
  whatever the last call left in the caches helps the next.

Medians throughout. The memcpy is the faster of a one-thread copy (numpy)
and PyTorch's own (which uses the pool), like the report's. PyTorch runs
on its default thread count (all cores, as the report's rayon pool).

What PyTorch's figures include that the crate's do not: its ops allocate
their outputs, and the dense gradients (`dense_backward`, the backward of
`bag_sum_fwd_bwd`) are fresh zeroed tables on every call, while the report
writes into buffers it is given. The `sparse_sgd` set-up runs the forward
(untimed) just before the timed backward and step, so the touched rows are
warm there.

Reduced-precision tables (`--formats`, default all: f32, f16, bf16, int8,
int4) are measured for `bag_sum` and `forward` (the lookup); every other op
is f32 only. Each format's table is made from the same f32 weight, untimed:

* f16 / bf16: `weight.half()` / `weight.bfloat16()`, then the same
  `F.embedding_bag(mode="sum")` / `F.embedding` call as for f32. PyTorch
  returns f16 / bf16 outputs here (half the bytes written), while the crate
  writes f32.
* int8 / int4: PyTorch's row-wise packed tables,
  `torch.ops.quantized.embedding_bag_byte_prepack` / `_4bit_prepack`
  (codes, then the row's scale and bias: f32 for int8, f16 for int4), read
  by `embedding_bag_byte_rowwise_offsets` / `_4bit_rowwise_offsets` with
  `mode=0` (sum); the outputs are f32. PyTorch has no plain lookup over
  these tables: its quantized `Embedding` module calls the same bag kernel
  with bags of one id each (offsets = arange(num_ids)), and so does the
  `forward` row here.

The bags are the f32 row's in every format: BAG_SIZE consecutive ids each.
The cold row's memcpy copies the rows the op reads, in the format's bytes
(for int8 / int4 the packed rows, scale and bias included): the f32 rule,
which does not add the output (see `rows_for`).
"""

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

WORKLOADS = {
    # name: (num_embeddings, embedding_dim, num_ids), as benches/common/mod.rs
    "tiny": (1_000, 64, 4_096),
    "minilm": (30_522, 384, 8_192),
    "gpt2": (50_257, 768, 16_384),
    "recsys": (1_000_000, 128, 65_536),
    "narrow": (100_000, 16, 262_144),
}
BAG_SIZE = 16
MAX_SEQ = 1024
FORMATS = ["f32", "f16", "bf16", "int8", "int4"]
# The ops measured in every format; the others are f32 only.
FORMAT_OPS = ("forward", "bag_sum")
OPS = [
    "forward",
    "dense_backward",
    "sparse_sgd",
    "token_position",
    "bag_sum",
    "bag_mean",
    "bag_max",
    "bag_sum_fwd_bwd",
]


def median_ms(samples):
    return float(np.median(samples)) * 1e3


def measure(cases, budget_s, min_reps=5, warmup=2):
    """Round-robin timing of `cases` (name -> (setup, call)); medians in ms."""
    for _, (setup, call) in cases.items():
        for _ in range(warmup):
            setup()
            call()
    names = list(cases)
    times = {n: [] for n in names}
    start = time.perf_counter()
    rep = 0
    while rep < min_reps or time.perf_counter() - start < budget_s * len(names):
        for k in range(len(names)):
            name = names[(rep + k) % len(names)]
            setup, call = cases[name]
            setup()
            t = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t)
        rep += 1
    return {n: median_ms(v) for n, v in times.items()}, rep


def warm(setup, call, budget_s, min_reps=5):
    """The op alone, back to back (set-up untimed); median in ms."""
    for _ in range(2):
        setup()
        call()
    samples = []
    start = time.perf_counter()
    while len(samples) < min_reps or time.perf_counter() - start < budget_s:
        setup()
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    return median_ms(samples)


def nothing():
    pass


def format_table(weight, fmt):
    """The table `fmt` reads, made once from the f32 `weight` (untimed)."""
    if fmt == "f32":
        return weight
    if fmt == "f16":
        return weight.half()
    if fmt == "bf16":
        return weight.bfloat16()
    if fmt == "int8":
        return torch.ops.quantized.embedding_bag_byte_prepack(weight)
    if fmt == "int4":
        return torch.ops.quantized.embedding_bag_4bit_prepack(weight)
    raise ValueError(fmt)


def packed_bag_sum(fmt):
    """PyTorch's bag sum over a row-wise packed table of `fmt`."""
    return {
        "int8": torch.ops.quantized.embedding_bag_byte_rowwise_offsets,
        "int4": torch.ops.quantized.embedding_bag_4bit_rowwise_offsets,
    }[fmt]


def rows_for(name, op, fmt, args):
    if fmt != "f32" and op not in FORMAT_OPS:
        raise ValueError(f"{op} is measured in f32 only")
    rows, dim, n = WORKLOADS[name]
    gen = torch.Generator().manual_seed(0x5EED + rows)
    weight = torch.rand(rows, dim, generator=gen) * 2 - 1
    ids = torch.randint(0, rows, (n,), generator=gen)
    grad_out = torch.rand(n, dim, generator=gen) * 2 - 1
    offsets = torch.arange(0, n, BAG_SIZE)
    grad_bags = torch.rand(n // BAG_SIZE, dim, generator=gen) * 2 - 1
    table = format_table(weight, fmt)
    # The bytes of one stored row: dim floats for f32, dim halves for f16 and
    # bf16, and for int8 / int4 PyTorch's packed row (the codes, then the
    # row's scale and bias).
    row_bytes = table.shape[1] * table.element_size()
    # The yardstick: a copy of the rows a lookup reads, num_ids rows of
    # row_bytes (a repeated id counted each time, as the op reads it each
    # time), or a fill of the whole table for the ops that write a dense
    # gradient. The copy writes as many bytes as it reads, and the op's
    # output is not added: that is the f32 rule (there, num_ids x dim
    # floats; the forward's output is that size, a bag sum's is 1/BAG_SIZE
    # of it), kept as it is for every format, so the f32 rows are unchanged.
    # The buffers are whole floats, rounded up (at most 3 bytes more).
    src = np.ones(-(-n * row_bytes // 4), dtype=np.float32)
    dst = np.zeros_like(src)
    tsrc, tdst = torch.from_numpy(src), torch.from_numpy(dst)
    table_sized = op in ("dense_backward", "bag_sum_fwd_bwd")
    if table_sized:
        fill = torch.empty(rows, dim)
        fill_np = fill.numpy()
        yard = {
            "memset_1": (nothing, lambda: fill_np.fill(0.0)),
            "memset_pool": (nothing, lambda: fill.zero_()),
        }
    else:
        yard = {
            "memcpy_1": (nothing, lambda: np.copyto(dst, src)),
            "memcpy_pool": (nothing, lambda: tdst.copy_(tsrc)),
        }

    state = {}
    if op == "forward" and fmt in ("int8", "int4"):
        # A lookup is bags of one id each, as PyTorch's quantized Embedding.
        bag_sum = packed_bag_sum(fmt)
        singles = torch.arange(n)
        call = lambda: bag_sum(table, ids, singles, mode=0, include_last_offset=False)
        setup = nothing
    elif op == "forward":
        call = lambda: F.embedding(ids, table)
        setup = nothing
    elif op == "dense_backward":
        # The kernel under Embedding's dense backward: allocates and fills
        # the [rows, dim] gradient.
        def call():
            state["g"] = torch.ops.aten.embedding_dense_backward(
                grad_out, ids, rows, -1, False
            )

        def setup():
            state.pop("g", None)

    elif op == "sparse_sgd":
        param = torch.nn.Parameter(weight.clone())
        opt = torch.optim.SGD([param], lr=0.01)

        def setup():
            opt.zero_grad(set_to_none=True)
            state["out"] = F.embedding(ids, param, sparse=True)

        def call():
            state["out"].backward(grad_out)
            opt.step()

    elif op == "token_position":
        seq = math.gcd(n, MAX_SEQ)
        pos = torch.rand(seq, dim, generator=gen)
        tok = ids.view(-1, seq)
        scale = math.sqrt(dim)
        call = lambda: F.embedding(tok, weight) * scale + pos
        setup = nothing
    elif op == "bag_sum" and fmt in ("int8", "int4"):
        bag_sum = packed_bag_sum(fmt)
        call = lambda: bag_sum(table, ids, offsets, mode=0, include_last_offset=False)
        setup = nothing
    elif op == "bag_sum":
        call = lambda: F.embedding_bag(ids, table, offsets, mode="sum")
        setup = nothing
    elif op in ("bag_mean", "bag_max"):
        mode = op.removeprefix("bag_")
        call = lambda: F.embedding_bag(ids, weight, offsets, mode=mode)
        setup = nothing
    elif op == "bag_sum_fwd_bwd":
        param = torch.nn.Parameter(weight.clone())

        def setup():
            param.grad = None

        def call():
            F.embedding_bag(ids, param, offsets, mode="sum").backward(grad_bags)

    else:
        raise ValueError(op)

    cases = {"torch": (setup, call), **yard}
    medians, reps = measure(cases, args.budget_ms / 1e3)
    base_name = min(yard, key=lambda k: medians[k])
    row = {
        "workload": name,
        "op": op,
        "format": fmt,
        "cold_ms": medians["torch"],
        "baseline": "memset" if table_sized else "memcpy",
        "baseline_ms": medians[base_name],
        "reps": reps,
    }
    if not args.no_warm:
        row["warm_ms"] = warm(setup, call, args.budget_ms / 1e3)
    return row


# The ops of the warm-loop comparison (`report --loop`), and PyTorch's call
# for each: what a PyTorch user writes in a training or serving loop.
LOOP_OPS = (
    "gather",
    "forward",
    "bag_sum",
    "bag_mean",
    "sparse_step",
    "bag_sum_f16",
    "bag_sum_bf16",
    "bag_sum_int8",
    "bag_sum_int4",
)
LOOP_LR = 1e-6


def loop_data(name):
    """The tensors of one workload for the warm-loop cells."""
    rows, dim, n = WORKLOADS[name]
    gen = torch.Generator().manual_seed(0x5EED + rows)
    return {
        "weight": torch.rand(rows, dim, generator=gen) * 2 - 1,
        "ids": torch.randint(0, rows, (n,), generator=gen),
        "offsets": torch.arange(0, n, BAG_SIZE),
        "grad_out": torch.rand(n, dim, generator=gen) * 2 - 1,
    }


def loop_call(data, op):
    """PyTorch's side of one warm-loop cell: a call whose result is dropped
    as soon as it returns, as in a loop that uses it and moves on."""
    weight, ids, offsets = data["weight"], data["ids"], data["offsets"]
    if op == "gather":
        out = torch.empty(ids.numel(), weight.shape[1])

        def call():
            torch.index_select(weight, 0, ids, out=out)

    elif op == "forward":

        def call():
            F.embedding(ids, weight)

    elif op in ("bag_sum", "bag_mean"):
        mode = op.removeprefix("bag_")

        def call():
            F.embedding_bag(ids, weight, offsets, mode=mode)

    elif op == "sparse_step":
        # A copy, so the steps leave the workload's table as it was.
        param = torch.nn.Parameter(weight.clone())
        opt = torch.optim.SGD([param], lr=LOOP_LR)
        grad_out = data["grad_out"]

        def call():
            opt.zero_grad(set_to_none=True)
            F.embedding(ids, param, sparse=True).backward(grad_out)
            opt.step()

    elif op.startswith("bag_sum_") and op.removeprefix("bag_sum_") in FORMATS:
        fmt = op.removeprefix("bag_sum_")
        key = f"table_{fmt}"
        if key not in data:
            data[key] = format_table(weight, fmt)
        table = data[key]
        if fmt in ("int8", "int4"):
            bag_sum = packed_bag_sum(fmt)

            def call():
                bag_sum(table, ids, offsets, mode=0, include_last_offset=False)

        else:

            def call():
                F.embedding_bag(ids, table, offsets, mode="sum")

    else:
        raise ValueError(f"unknown loop op {op!r} (one of: {', '.join(LOOP_OPS)})")
    return call


def loop_median(call, warmup_s, budget_s, min_reps=5):
    """Calls back to back: `warmup_s` untimed, then at least `budget_s` of
    timed calls (and `min_reps`); the median in ms. A call's result is freed
    inside its timing, as in a user's loop."""
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        call()
    samples = []
    start = time.perf_counter()
    while len(samples) < min_reps or time.perf_counter() - start < budget_s:
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    return median_ms(samples), len(samples)


def serve():
    """The PyTorch side of `report --loop`: one JSON request a line on stdin
    (`{"workload", "op", "warmup_s", "budget_s"}`), one JSON answer a line on
    stdout (`{"ms", "reps"}`, or `{"error"}`). The first line out says what
    PyTorch is. A workload's tensors are kept until another is asked for."""
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "capability": torch.backends.cpu.get_cpu_capability(),
            }
        ),
        flush=True,
    )
    cached = {}
    for line in sys.stdin:
        try:
            req = json.loads(line)
            name = req["workload"]
            if name not in cached:
                cached.clear()
                cached[name] = loop_data(name)
            call = loop_call(cached[name], req["op"])
            ms, reps = loop_median(call, req["warmup_s"], req["budget_s"])
            answer = {"ms": ms, "reps": reps}
        except Exception as e:  # the report prints it and stops
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="minilm,gpt2,recsys")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help=f"table formats for {' and '.join(FORMAT_OPS)}; other ops run in f32 only",
    )
    p.add_argument("--threads", type=int, default=0, help="default: all cores")
    p.add_argument("--budget-ms", type=float, default=500)
    p.add_argument("--no-warm", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--serve",
        action="store_true",
        help="answer timing requests on stdin (used by `report --loop`)",
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.serve:
        serve()
        return
    formats = args.formats.split(",")
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        p.error(f"unknown format {', '.join(unknown)} (one of: {', '.join(FORMATS)})")
    out = []
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"cpu capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print(
        f"{'workload':8} {'op':16} {'format':6} {'cold ms':>9} {'warm ms':>9} "
        f"{'baseline':>8} {'ms':>8}"
    )
    for name in args.workloads.split(","):
        for op in args.ops.split(","):
            for fmt in formats:
                if fmt != "f32" and op not in FORMAT_OPS:
                    continue
                row = rows_for(name, op, fmt, args)
                out.append(row)
                w = row.get("warm_ms", float("nan"))
                print(
                    f"{name:8} {op:16} {fmt:6} {row['cold_ms']:9.2f} {w:9.2f} "
                    f"{row['baseline']:>8} {row['baseline_ms']:8.2f}",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"torch": torch.__version__, "rows": out}, indent=1))


if __name__ == "__main__":
    main()
