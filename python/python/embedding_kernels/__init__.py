"""Fast, bounds-checked, deterministic embedding layers for CPUs.

The NumPy level, from the Rust crate ``embedding-kernels``:

* :func:`embedding`, :func:`embedding_dense_backward`, :func:`embedding_sparse_backward`
* :func:`embedding_sparse_sgd_step`, :func:`embedding_sparse_adagrad_step`: the backward and an
  SGD or Adagrad update fused, on a table (and Adagrad's ``state_sum``) in place
* :func:`embedding_bag`, :func:`embedding_bag_backward`, :func:`embedding_bag_sparse_backward`
* :func:`embedding_bag_sparse_sgd_step`, :func:`embedding_bag_sparse_adagrad_step`: the same
  fused steps for a bag forward's gradient (sum and mean)
* :func:`embedding_sparse_rowwise_adagrad_step`, :func:`embedding_bag_sparse_rowwise_adagrad_step`:
  row-wise Adagrad (one accumulator a row, FBGEMM's ``EXACT_ROWWISE_ADAGRAD``), fused
* reduced-precision tables: :func:`prepack` and :func:`dequantize` (PyTorch's row-wise
  packed int8 / int4 / int2 bytes), :func:`table_embedding` and :func:`table_embedding_bag`
  (the lookup and the bags over f32, f16, bf16, int8, int4 or int2 tables, float32 out)
* :func:`empty_table` and :func:`aligned_table`: tables whose data starts on a 64-byte
  cache line, which the kernels read faster than NumPy's own large arrays (16 bytes into one)
* :func:`collapse_huge_pages`: a table already written moved into 2 MiB pages in place (Linux),
  which spare the kernels a page-table walk on most ids of a large table

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
    embedding_bag_sparse_sgd_step,
    embedding_bag_sparse_adagrad_step,
    embedding_dense_backward,
    embedding_sparse_backward,
    embedding_sparse_sgd_step,
    embedding_sparse_adagrad_step,
    embedding_sparse_rowwise_adagrad_step,
    embedding_bag_sparse_rowwise_adagrad_step,
    prepack,
    dequantize,
    table_embedding,
    table_embedding_bag,
    collapse_huge_pages,
)
from ._tables import aligned_table, empty_table

__all__ = [
    "embedding",
    "embedding_bag",
    "embedding_bag_backward",
    "embedding_bag_sparse_backward",
    "embedding_bag_sparse_sgd_step",
    "embedding_bag_sparse_adagrad_step",
    "embedding_dense_backward",
    "embedding_sparse_backward",
    "embedding_sparse_sgd_step",
    "embedding_sparse_adagrad_step",
    "embedding_sparse_rowwise_adagrad_step",
    "embedding_bag_sparse_rowwise_adagrad_step",
    "prepack",
    "dequantize",
    "table_embedding",
    "table_embedding_bag",
    "empty_table",
    "aligned_table",
    "collapse_huge_pages",
]
