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
"""

import json
import os
import sys

import numpy as np
import torch

SEED = 20240611
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch_quantized.json")
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


def main():
    rng = np.random.default_rng(SEED)
    cases = []
    cases += random_cases(rng)
    cases += tie_cases(rng)
    for dim in (44, 8, 3):
        cases.append(special_finite_case(rng, dim))
    for dim in (44, 8, 3):
        cases.append(nonfinite_case(dim))

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
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {OUT}: {len(cases)} cases, {len(text)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
