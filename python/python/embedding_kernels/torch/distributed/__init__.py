"""Embedding bag collections, TorchRec's shapes on the crate's bags.

The collection in one process (``EmbeddingBagCollection`` over ``EmbeddingBagConfig``
tables, ``KeyedJaggedTensor`` in, ``KeyedTensor`` out), and sharded over the ranks of a
``torch.distributed`` process group (``shard``, ``plan_shards``): table-wise,
row-wise or replicated, the forward so far.
"""

from ._collection import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    KeyedTensor,
)
from ._sharded import ShardedEmbeddingBagCollection, plan_shards, shard

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "ShardedEmbeddingBagCollection",
    "plan_shards",
    "shard",
]
