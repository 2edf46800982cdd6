#!/usr/bin/env python3
"""Check written-down rules against PyTorch's golden file, bit for bit.

Needs numpy only (not PyTorch):

    python tests/data/check_pytorch_rules.py     # reads tests/data/pytorch_quantized.json

Each rule below is a model of what PyTorch 2.15 (FBGEMM's AVX2 code) does,
written in float32 numpy arithmetic; the script counts, per rule, how many rows /
bags of the golden file the model reproduces exactly, and prints the ones it does
not. Competing accumulation formulas for the bag sum are tried side by side.
"""

import json
import os
import sys

import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch_quantized.json")
np.seterr(all="ignore")


def from_bits(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def h2f(u16):
    return np.array(u16, dtype=np.uint16).view(np.float16).astype(np.float32)


def bits_equal(a, b):
    a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    b = np.ascontiguousarray(b, dtype=np.float32).reshape(-1)
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def fma(a, b, c):
    """Correctly rounded float32 a*b + c (elementwise, f32 inputs).

    The product is exact in f64; the f64 sum is rounded once more to f32, which can
    only differ from a single rounding when the f64 sum is inexact and lands exactly
    on a midpoint between two f32 values: that case is fixed from the sign of the
    sum's rounding error (TwoSum)."""
    a, b, c = (np.broadcast_to(np.asarray(v, np.float32), np.broadcast(a, b, c).shape)
               for v in (a, b, c))
    p = a.astype(np.float64) * b.astype(np.float64)
    q = c.astype(np.float64)
    s = p + q
    bb = s - p
    err = (p - (s - bb)) + (q - bb)
    r = s.astype(np.float32)
    up = np.nextafter(r, F32(np.inf))
    down = np.nextafter(r, F32(-np.inf))
    for nb in (up, down):
        mid = (r.astype(np.float64) + nb.astype(np.float64)) / 2
        fix = np.isfinite(s) & (err != 0) & (mid == s)
        toward_nb = (err > 0) == (nb > r)
        r = np.where(fix & toward_nb, nb, r)
    return r.astype(np.float32)


def row_min_max(x):
    """FBGEMM AVX2 min/max: 8 lanes seeded with FLT_MAX / -FLT_MAX, vminps/vmaxps
    (a < b ? a : b, so a NaN or an equal second operand wins), lanes folded in lane
    order with std::min/std::max, then the columns past the last multiple of 8 with
    std::min/std::max (a NaN second operand loses)."""
    d = len(x)
    lo = np.full(8, FLT_MAX, np.float32)
    hi = np.full(8, -FLT_MAX, np.float32)
    for c in range(0, d // 8 * 8, 8):
        v = x[c:c + 8]
        lo = np.where(lo < v, lo, v)
        hi = np.where(hi > v, hi, v)
    mn, mx = FLT_MAX, -FLT_MAX
    tail = x[d // 8 * 8:]
    if d >= 8:
        for v in lo:
            mn = v if v < mn else mn
        for v in hi:
            mx = v if mx < v else mx
    for v in tail:
        mn = v if v < mn else mn
        mx = v if mx < v else mx
    return F32(mn), F32(mx)


def to_int_nan_zero(v):
    """round half to even; NaN and anything out of int32 range -> 0 (cvtps2dq gives
    INT_MIN there, which saturates to 0 in the packs and whose low byte is 0)."""
    ok = np.isfinite(v) & (np.abs(v) < 2.0 ** 31)
    return np.where(ok, np.rint(np.where(ok, v, 0)), 0).astype(np.int64)


def prepack_8bit(x):
    mn, mx = row_min_max(x)
    rng = F32(mx - mn)
    scale = F32(rng / F32(255))
    inv = F32(F32(255) / F32(rng + F32(1e-8)))
    q = to_int_nan_zero(((x - mn).astype(np.float32) * inv).astype(np.float32))
    q = np.clip(q, 0, 255).astype(np.uint8)  # 32-wide: saturating packs; others: low byte
    return q, np.array([scale, mn], np.float32)


def prepack_nbit(x, bits):
    qmax = (1 << bits) - 1
    mn, mx = row_min_max(x)
    bias16 = np.float16(mn)
    mnf = F32(bias16)
    rng = F32(mx - mnf)
    scale = F32(1) if rng == 0 else F32(rng / F32(qmax))
    scale = F32(np.float16(scale))
    if scale == 0:
        scale = F32(1)
    inv = F32(F32(1) / scale)
    if np.isinf(inv):
        scale, inv = F32(1), F32(1)
    v = ((x - mnf).astype(np.float32) * inv).astype(np.float32)
    q = np.clip(to_int_nan_zero(v), 0, qmax).astype(np.uint8)
    per = 8 // bits
    packed = np.zeros((len(x) + per - 1) // per, np.uint8)
    for col, qv in enumerate(q):
        packed[col // per] |= np.uint8(qv << ((col % per) * bits))
    sb = np.array([np.float16(scale), bias16], np.float16).view(np.uint16)
    return packed, sb, q


def unpack_nbit_row(row, dim, bits):
    per = 8 // bits
    nb = (dim + per - 1) // per
    q = np.array([(row[c // per] >> ((c % per) * bits)) & ((1 << bits) - 1) for c in range(dim)],
                 np.float32)
    sb = row[nb:nb + 4].view(np.uint16)
    return q, h2f(sb[0])[()], h2f(sb[1])[()]


BAG_FORMULAS = {
    "fma(w*scale, q, acc + w*bias)":
        lambda acc, w, q, s, b: fma(F32(w * s), q, (acc + F32(w * b)).astype(np.float32)),
    "acc + w*(scale*q + bias)":
        lambda acc, w, q, s, b: (acc + F32(w) * ((F32(s) * q).astype(np.float32) + b)
                                 .astype(np.float32)).astype(np.float32),
    "acc + w*fma(scale, q, bias)":
        lambda acc, w, q, s, b: (acc + (F32(w) * fma(s, q, b)).astype(np.float32))
        .astype(np.float32),
    "fma(w, fma(scale, q, bias), acc)":
        lambda acc, w, q, s, b: fma(w, fma(s, q, b), acc),
    "acc + fma(w*scale, q, w*bias)":
        lambda acc, w, q, s, b: (acc + fma(F32(w * s), q, F32(w * b))).astype(np.float32),
}


def main():
    data = json.load(open(PATH))
    tally = {}
    failures = []

    def count(rule, ok, what):
        t = tally.setdefault(rule, [0, 0])
        t[0] += bool(ok)
        t[1] += 1
        if not ok and len(failures) < 40:
            failures.append(f"{rule}: {what}")

    for c in data["cases"]:
        R, D, name = c["rows"], c["dim"], c["name"]
        W = from_bits(c["weight_f32_bits"]).reshape(R, D)
        # f16: round to nearest even, NaN -> 0x7E00 (F16C); numpy does the same
        f16 = np.array(c["f16_bits"], np.uint16).reshape(R, D)
        count("f16 = round-to-nearest-even (numpy float16)",
              np.array_equal(f16, np.float16(W).view(np.uint16)), name)
        # bf16: round to nearest even on the bits; every NaN -> 0xFFFF
        u = W.view(np.uint32).astype(np.uint64)
        bf = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        bf[np.isnan(W)] = 0xFFFF
        count("bf16 = RNE on the bits, NaN -> 0xFFFF",
              np.array_equal(np.array(c["bf16_bits"], np.uint16).reshape(R, D), bf), name)

        P8 = np.array(c["byte_prepack"], np.uint8).reshape(R, D + 8)
        U8 = from_bits(c["byte_unpack_f32_bits"]).reshape(R, D)
        rows8 = []
        for r in range(R):
            kind = "finite" if np.all(np.isfinite(W[r])) else "non-finite"
            q, sb = prepack_8bit(W[r])
            count(f"8-bit prepack bytes, {kind} rows",
                  np.array_equal(P8[r, :D], q) and bits_equal(P8[r, D:].view(np.float32), sb),
                  f"{name} row {r}")
            s, b = P8[r, D:].view(np.float32)
            qf = P8[r, :D].astype(np.float32)
            count(f"8-bit unpack = fma(q, scale, bias), {kind} rows", bits_equal(U8[r], fma(qf, s, b)),
                  f"{name} row {r}")
            count(f"8-bit unpack = q*scale + bias (two roundings), {kind} rows",
                  bits_equal(U8[r], (qf * s).astype(np.float32) + b), f"{name} row {r}")
            rows8.append((qf, s, b))
        tables = {"byte": rows8}
        for key, bits in (("nbit4", 4), ("nbit2", 2)):
            if c[f"{key}_prepack"] is None:
                count(f"{bits}-bit refused iff dim % {8 // bits} != 0", D % (8 // bits) != 0, name)
                continue
            count(f"{bits}-bit refused iff dim % {8 // bits} != 0", D % (8 // bits) == 0, name)
            per = 8 // bits
            nb = (D + per - 1) // per
            P = np.array(c[f"{key}_prepack"], np.uint8).reshape(R, nb + 4)
            U = from_bits(c[f"{key}_unpack_f32_bits"]).reshape(R, D)
            rows = []
            for r in range(R):
                kind = "finite" if np.all(np.isfinite(W[r])) else "non-finite"
                packed, sb, _ = prepack_nbit(W[r], bits)
                count(f"{bits}-bit prepack bytes, {kind} rows",
                      np.array_equal(P[r, :nb], packed) and np.array_equal(P[r, nb:].view(np.uint16), sb),
                      f"{name} row {r}")
                q, s, b = unpack_nbit_row(P[r], D, bits)
                count(f"{bits}-bit unpack = fma(q, scale, bias), {kind} rows",
                      bits_equal(U[r], fma(q, s, b)), f"{name} row {r}")
                count(f"{bits}-bit unpack = q*scale + bias (two roundings), {kind} rows",
                      bits_equal(U[r], (q * s).astype(np.float32) + b), f"{name} row {r}")
                rows.append((q, s, b))
            tables[key] = rows

        for key, rows in tables.items():
            for bag in c["bags"]:
                out = bag[f"{key}_sum_f32_bits"]
                if out is None:
                    continue
                idx = bag["indices"]
                off = list(bag["offsets"])
                if not bag["include_last_offset"]:
                    off.append(len(idx))
                nbags = len(off) - 1
                out = from_bits(out).reshape(nbags, D)
                psw = bag["per_sample_weights_bits"]
                psw = None if psw is None else from_bits(psw)
                wtag = "weighted" if psw is not None else "unweighted"
                for fname, f in BAG_FORMULAS.items():
                    for order in ("position order", "reverse order"):
                        for bi in range(nbags):
                            pos = list(range(off[bi], off[bi + 1]))
                            if order == "reverse order":
                                pos.reverse()
                            acc = np.zeros(D, np.float32)
                            for p in pos:
                                q, s, b = rows[idx[p]]
                                w = F32(1) if psw is None else psw[p]
                                acc = f(acc, w, q, s, b)
                            count(f"bag {key} {wtag}: acc = {fname}, {order}",
                                  bits_equal(acc, out[bi]), f"{name} bag {bi}")

    width = max(len(k) for k in tally)
    for rule in sorted(tally):
        ok, n = tally[rule]
        mark = "ALL " if ok == n else "    "
        print(f"{mark}{ok:5d}/{n:<5d} {rule}")
    verified = [r for r in tally if "two roundings" not in r and "acc + " not in r
                and "fma(w, fma" not in r and "reverse order" not in r]
    bad = [r for r in verified if tally[r][0] != tally[r][1]]
    print("\nrules claimed as PyTorch's:", "all hold" if not bad else f"FAIL: {bad}")
    for f in failures:
        if any(f.startswith(r) for r in bad):
            print("  ", f)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
