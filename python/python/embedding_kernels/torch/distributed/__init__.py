"""Embedding bag collections, TorchRec's shapes on the crate's bags.

The collection in one process (``EmbeddingBagCollection`` over ``EmbeddingBagConfig``
tables, ``KeyedJaggedTensor`` in, ``KeyedTensor`` out), and sharded over the ranks of a
``torch.distributed`` process group (``shard``, ``plan_shards``): table-wise,
row-wise or replicated, trained through fused optimiser steps; checkpoints that load
into any world size, plan or table format (``save``, ``load``). Tables are float32, or
half or packed (``PackedEmbeddingBag``) for inference.
"""

from ._collection import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    KeyedTensor,
)
from ._packed import PackedEmbeddingBag
from ._sharded import ShardedEmbeddingBagCollection, plan_shards, shard
from ._checkpoint import load, save

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "PackedEmbeddingBag",
    "ShardedEmbeddingBagCollection",
    "load",
    "plan_shards",
    "save",
    "shard",
]
