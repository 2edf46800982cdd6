"""Tables that start on a cache line: empty_table and aligned_table."""

import numpy as np
import pytest

import embedding_kernels as ek
from helpers import (
    HUGE_PAGE,
    huge_bytes_in,
    huge_pages_on_advice,
    kernel_collapses,
    whole_huge_pages,
)


@pytest.mark.parametrize("shape", [7, (3, 5), (1000, 384), (2, 3, 4), (40_000, 33)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8, np.int64])
def test_empty_table_starts_on_a_line(shape, dtype):
    table = ek.empty_table(shape, dtype)
    want = (shape,) if isinstance(shape, int) else shape
    assert table.shape == want
    assert table.dtype == np.dtype(dtype)
    assert table.flags.c_contiguous and table.flags.writeable
    assert table.ctypes.data % 64 == 0
    # Every element is its own memory: writing them all reads back.
    values = (np.arange(table.size) % 200).reshape(want).astype(dtype)
    table[...] = values
    assert np.array_equal(table, values)


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3), ()])
def test_empty_table_takes_empty_and_scalar_shapes(shape):
    table = ek.empty_table(shape)
    assert table.shape == shape and table.dtype == np.float32


@pytest.mark.parametrize("shape", [(-1,), (3, -2)])
def test_empty_table_refuses_negative_extents(shape):
    with pytest.raises(ValueError, match="negative"):
        ek.empty_table(shape)


def test_aligned_table_copies_only_what_is_off_a_line():
    rng = np.random.default_rng(3)
    # Four bytes past wherever NumPy put the buffer: never on a line.
    buffer = rng.standard_normal(2000 * 128 + 1, dtype=np.float32)
    off = buffer[1:].reshape(2000, 128)
    assert off.ctypes.data % 64 != 0 and off.flags.c_contiguous
    copied = ek.aligned_table(off)
    assert copied.ctypes.data % 64 == 0 and copied.flags.c_contiguous
    assert copied.dtype == off.dtype and np.array_equal(copied, off)
    assert not np.shares_memory(copied, off)
    # An array on a line already is returned as it is.
    assert ek.aligned_table(copied) is copied
    # Nested lists become an array too, as with np.asarray.
    assert np.array_equal(ek.aligned_table([[1.0, 2.0]]), np.array([[1.0, 2.0]]))


def test_kernels_give_the_same_bits_on_an_aligned_table():
    rng = np.random.default_rng(5)
    rows, dim, n = 3000, 384, 4096
    plain = rng.standard_normal((rows, dim), dtype=np.float32)
    table = ek.aligned_table(plain)
    assert table.ctypes.data % 64 == 0
    ids = rng.integers(0, rows, n, dtype=np.int64)
    offsets = np.arange(0, n, 16, dtype=np.int64)
    for mode in ("sum", "mean", "max"):
        want, _ = ek.embedding_bag(plain, ids, offsets, mode=mode)
        got, _ = ek.embedding_bag(table, ids, offsets, mode=mode)
        assert want.tobytes() == got.tobytes(), mode
    assert ek.embedding(table, ids).tobytes() == ek.embedding(plain, ids).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint16, np.uint8])
def test_collapse_keeps_every_value(dtype):
    # Twenty huge pages and a bit, beyond the largest block glibc serves from its heap
    # (32 MiB), so fresh pages of their own; made without NumPy's own advice for huge
    # pages and written: 4 KiB pages before the call where the system's setting is
    # `madvise`.
    nbytes = 20 * HUGE_PAGE + 4096
    rng = np.random.default_rng(11)
    values = rng.integers(0, 250, nbytes, dtype=np.uint8).view(dtype).reshape(-1, 64)
    advised = np._core.multiarray._set_madvise_hugepage(False)
    try:
        table = values.copy()
    finally:
        np._core.multiarray._set_madvise_hugepage(advised)
    collapsed = ek.collapse_huge_pages(table)
    assert np.array_equal(table.view(np.uint8), values.view(np.uint8))
    if kernel_collapses() and huge_pages_on_advice():
        assert collapsed
        address = table.ctypes.data
        assert huge_bytes_in(address, table.nbytes) >= whole_huge_pages(address, table.nbytes) > 0
    # Nothing to collapse in less than a whole huge page.
    assert not ek.collapse_huge_pages(np.ones((100, 64), dtype))


def test_collapse_refuses_other_arrays():
    with pytest.raises(ValueError, match="int64"):
        ek.collapse_huge_pages(np.zeros((4, 4), np.int64))
    with pytest.raises(ValueError, match="numpy array"):
        ek.collapse_huge_pages([1.0, 2.0])
    with pytest.raises(ValueError, match="contiguous"):
        ek.collapse_huge_pages(np.zeros((8, 8), np.float32)[:, ::2])
