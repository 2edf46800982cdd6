#!/usr/bin/env python3
"""A small DLRM-style click model trained with the sharded collection, on synthetic data.

The embedding tables sit in an ``EmbeddingBagCollection`` sharded over the ranks
(row-wise for the large tables, table-wise or replicated for the others, by
``plan_shards``), trained by Adagrad fused into the backward; the dense part (a bottom
MLP over 13 dense features, the pairwise dot products of its output and the pooled
features, a top MLP) is data-parallel (``DistributedDataParallel``). Each rank draws its
own batches; the labels follow a hidden rule of the ids and dense features, so the loss
falls.

    python python/examples/train_dlrm.py                          # one process
    torchrun --nproc_per_node=2 python/examples/train_dlrm.py     # two, over loopback
    torchrun --nnodes=2 --node_rank=0 --master_addr=HOST --nproc_per_node=2 \\
        python/examples/train_dlrm.py                             # across machines

``--checkpoint DIR`` saves the tables at the end; ``--resume DIR`` starts from such a
checkpoint, written by any number of processes.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from embedding_kernels.torch.distributed import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    load,
    plan_shards,
    save,
    shard,
)

TABLES = [
    EmbeddingBagConfig(num_embeddings=200_000, embedding_dim=16, name="user", feature_names=["user"]),
    EmbeddingBagConfig(num_embeddings=50_000, embedding_dim=16, name="item", feature_names=["item", "history"]),
    EmbeddingBagConfig(num_embeddings=1_000, embedding_dim=16, name="category", pooling="mean"),
    EmbeddingBagConfig(num_embeddings=100, embedding_dim=16, name="hour"),
]
DENSE = 13


def batch(generator, size):
    """Synthetic clicks: ids per feature (history: 0 to 20 items), dense features, labels."""
    keys = ["user", "item", "history", "category", "hour"]
    counts = {"user": 1, "item": 1, "category": 1, "hour": 1}
    lengths, values = [], []
    for key in keys:
        rows = next(t.num_embeddings for t in TABLES if key in t.feature_names)
        n = (torch.full((size,), counts[key]) if key in counts
             else torch.randint(0, 21, (size,), generator=generator))
        lengths.append(n)
        # Skewed ids, as real features are: most draws from the first rows.
        draws = torch.randint(0, rows, (int(n.sum()),), generator=generator)
        values.append(draws % max(1, rows // 10) if key != "hour" else draws)
    dense = torch.randn(size, DENSE, generator=generator)
    features = KeyedJaggedTensor(keys, torch.cat(values), lengths=torch.cat(lengths))
    # The hidden rule: even items in some hours, with a push from the first dense feature.
    item, hour = values[1], values[4]
    logit = 2.0 * ((item % 2 == 0) & (hour < 50)).float() - 1.0 + dense[:, 0]
    labels = (torch.rand(size, generator=generator) < torch.sigmoid(logit)).float()
    return features, dense, labels


class Dense(nn.Module):
    """Bottom MLP, pairwise interactions, top MLP."""

    def __init__(self, num_features: int, dim: int = 16) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(DENSE, 32), nn.ReLU(), nn.Linear(32, dim), nn.ReLU())
        pairs = (num_features + 1) * num_features // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 32), nn.ReLU(), nn.Linear(32, 1))
        self.dim = dim

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        stacked = torch.cat([x[:, None], pooled.reshape(len(x), -1, self.dim)], dim=1)
        dots = stacked @ stacked.transpose(1, 2)
        i, j = torch.triu_indices(stacked.shape[1], stacked.shape[1], offset=1)
        return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=256, help="examples a rank a step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint", help="save the tables here at the end")
    p.add_argument("--resume", help="load the tables from this checkpoint first")
    args = p.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)  # the same tables and dense weights on every rank
    collection = EmbeddingBagCollection(TABLES)
    if distributed:
        plan = plan_shards(collection, world, replicate_below=64 << 10, row_wise_above=4 << 20)
        tables = shard(collection, plan)
    else:
        plan, tables = None, collection
    if args.resume:
        load(tables, args.resume)
    if distributed:
        tables.adagrad_in_backward(lr=args.lr)
    else:
        for bag in collection.embedding_bags.values():
            bag.adagrad_in_backward(lr=args.lr)
    features = sum(len(t.feature_names) for t in TABLES)
    dense = Dense(features)
    if distributed:
        dense = nn.parallel.DistributedDataParallel(dense)
    optimizer = torch.optim.Adagrad(dense.parameters(), lr=args.lr)
    if rank == 0:
        print(f"{world} process(es); plan {plan}")

    generator = torch.Generator().manual_seed(1 + rank)
    start, recent = time.monotonic(), []
    for step in range(1, args.steps + 1):
        kjt, x, labels = batch(generator, args.batch)
        logits = dense(x, tables(kjt).values())
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recent.append(loss.item())
        if rank == 0 and step % 50 == 0:
            rate = step * args.batch * world / (time.monotonic() - start)
            print(f"step {step}: loss {sum(recent) / len(recent):.4f} ({rate:,.0f} examples/s)")
            recent = []
    if args.checkpoint:
        save(tables, args.checkpoint)
        if rank == 0:
            print(f"tables saved in {args.checkpoint}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
