"""Tables that start on a cache line.

NumPy places a large array's data 16 bytes past the start of a 64-byte cache line
(glibc's ``malloc`` header before ``mmap``-ed memory). A table there has every row of a
whole number of lines (384 float32 values, 1 536 bytes, say) straddle one line more than
it needs, and a 64-byte load of it cross two lines: the kernels read more lines than
the rows hold (docs/design.md, "Memory: huge pages and aligned tables"). PyTorch's
tensors already start on a line, so the modules of :mod:`embedding_kernels.torch` need
none of this.
"""

import operator

import numpy as np

# Bytes in a cache line on the CPUs the kernels are tuned for.
_LINE = 64


def empty_table(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` and ``dtype`` (float32 by default)
    whose data starts on a 64-byte cache line, as ``numpy.empty`` makes one otherwise.

    Large ones (4 MB and more) are in huge pages where NumPy asks for them, as its own
    arrays are. Fill it in place (``table[...] = values``) or use :func:`aligned_table`."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    count = 1
    for extent in shape:
        extent = operator.index(extent)
        if extent < 0:
            raise ValueError(f"negative dimensions are not allowed, got shape {shape}")
        count *= extent
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        # No data to place.
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + _LINE, dtype=np.uint8)
    skip = -raw.ctypes.data % _LINE
    # A view of `raw`, which it keeps alive.
    return raw[skip : skip + nbytes].view(dtype).reshape(shape)


def aligned_table(array) -> np.ndarray:
    """``array`` itself when it is a C-contiguous NumPy array starting on a 64-byte cache
    line, else a copy of it (same shape, same dtype) in an :func:`empty_table`, as
    ``numpy.ascontiguousarray`` returns its argument when it is contiguous already."""
    array = np.asarray(array)
    if array.flags.c_contiguous and array.ctypes.data % _LINE == 0:
        return array
    table = empty_table(array.shape, array.dtype)
    table[...] = array
    return table
