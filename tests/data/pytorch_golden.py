#!/usr/bin/env python3
"""Write PyTorch's answers for the reduced-precision tables to a golden file.

This script needs PyTorch (it was run with 2.15.0 on an AVX2 + FMA + F16C x86-64
CPU) and numpy. It is run by hand, never by `cargo test`; the Rust tests only
read what it writes:

    python tests/data/pytorch_golden.py            # from the crate's root
    # writes tests/data/pytorch_quantized.json

It is deterministic: every table, id list and weight comes from a seeded numpy
generator (PyTorch's own generator is not used), so running it again with the
same PyTorch on the same kind of CPU writes the same bytes.

What the file holds, per case (a small f32 table `weight` of `rows` x `dim`):

- `weight_f32_bits`: the table, each f32 as its IEEE bit pattern (u32).
- `f16_bits`, `bf16_bits`: `weight.to(torch.float16)` / `.to(torch.bfloat16)`, u16 bits.
- `byte_prepack`: `torch.ops.quantized.embedding_bag_byte_prepack(weight)`, u8,
  rows of `dim + 8` bytes; `byte_unpack_f32_bits`: `embedding_bag_byte_unpack` of it.
- `nbit4_prepack` / `nbit4_unpack_f32_bits`: the same with
  `embedding_bag_4bit_prepack` / `embedding_bag_4bit_unpack` (rows of
  `dim / 2 + 4` bytes); `nbit2_*` with the 2-bit ops (rows of `dim / 4 + 4`
  bytes). Where PyTorch refuses (odd `dim` for 4-bit, `dim % 4 != 0` for 2-bit,
  or any other error) the fields are null and `byte_error` / `nbit4_error` /
  `nbit2_error` hold the first line of PyTorch's error text (null otherwise).
- `bags`: each with `indices`, `offsets` (i64), `include_last_offset`,
  `per_sample_weights_bits` (u32 or null) and the sums
  `torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_rowwise_offsets(packed,
  indices, offsets, mode=0, per_sample_weights=..., include_last_offset=...)`
  as `byte_sum_f32_bits`, `nbit4_sum_f32_bits`, `nbit2_sum_f32_bits` (row-major,
  `bags x dim`; null, with the error text in `*_sum_error`, where the op raises or
  the table could not be packed).

Cases without bags (`bags: []`) hold rows with inf or NaN: what PyTorch writes
for them is recorded as it is, garbage included.

`tests/data/check_pytorch_rules.py` (numpy only) checks written-down prepack,
unpack and bag-sum rules against this file bit for bit.

The same run writes `tests/data/pytorch_half.json`: PyTorch's bags and lookups
on half-precision tables. Per case (`rows` x `dim`; `weight_f32_bits` as above):

- `f16_bits`, `bf16_bits`: the table `.half()` / `.bfloat16()`, u16 bits. Cases
  without bags hold conversion edges only (ties, overflow, subnormals, NaN).
- `lookup_ids` and `{f16,bf16}_lookup_bits`: `F.embedding(ids, table)`, u16 bits.
- `bags`: `indices`, `offsets`, `include_last_offset` and, per format `f` in
  f16 and bf16, `F.embedding_bag(indices, table, offsets, mode=m)` as
  `f_{sum,mean,max}_bits` (u16, `bags x dim`) and the max's `f_max_indices`
  (from `torch.embedding_bag`). Where the bag set has per-sample weights
  (`per_sample_weights_f32_bits`, as drawn), PyTorch wants them in the table's
  type: `f_weights_bits` holds them so rounded and `f_weighted_sum_bits` the
  weighted sum. A null output comes with its error in `f_{mode}_error`
  (`f_max_indices_error`, `f_weighted_sum_error`).

The tables are some of the quantized file's (same weights, same bags) and a few
of their own, drawn from a second generator (`SEED + 1`) so that adding them left
`pytorch_quantized.json` as it was.
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

SEED = 20240611
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "pytorch_quantized.json")
OUT_HALF = os.path.join(HERE, "pytorch_half.json")
Q = torch.ops.quantized


def f32_bits(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32)).reshape(-1).view(np.uint32).tolist()


def tensor_f32_bits(t):
    return f32_bits(t.detach().contiguous().numpy())


def tensor_u16_bits(t):
    return t.detach().contiguous().view(torch.int16).numpy().reshape(-1).view(np.uint16).tolist()


def error_text(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def attempt(fn):
    """(value, None) or (None, first line of the error)."""
    try:
        return fn(), None
    except Exception as e:  # PyTorch raises RuntimeError; record whatever it is
        return None, error_text(e)


FORMATS = [
    # key, prepack op, unpack op, bag op
    ("byte", Q.embedding_bag_byte_prepack, Q.embedding_bag_byte_unpack,
     Q.embedding_bag_byte_rowwise_offsets),
    ("nbit4", Q.embedding_bag_4bit_prepack, Q.embedding_bag_4bit_unpack,
     Q.embedding_bag_4bit_rowwise_offsets),
    ("nbit2", Q.embedding_bag_2bit_prepack, Q.embedding_bag_2bit_unpack,
     Q.embedding_bag_2bit_rowwise_offsets),
]


def make_case(name, weight, bags):
    weight = np.ascontiguousarray(weight, dtype=np.float32)
    rows, dim = weight.shape
    w = torch.from_numpy(weight.copy())
    case = {
        "name": name,
        "rows": rows,
        "dim": dim,
        "weight_f32_bits": f32_bits(weight),
        "f16_bits": tensor_u16_bits(w.to(torch.float16)),
        "bf16_bits": tensor_u16_bits(w.to(torch.bfloat16)),
    }
    packed = {}
    for key, prepack, unpack, _ in FORMATS:
        p, err = attempt(lambda: prepack(w))
        u = None
        if p is not None:
            u, err = attempt(lambda: unpack(p))
        packed[key] = p if u is not None else None
        case[f"{key}_prepack"] = p.contiguous().numpy().reshape(-1).tolist() if p is not None else None
        case[f"{key}_unpack_f32_bits"] = tensor_f32_bits(u) if u is not None else None
        case[f"{key}_error"] = err
    case["bags"] = []
    for indices, offsets, include_last, psw in bags:
        idx_t = torch.tensor(indices, dtype=torch.int64)
        off_t = torch.tensor(offsets, dtype=torch.int64)
        psw_t = None if psw is None else torch.from_numpy(np.asarray(psw, dtype=np.float32).copy())
        bag = {
            "indices": list(indices),
            "offsets": list(offsets),
            "include_last_offset": include_last,
            "per_sample_weights_bits": None if psw is None else f32_bits(psw),
        }
        for key, _, _, bag_op in FORMATS:
            p = packed[key]
            if p is None:
                out, err = None, f"no {key} table: " + (case[f"{key}_error"] or "unpack failed")
            else:
                out, err = attempt(lambda: bag_op(
                    p, idx_t, off_t, mode=0, per_sample_weights=psw_t,
                    include_last_offset=include_last))
            bag[f"{key}_sum_f32_bits"] = tensor_f32_bits(out) if out is not None else None
            bag[f"{key}_sum_error"] = err
        case["bags"].append(bag)
    return case


def bag_sets(rng, rows):
    """A few bag lists over `rows` ids: empty bags, single ids, 16 ids, repeats,
    weighted and not, with and without include_last_offset."""
    def ids(n):
        return rng.integers(0, rows, size=n).tolist()

    def weights(n):
        w = rng.standard_normal(n).astype(np.float32)
        if n >= 3:
            w[1] = 0.0
            w[2] = -abs(w[2])
        return w

    consecutive = [(i % rows) for i in range(16)]
    repeated = [rows - 1] * 4 + [0, 0]
    # Bag contents: empty, one id, 16 random ids, repeated ids, 16 consecutive ids, empty.
    groups = [[], ids(1), ids(16), repeated, consecutive, []]
    indices = [i for g in groups for i in g]
    starts = np.cumsum([0] + [len(g) for g in groups]).tolist()
    offsets_plain = starts[:-1]          # one offset per bag
    offsets_last = starts                # include_last_offset: one more, = len(indices)
    n = len(indices)
    return [
        (indices, offsets_plain, False, None),
        (indices, offsets_plain, False, weights(n)),
        (indices, offsets_last, True, weights(n)),
        (indices, offsets_last, True, None),
        # a single bag of every row once, in reverse order
        (list(range(rows - 1, -1, -1)), [0], False, None),
    ]


def random_cases(rng):
    shapes = [(1, 1), (5, 2), (7, 3), (10, 7), (13, 8), (20, 16), (9, 17), (50, 64), (12, 130),
              (4, 44)]
    cases = []
    for k, (rows, dim) in enumerate(shapes):
        # per row: a scale 10^U(-3, 3), a shift, and a normal or a uniform draw
        scale = 10.0 ** rng.uniform(-3, 3, size=(rows, 1))
        shift = rng.choice([0.0, 0.0, 1.0, -1.0, 5.0], size=(rows, 1))
        if k % 2 == 0:
            base = rng.standard_normal((rows, dim))
        else:
            base = rng.uniform(-1.0, 1.0, (rows, dim))
        weight = ((base + shift) * scale).astype(np.float32)
        cases.append(make_case(f"random_{rows}x{dim}", weight, bag_sets(rng, rows)))
    # one table with a single fixed scale per table, for each of 1e-3, 1 and 1e3
    for s in (1e-3, 1.0, 1e3):
        weight = (rng.uniform(-1.0, 3.0, (6, 16)) * s).astype(np.float32)
        cases.append(make_case(f"uniform_scale_{s:g}_6x16", weight, bag_sets(rng, 6)))
    return cases


def tie_cases(rng):
    """Rows whose quantized values land exactly on x.5 ties. dim 44 = 32 + 8 + 4
    runs through each of FBGEMM's code paths (32-wide, 8-wide and scalar tail)."""
    dim = 44
    rows = []
    # 8-bit: min 0, max 255 -> range + 1e-8 == 255 in f32, inverse scale 1.0, q = x
    r = np.array([0.0, 255.0] + [k + 0.5 for k in range(dim - 2)], dtype=np.float32)
    rows.append(r)
    rows.append(r[::-1].copy())
    r = np.array([0.0, 255.0] + [k + 0.5 for k in range(200, 200 + dim - 2)], dtype=np.float32)
    rows.append(r)
    # 8-bit: min 0, max 510 -> inverse 0.5, odd integers land on ties
    r = np.array([0.0, 510.0] + [2 * k + 1 for k in range(dim - 2)], dtype=np.float32)
    rows.append(r)
    # 8-bit: min -100, max 155 (range 255): ties after the subtraction
    r = np.array([-100.0, 155.0] + [k - 100 + 0.5 for k in range(0, 2 * (dim - 2), 2)],
                 dtype=np.float32)
    rows.append(r)
    # 4-bit: min 0, max 15 -> f16 scale 1.0, q = x, 0.5 .. 14.5 ties
    r = np.array([0.0, 15.0] + [(k % 15) + 0.5 for k in range(dim - 2)], dtype=np.float32)
    rows.append(r)
    # 4-bit: min 0, max 30 -> scale 2, odd integers are ties
    r = np.array([0.0, 30.0] + [2 * (k % 15) + 1 for k in range(dim - 2)], dtype=np.float32)
    rows.append(r)
    # 2-bit: min 0, max 3 -> scale 1, 0.5, 1.5, 2.5
    r = np.array([0.0, 3.0] + [(k % 3) + 0.5 for k in range(dim - 2)], dtype=np.float32)
    rows.append(r)
    # 4-bit: a minimum that f16 cannot hold (0.1): values just below the f16 minimum
    m = np.float32(0.1)
    m16 = np.float32(np.float16(m))
    r = np.array([m, m + 1.5] + [m16 + (k % 16) * np.float32(0.1) for k in range(dim - 2)],
                 dtype=np.float32)
    rows.append(r)
    weight = np.stack(rows)
    cases = [make_case("ties_44", weight, bag_sets(rng, weight.shape[0]))]
    # the same tie rows cut to 8 columns (8-bit 8-wide path only, n-bit scalar path)
    cases.append(make_case("ties_8", weight[:, :8].copy(), bag_sets(rng, weight.shape[0])))
    return cases


def special_finite_case(rng, dim):
    tiny = np.float32(1e-40)  # subnormal
    rows = [
        np.full(dim, 0.5, np.float32),                      # constant
        np.full(dim, -3.0, np.float32),                     # constant, negative
        np.full(dim, 1000.1, np.float32),                   # constant, not an f16
        np.zeros(dim, np.float32),                          # zeros
        np.full(dim, -0.0, np.float32),                     # all -0.0
        np.array([(-0.0 if k % 2 else 0.0) for k in range(dim)], np.float32),  # +-0
        np.array([(0.0 if k % 2 else -0.0) for k in range(dim)], np.float32),  # -+0
        np.array([(0.0 if k < 8 else -0.0) for k in range(dim)], np.float32),   # +0 then -0
        np.array([-1.0] + [(0.0 if k % 2 else -0.0) for k in range(dim - 1)],
                 np.float32),                               # max over +-0
        np.array([(k % 5) * tiny for k in range(dim)], np.float32),   # subnormals
        np.array([-(k % 3) * tiny for k in range(dim)], np.float32),  # negative subnormals
        np.array([1e-7 * (1 + (k % 4)) for k in range(dim)], np.float32),  # f16 scale underflows
        np.array([1e38 * (1 + (k % 3)) for k in range(dim)], np.float32),  # very large
        np.array([(-3e38 if k % 2 else 3e38) * ((k % 5) / 4.0) for k in range(dim)],
                 np.float32),                                # range overflows f32
        np.array([7e4 * (k % 7) for k in range(dim)], np.float32),  # max above f16's max
        np.array([-7e4] + [1.0] * (dim - 1), np.float32),  # min below f16's lowest
        # f16 rounds the minimum 1000.3 up to 1000.5, above the maximum 1000.33
        np.array([1000.3 + 0.01 * (k % 4) for k in range(dim)], np.float32),
        # ... and here 0.2 above a value in a row whose 4-bit scale is 0.2: q = -1, clamped
        np.array([1000.3 + (k % 4) for k in range(dim)], np.float32),
    ]
    weight = np.stack(rows).astype(np.float32)
    return make_case(f"special_finite_{dim}", weight, bag_sets(rng, weight.shape[0]))


def nonfinite_case(dim):
    inf = np.float32(np.inf)
    nan = np.float32(np.nan)
    base = np.linspace(-1.0, 1.0, dim, dtype=np.float32)

    def with_at(vals):
        r = base.copy()
        for col, v in vals:
            r[col % dim] = v
        return r

    rows = [
        with_at([(1, inf)]),
        with_at([(dim - 1, inf)]),
        with_at([(0, -inf)]),
        with_at([(dim - 1, -inf)]),
        with_at([(0, inf), (dim - 1, -inf)]),
        with_at([(0, nan)]),
        with_at([(dim // 2, nan)]),
        with_at([(dim - 1, nan)]),
        with_at([(36, nan)]),
        np.full(dim, inf, np.float32),
        np.full(dim, -inf, np.float32),
        np.full(dim, nan, np.float32),
        with_at([(2, nan), (3, inf)]),
    ]
    weight = np.stack(rows).astype(np.float32)
    return make_case(f"nonfinite_{dim}", weight, [])


# ---------------------------------------------------------------------------
# Half-precision tables: pytorch_half.json
# ---------------------------------------------------------------------------

HALF = [("f16", torch.float16), ("bf16", torch.bfloat16)]
MODES = ["sum", "mean", "max"]


def half_bag(w, dtype, indices, offsets, include_last, psw):
    """PyTorch's sum, mean and max (and weighted sum) of one bag set over the
    half table `w`, each as u16 bits (or null and the error text)."""
    key = "f16" if dtype == torch.float16 else "bf16"
    idx_t = torch.tensor(indices, dtype=torch.int64)
    off_t = torch.tensor(offsets, dtype=torch.int64)
    bag = {}
    for mode in MODES:
        out, err = attempt(lambda: F.embedding_bag(
            idx_t, w, off_t, mode=mode, include_last_offset=include_last))
        bag[f"{key}_{mode}_bits"] = tensor_u16_bits(out) if out is not None else None
        bag[f"{key}_{mode}_error"] = err
    full, err = attempt(lambda: torch.embedding_bag(
        w, idx_t, off_t, False, 2, False, None, include_last))
    if full is not None:
        # the same op as F.embedding_bag(mode="max"), for its max_indices
        assert tensor_u16_bits(full[0]) == bag[f"{key}_max_bits"]
    bag[f"{key}_max_indices"] = full[3].reshape(-1).tolist() if full is not None else None
    bag[f"{key}_max_indices_error"] = err
    if psw is None:
        bag[f"{key}_weights_bits"] = None
        bag[f"{key}_weighted_sum_bits"] = None
        bag[f"{key}_weighted_sum_error"] = None
    else:
        # PyTorch wants the weights in the table's type
        psw_t = torch.from_numpy(np.asarray(psw, dtype=np.float32).copy()).to(dtype)
        out, err = attempt(lambda: F.embedding_bag(
            idx_t, w, off_t, mode="sum", per_sample_weights=psw_t,
            include_last_offset=include_last))
        bag[f"{key}_weights_bits"] = tensor_u16_bits(psw_t)
        bag[f"{key}_weighted_sum_bits"] = tensor_u16_bits(out) if out is not None else None
        bag[f"{key}_weighted_sum_error"] = err
    return bag


def make_half_case(name, weight, bags, lookup_ids):
    """A case of pytorch_half.json: `bags` as in `make_case` (the weights as
    f32, rounded to each half type here)."""
    weight = np.ascontiguousarray(weight, dtype=np.float32)
    rows, dim = weight.shape
    w32 = torch.from_numpy(weight.copy())
    case = {"name": name, "rows": rows, "dim": dim, "weight_f32_bits": f32_bits(weight)}
    tables = {}
    for key, dtype in HALF:
        tables[key] = w32.to(dtype)
        case[f"{key}_bits"] = tensor_u16_bits(tables[key])
    case["lookup_ids"] = list(lookup_ids)
    for key, dtype in HALF:
        out = F.embedding(torch.tensor(lookup_ids, dtype=torch.int64), tables[key])
        case[f"{key}_lookup_bits"] = tensor_u16_bits(out)
    case["bags"] = []
    for indices, offsets, include_last, psw in bags:
        bag = {
            "indices": list(indices),
            "offsets": list(offsets),
            "include_last_offset": include_last,
            "per_sample_weights_f32_bits": None if psw is None else f32_bits(psw),
        }
        for key, dtype in HALF:
            bag.update(half_bag(tables[key], dtype, indices, offsets, include_last, psw))
        case["bags"].append(bag)
    return case


def from_f32_bits(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def reused_half_case(case, bag_sets):
    """A quantized case's table and its bag sets number `bag_sets`, on half
    tables."""
    rows, dim = case["rows"], case["dim"]
    weight = from_f32_bits(case["weight_f32_bits"]).reshape(rows, dim)
    bags = []
    for k in bag_sets:
        b = case["bags"][k]
        psw = b["per_sample_weights_bits"]
        bags.append((b["indices"], b["offsets"], b["include_last_offset"],
                     None if psw is None else from_f32_bits(psw)))
    # a few looked-up ids: some of the first bag set's, the last row and row 0
    lookup = bags[0][0][:8] + [rows - 1, 0]
    return make_half_case(case["name"], weight, bags, lookup)


def pow2(k):
    """2^k, exactly."""
    return 2.0 ** k


def conversion_edges(rng):
    """Values that test the rounding of f32 to f16 and bf16: exact ties (which go
    to the even neighbour), their f32 neighbours, the overflow thresholds,
    subnormals of both types, NaN payloads, and random bit patterns."""
    f16_edges = [
        # ties: to 1, to 1 + 2^-9, to -1; just above and just below a tie
        1 + pow2(-11), 1 + 3 * pow2(-11), -(1 + pow2(-11)),
        1 + pow2(-11) + pow2(-23), 1 + pow2(-11) - pow2(-23),
        2049, 2051, -2049,
        # the largest f16, below the tie to infinity, the tie (-> inf), beyond
        65504, 65519.99609375, 65520, -65520, 65536, 1e5, 6.1e4,
        # the smallest normal and the ties below it; subnormal ties
        pow2(-14), pow2(-14) - pow2(-25), pow2(-14) - pow2(-24),
        pow2(-24), pow2(-25), 3 * pow2(-25), pow2(-25) + pow2(-40), pow2(-25) - pow2(-40),
        1.5 * pow2(-24), 2.5 * pow2(-24), 1e-8, -1e-8, 5.96e-8,
        0.1, 0.2, 1 / 3, 1000.1,
    ]
    bf16_edges = [
        1 + pow2(-8), 1 + 3 * pow2(-8), -(1 + pow2(-8)),
        1 + pow2(-8) + pow2(-23), 1 + pow2(-8) - pow2(-23),
        257, 259, -257, 3.0e38, 1e38, -1e38,
        # the smallest normal, the smallest bf16 subnormal, subnormal ties
        pow2(-126), pow2(-133), pow2(-134), 3 * pow2(-134), pow2(-134) + pow2(-149),
        1.5 * pow2(-133), 2.5 * pow2(-133), 1e-40, -1e-40, 1e-45, pow2(-149),
    ]
    special_bits = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # +-0, +-inf
        0x7F7FFFFF, 0xFF7FFFFF,  # +-f32 max: bf16 rounds them to infinity
        0x7F7F8000, 0x7F7E8000, 0x7F7F7FFF,  # bf16 ties at the top, and just below
        0x00008000, 0x00018000, 0x00007FFF, 0x80008000,  # bf16 subnormal ties
        0x7FC00000, 0xFFC00000, 0x7FC12345, 0x7F800001, 0xFF800001, 0x7FBFFFFF,  # NaNs
        0x7F801000, 0x7FFFFFFF,
    ]
    values = list(f32_bits(np.array(f16_edges + bf16_edges, dtype=np.float32))) + special_bits
    # random f16 ties: the midpoint of two neighbouring finite f16s (exact in
    # f32) and the f32 values either side of it
    h = rng.integers(0, 0x7BFF, size=96).astype(np.uint16)
    h |= (rng.integers(0, 2, size=96) << 15).astype(np.uint16)
    lo = h.view(np.float16).astype(np.float64)
    hi = (h + 1).astype(np.uint16).view(np.float16).astype(np.float64)
    mid = ((lo + hi) / 2).astype(np.float32)
    for m in mid:
        values += f32_bits([np.nextafter(m, np.float32(-np.inf)), m,
                            np.nextafter(m, np.float32(np.inf))])
    # random bf16 ties: the bf16 bits, then 0x8000, and the f32 values either side
    b = rng.integers(0, 0x7F7F, size=96).astype(np.uint32)
    b |= rng.integers(0, 2, size=96).astype(np.uint32) << 15
    for t in (b << 16) | 0x8000:
        values += [int(t) - 1, int(t), int(t) + 1]
    # random bit patterns (any exponent, NaNs included)
    values += rng.integers(0, 2 ** 32, size=256, dtype=np.uint64).tolist()
    weight = from_f32_bits(values).reshape(-1, 1)
    return make_half_case("conversion_edges", weight, [], [])


def tie_sum_case():
    """Bags whose f32 sums (and means) land exactly halfway between two f16 or
    two bf16 values, so the rounding of PyTorch's half output shows; every
    table value is exact in both f16 and bf16 (but column 8's 32752 in bf16)."""
    tiny16, tiny_bf = pow2(-24), pow2(-133)  # the smallest subnormals
    # bags of rows 0 and 1 sum to f16 ties (columns 0-2, 6; 8 to the tie at
    # 65520, which is infinity), bf16 ties (3-5, 7), and halve subnormals in
    # the mean (9-11)
    r0 = [1, -1, 1, 1, -1, 1, 2048, 256, 32768, tiny16, tiny_bf, 3 * tiny16, -0.0]
    r1 = [pow2(-11), -pow2(-11), 3 * pow2(-11), pow2(-8), -pow2(-8), 3 * pow2(-8), 1, 1,
          32752, 0, 0, 0, -0.0]
    r2 = [-0.0] * 13
    r3 = [0.0] * 13
    r4 = [3 * tiny_bf, -3 * tiny16, tiny16, -tiny_bf, 3, 5, 7, 1, 2, 3, pow2(-12), pow2(-9), 0.5]
    weight = np.array([r0, r1, r2, r3, r4], dtype=np.float32)
    groups = [[0, 1], [1, 0], [0, 1, 1], [0, 3], [2], [2, 2], [3, 2], [], [0], [0, 1, 3],
              [4, 3], [4, 2, 3], [0, 4, 1], [1, 1, 0]]
    indices = [i for g in groups for i in g]
    starts = np.cumsum([0] + [len(g) for g in groups]).tolist()
    n = len(indices)
    # weights of a few magnitudes that keep the weighted sums on ties
    psw = np.array([(0.5, 2.0, 1.0, -1.0, 0.25)[k % 5] for k in range(n)], np.float32)
    bags = [
        (indices, starts[:-1], False, None),
        (indices, starts[:-1], False, psw),
        (indices, starts, True, None),
    ]
    return make_half_case("tie_sums_5x13", weight, bags, [0, 1, 2, 3, 4, 4, 0])


def subnormal_weighted_case():
    """A weighted bag whose f32 products fall below f32's smallest subnormal
    (bf16 values: f16 flushes them to zero): a fused multiply-add and a rounded
    product then add differ by one f32 subnormal, which decides a bf16 tie.
    Column by column: 2^-67 * 2^-67 = 2^-134 (bits 0x8000), then -2^-75 * 2^-74
    = -2^-149 (0x7FFF), then 2^-75 * 2^-75 = 2^-150, half an f32 subnormal:
    fma gives 0x7FFF.8 -> 0x8000, a rounded product gives 0 -> 0x7FFF."""
    dim = 9
    signs = np.array([1, -1] * 4 + [1], np.float32)
    weight = np.stack([signs * pow2(-67), -signs * pow2(-75), signs * pow2(-75)])
    weight = weight.astype(np.float32)
    psw = np.array([pow2(-67), pow2(-74), pow2(-75), pow2(-67), pow2(-74), pow2(-75)], np.float32)
    indices = [0, 1, 2, 2, 1, 0]
    bags = [(indices, [0, 3], False, psw), (indices, [0, 3, 6], True, None)]
    assert weight.shape[1] == dim
    return make_half_case("subnormal_weighted_3x9", weight, bags, [2, 1, 0])


def half_cases(quantized_cases):
    """The half file's cases: conversion edges, tie sums, a subnormal weighted
    bag, some of the quantized cases' tables and bags (widths 1, 7, 8, 17, 130
    and special values), and two tables of their own (widths 13 and 33)."""
    rng = np.random.default_rng(SEED + 1)
    cases = [conversion_edges(rng), tie_sum_case(), subnormal_weighted_case()]
    by_name = {c["name"]: c for c in quantized_cases}
    # bag sets: 0 plain, 2 weighted with include_last_offset, 4 every row reversed
    for name in ("random_1x1", "random_10x7", "random_13x8", "random_9x17",
                 "special_finite_8"):
        cases.append(reused_half_case(by_name[name], [0, 2, 4]))
    # the widest only with its weighted set: a whole bag set of 130 columns is 4
    # x 6 x 130 outputs per type
    cases.append(reused_half_case(by_name["random_12x130"], [2]))
    for rows, dim in ((11, 13), (6, 33)):
        scale = 10.0 ** rng.uniform(-3, 3, size=(rows, 1))
        weight = (rng.standard_normal((rows, dim)) * scale).astype(np.float32)
        all_sets = bag_sets(rng, rows)
        bags = [all_sets[k] for k in (0, 1, 3)]
        cases.append(make_half_case(f"random_{rows}x{dim}", weight, bags,
                                    bags[0][0][:8] + [rows - 1, 0]))
    return cases


def write_json(path, cases):
    header = {
        "torch_version": torch.__version__,
        "script": "tests/data/pytorch_golden.py",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    # One case per line: valid JSON, readable diffs.
    parts = ["{"]
    for k, v in header.items():
        parts.append(f"{json.dumps(k)}: {json.dumps(v)},")
    parts.append('"cases": [')
    parts.append(",\n".join(json.dumps(c, separators=(",", ":"), allow_nan=False) for c in cases))
    parts.append("]}")
    text = "\n".join(parts) + "\n"
    json.loads(text)  # the file must parse
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path}: {len(cases)} cases, {len(text)} bytes", file=sys.stderr)


def main():
    rng = np.random.default_rng(SEED)
    cases = []
    cases += random_cases(rng)
    cases += tie_cases(rng)
    for dim in (44, 8, 3):
        cases.append(special_finite_case(rng, dim))
    for dim in (44, 8, 3):
        cases.append(nonfinite_case(dim))

    write_json(OUT, cases)
    write_json(OUT_HALF, half_cases(cases))


if __name__ == "__main__":
    main()
