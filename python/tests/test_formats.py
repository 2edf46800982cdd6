"""Reduced-precision tables at the NumPy level against PyTorch's packers and quantized bags."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import embedding_kernels as ek

q = torch.ops.quantized
PREPACK = {"int8": q.embedding_bag_byte_prepack, "int4": q.embedding_bag_4bit_prepack}
UNPACK = {"int8": q.embedding_bag_byte_unpack, "int4": q.embedding_bag_4bit_unpack}
BAG = {"int8": q.embedding_bag_byte_rowwise_offsets, "int4": q.embedding_bag_4bit_rowwise_offsets}
OUT_OF_RANGE = "id {value} at position {position} is out of range for a table of {rows} rows"


def table(rows, dim, seed):
    """A float32 table with rows of several ranges; some constant, some with a zero minimum."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, dim, generator=g) * torch.rand(rows, 1, generator=g).mul(10)
    if rows > 2:
        t[1] = 0.75  # a constant row
        t[2] = t[2].abs()  # a row whose minimum may be 0
        t[2, 0] = 0.0
    return t


def bits(a):
    return np.asarray(a).view(np.uint32)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("rows,dim", [(1, 2), (7, 8), (33, 16), (50, 6), (20, 130), (3, 64)])
def test_prepack_is_pytorchs_bytes(fmt, rows, dim):
    w = table(rows, dim, rows * 1000 + dim)
    ours = ek.prepack(w.numpy(), fmt)
    theirs = PREPACK[fmt](w).numpy()
    assert ours.dtype == np.uint8 and ours.shape == theirs.shape
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_dequantize_is_pytorchs_unpack(fmt):
    w = table(40, 24, 5)
    packed = PREPACK[fmt](w)
    ours = ek.dequantize(packed.numpy(), fmt)
    theirs = UNPACK[fmt](packed).numpy()
    assert ours.shape == theirs.shape == (40, 24)
    assert np.array_equal(bits(ours), bits(theirs))
    # An odd width does not fill its last byte: embedding_dim says how many values.
    odd = ek.prepack(w[:, :7].contiguous().numpy(), "int4")
    assert ek.dequantize(odd, "int4", embedding_dim=7).shape == (40, 7)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_packed_bag_sum_is_pytorchs(fmt, include_last_offset, weighted):
    g = torch.Generator().manual_seed(17)
    w = table(60, 32, 9)
    packed = PREPACK[fmt](w)
    ids = torch.randint(0, 60, (90,), generator=g)
    offsets = torch.tensor([0, 0, 5, 30, 31, 64])  # an empty bag first
    if include_last_offset:
        offsets = torch.cat([offsets, torch.tensor([90])])
    weights = torch.rand(90, generator=g) if weighted else None
    theirs = BAG[fmt](
        packed, ids, offsets, mode=0, per_sample_weights=weights, include_last_offset=include_last_offset
    ).numpy()
    ours, max_indices = ek.table_embedding_bag(
        packed.numpy(), ids.numpy(), offsets.numpy(), mode="sum",
        per_sample_weights=None if weights is None else weights.numpy(),
        include_last_offset=include_last_offset, format=fmt,
    )
    assert max_indices is None
    assert np.array_equal(bits(ours), bits(theirs))


@pytest.mark.parametrize("fmt", ["int8", "int4", "int2"])
def test_packed_lookup_mean_and_max_read_dequantized_values(fmt):
    g = torch.Generator().manual_seed(3)
    w = table(25, 12, 4)
    packed = ek.prepack(w.numpy(), fmt)
    dense = torch.from_numpy(ek.dequantize(packed, fmt))
    ids = torch.randint(0, 25, (4, 6), generator=g)
    got = ek.table_embedding(packed, ids.numpy(), format=fmt)
    assert np.array_equal(bits(got), bits(F.embedding(ids, dense).numpy()))
    flat, offsets = ids.reshape(-1), torch.tensor([0, 3, 3, 10])
    out, max_indices = ek.table_embedding_bag(packed, flat.numpy(), offsets.numpy(), mode="max", format=fmt)
    # Max compares the read-back values: PyTorch's max bag over the dequantized table,
    # its values and the ids that won.
    expected, _, _, expected_max = torch.embedding_bag(dense, flat, offsets, False, 2)
    assert np.array_equal(bits(out), bits(expected.numpy()))
    # PyTorch leaves 0 in an empty bag (the second here); ours marks it -1.
    expected_max[1] = -1
    assert max_indices.dtype == np.int64 and np.array_equal(max_indices, expected_max.numpy())
    sums, _ = ek.table_embedding_bag(packed, flat.numpy(), offsets.numpy(), mode="sum", format=fmt)
    means, _ = ek.table_embedding_bag(packed, flat.numpy(), offsets.numpy(), mode="mean", format=fmt)
    counts = np.diff(np.append(offsets.numpy(), flat.numel())).astype(np.float32)
    expected_means = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], 0)
    assert np.array_equal(bits(means), bits(expected_means.astype(np.float32)))


@pytest.mark.parametrize("half", ["f16", "bf16"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_half_tables_are_the_widened_tables(half, mode):
    g = torch.Generator().manual_seed(8)
    w = table(30, 20, 2)
    t = w.half() if half == "f16" else w.bfloat16()
    widened = t.float()
    stored = t.numpy() if half == "f16" else t.view(torch.int16).numpy().view(np.uint16)
    fmt = None if half == "f16" else "bf16"
    ids = torch.randint(0, 30, (40,), generator=g)
    offsets = torch.tensor([0, 7, 7, 21])
    got = ek.table_embedding(stored, ids.numpy(), format=fmt)
    assert np.array_equal(bits(got), bits(F.embedding(ids, widened).numpy()))
    out, _ = ek.table_embedding_bag(stored, ids.numpy(), offsets.numpy(), mode=mode, format=fmt)
    expected = F.embedding_bag(ids, widened, offsets, mode=mode)
    assert np.array_equal(bits(out), bits(expected.numpy()))
    # f16 bits as uint16, said so, are the same table.
    if half == "f16":
        as_bits = ek.table_embedding(stored.view(np.uint16), ids.numpy(), format="f16")
        assert np.array_equal(bits(as_bits), bits(got))


def test_f32_table_is_embedding():
    w = table(10, 5, 1).numpy()
    ids = np.array([[3, 9], [0, 3]])
    assert np.array_equal(bits(ek.table_embedding(w, ids)), bits(ek.embedding(w, ids)))


def canary(shape):
    return np.full(shape, np.nan, dtype=np.float32)


@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16", "int8", "int4"])
def test_out_of_range_ids_name_position_and_value_and_write_nothing(fmt):
    w = table(10, 8, 6)
    stored = {
        "f32": lambda: w.numpy(),
        "f16": lambda: w.half().numpy(),
        "bf16": lambda: w.bfloat16().view(torch.int16).numpy().view(np.uint16),
        "int8": lambda: ek.prepack(w.numpy(), "int8"),
        "int4": lambda: ek.prepack(w.numpy(), "int4"),
    }[fmt]()
    ids = np.array([1, 2, 3, 10])
    out = canary((4, 8))
    with pytest.raises(IndexError, match=OUT_OF_RANGE.format(value=10, position=3, rows=10)):
        ek.table_embedding(stored, ids, format=fmt, out=out)
    assert np.isnan(out).all()
    bag_out = canary((2, 8))
    with pytest.raises(IndexError, match=OUT_OF_RANGE.format(value=-1, position=1, rows=10)):
        ek.table_embedding_bag(stored, np.array([4, -1, 2]), np.array([0, 2]), mode="sum", format=fmt, out=bag_out)
    assert np.isnan(bag_out).all()


def test_bad_arguments_raise_value_error():
    w = table(6, 8, 7).numpy()
    packed = ek.prepack(w, "int8")
    with pytest.raises(ValueError, match='format must be "int8", "int4" or "int2"'):
        ek.prepack(w, "int3")
    with pytest.raises(ValueError, match="needs format="):
        ek.table_embedding(packed, np.array([0]))
    with pytest.raises(ValueError, match="format must be one of"):
        ek.table_embedding(w, np.array([0]), format="fp8")
    with pytest.raises(ValueError, match="must be a uint8"):
        ek.table_embedding(w, np.array([0]), format="int8")
    with pytest.raises(ValueError, match="cannot hold"):
        ek.table_embedding(packed, np.array([0]), format="int8", embedding_dim=9)
    with pytest.raises(ValueError, match="cannot hold"):
        ek.dequantize(packed[:, :5].copy(), "int8")
    with pytest.raises(ValueError, match="does not match"):
        ek.table_embedding(w, np.array([0]), embedding_dim=4)
    with pytest.raises(ValueError, match="2-D"):
        ek.table_embedding(w.reshape(-1), np.array([0]))
    with pytest.raises(ValueError, match="C-contiguous"):
        ek.table_embedding(packed[:, ::2], np.array([0]), format="int4")
    bad = w.copy()
    bad[4, 3] = np.nan
    with pytest.raises(ValueError, match="row 4"):
        ek.prepack(bad, "int4")
    with pytest.raises(ValueError, match="offset"):
        ek.table_embedding_bag(packed, np.array([1, 2]), np.array([1, 0]), format="int8")
    with pytest.raises(ValueError, match="out has shape"):
        ek.table_embedding(packed, np.array([0]), format="int8", out=canary((2, 8)))
