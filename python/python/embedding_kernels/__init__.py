"""Fast, bounds-checked, deterministic embedding layers for CPUs.

The NumPy level, from the Rust crate ``embedding-kernels``:

* :func:`embedding`, :func:`embedding_dense_backward`, :func:`embedding_sparse_backward`
* :func:`embedding_bag`, :func:`embedding_bag_backward`, :func:`embedding_bag_sparse_backward`

Arrays are read in place (C-contiguous float32 tables and gradients, int32 or
int64 ids; anything else raises ``ValueError``), every id is checked before
anything is written (an id out of range raises ``IndexError`` naming its
position and value), and the kernels run with the GIL released.

The PyTorch modules, ``Embedding`` and ``EmbeddingBag``, are in
:mod:`embedding_kernels.torch` (which imports torch; this module does not).
"""

from ._native import (
    embedding,
    embedding_bag,
    embedding_bag_backward,
    embedding_bag_sparse_backward,
    embedding_dense_backward,
    embedding_sparse_backward,
)

__all__ = [
    "embedding",
    "embedding_bag",
    "embedding_bag_backward",
    "embedding_bag_sparse_backward",
    "embedding_dense_backward",
    "embedding_sparse_backward",
]
