#!/usr/bin/env python3
"""A small DLRM-style click model trained with the sharded collection, on synthetic data.

The embedding tables sit in an ``EmbeddingBagCollection`` sharded over the ranks
(row-wise for the large tables, table-wise or replicated for the others, by
``plan_shards``), trained by an optimiser fused into the backward (Adagrad unless
``--optimizer`` says ``sgd`` or ``rowwise_adagrad``); the dense part (a bottom MLP over
13 dense features, the pairwise dot products of its output and the pooled features, a
top MLP) is data-parallel (``DistributedDataParallel``). Each step draws one global
batch of ``--batch`` examples and each rank trains on its share, so the run is the same
model on the same data whatever the number of processes (up to the order of adding the
ranks' gradients); the labels follow a hidden rule of the ids and dense features, so
the loss falls.

    python python/examples/train_dlrm.py                          # one process
    torchrun --nproc_per_node=2 python/examples/train_dlrm.py     # two, over loopback
    torchrun --nnodes=2 --node_rank=0 --master_addr=HOST --nproc_per_node=2 \\
        python/examples/train_dlrm.py                             # across machines

``--checkpoint DIR`` saves the model at the end (the tables with their optimiser state,
the dense part, the step); ``--resume DIR --steps N`` goes on from such a checkpoint to
step ``N``, with any number of processes. After a rank fails, restart every rank from
the last checkpoint.
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


KEYS = ["user", "item", "history", "category", "hour"]


def global_batch(step, size, seed=0):
    """Step ``step``'s synthetic clicks, the same whatever the number of processes: for
    each feature its ids' lengths and values (history: 0 to 20 items), then the dense
    features and the labels."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    counts = {"user": 1, "item": 1, "category": 1, "hour": 1}
    lengths, values = [], []
    for key in KEYS:
        rows = next(t.num_embeddings for t in TABLES if key in t.feature_names)
        n = (torch.full((size,), counts[key]) if key in counts
             else torch.randint(0, 21, (size,), generator=generator))
        lengths.append(n)
        # Skewed ids, as real features are: most draws from the first rows.
        draws = torch.randint(0, rows, (int(n.sum()),), generator=generator)
        values.append(draws % max(1, rows // 10) if key != "hour" else draws)
    dense = torch.randn(size, DENSE, generator=generator)
    # The hidden rule: even items in some hours, with a push from the first dense feature.
    item, hour = values[1], values[4]
    logit = 2.0 * ((item % 2 == 0) & (hour < 50)).float() - 1.0 + dense[:, 0]
    labels = (torch.rand(size, generator=generator) < torch.sigmoid(logit)).float()
    return lengths, values, dense, labels


def local_batch(batch, rank, world):
    """Rank ``rank``'s share of a global batch: examples ``[size·rank/world,
    size·(rank+1)/world)``, as a ``KeyedJaggedTensor``, dense features and labels."""
    lengths, values, dense, labels = batch
    size = len(dense)
    lo, hi = size * rank // world, size * (rank + 1) // world
    mine_lengths, mine_values = [], []
    for n, ids in zip(lengths, values):
        ends = torch.cumsum(n, 0)
        first = int(ends[lo - 1]) if lo > 0 else 0
        last = int(ends[hi - 1]) if hi > 0 else 0
        mine_lengths.append(n[lo:hi])
        mine_values.append(ids[first:last])
    features = KeyedJaggedTensor(KEYS, torch.cat(mine_values), lengths=torch.cat(mine_lengths))
    return features, dense[lo:hi], labels[lo:hi]


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


def _sum_gradients(_state, bucket):
    """A DDP communication hook that sums the ranks' gradients instead of averaging
    them: each rank's loss is already its share of the global batch's mean."""
    future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return future.then(lambda done: done.value()[0])


def build(world, optimizer="adagrad", lr=0.05):
    """The model on this rank: ``(tables, dense, dense_optimizer, plan)``. Every rank
    makes the same tables and dense weights (one seed); with ``world > 1`` the tables
    are sharded by ``plan_shards`` and the dense part wrapped in DDP. ``optimizer``
    (``sgd``, ``adagrad`` or ``rowwise_adagrad``) is fused into the tables' backward; the
    dense part takes ``torch.optim.SGD`` for ``sgd`` and ``torch.optim.Adagrad`` otherwise."""
    torch.manual_seed(0)
    collection = EmbeddingBagCollection(TABLES)
    dense = Dense(sum(len(t.feature_names) for t in TABLES))
    if world > 1:
        plan = plan_shards(collection, world, replicate_below=64 << 10, row_wise_above=4 << 20)
        tables, bags = shard(collection, plan), None
        dense = nn.parallel.DistributedDataParallel(dense)
        dense.register_comm_hook(None, _sum_gradients)
    else:
        plan, tables, bags = None, collection, collection.embedding_bags.values()
    for module in [tables] if bags is None else bags:
        if optimizer == "sgd":
            module.sgd_in_backward(lr)
        elif optimizer == "adagrad":
            module.adagrad_in_backward(lr)
        elif optimizer == "rowwise_adagrad":
            module.rowwise_adagrad_in_backward(lr)
        else:
            raise ValueError(f"unknown optimizer {optimizer!r}")
    make = torch.optim.SGD if optimizer == "sgd" else torch.optim.Adagrad
    return tables, dense, make(dense.parameters(), lr=lr), plan


def train(tables, dense, optimizer, steps, size, rank=0, world=1, report=None):
    """Trains on global batches ``steps`` (a range of step numbers) of ``size``
    examples, this rank's share of each; returns each step's loss over the global
    batch. Each rank's loss is its examples' summed cross-entropy over ``size``: the
    tables' owners sum the ranks' gradients and the dense hook sums them too, so a
    step is the same whatever ``world`` is."""
    losses = []
    for step in steps:
        features, x, labels = local_batch(global_batch(step, size), rank, world)
        logits = dense(x, tables(features).values())
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / size
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        whole = loss.detach().clone()
        if world > 1:
            dist.all_reduce(whole)
        losses.append(whole.item())
        if report is not None:
            report(step, losses)
    return losses


def save_checkpoint(directory, tables, dense, optimizer, step):
    """The tables (`save`: a file a rank, the manifest last) and, from rank 0, the dense
    part, its optimiser and the step, written under a temporary name and renamed before
    the tables' manifest is."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        os.makedirs(directory, exist_ok=True)
        module = dense.module if isinstance(dense, nn.parallel.DistributedDataParallel) else dense
        temporary = os.path.join(directory, ".dense.pt.partial")
        torch.save({"dense": module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                   temporary)
        os.replace(temporary, os.path.join(directory, "dense.pt"))
    save(tables, directory)


def resume(directory, tables, dense, optimizer):
    """Loads a checkpoint of `save_checkpoint`, written by any number of processes;
    returns the step it was written after."""
    load(tables, directory)
    saved = torch.load(os.path.join(directory, "dense.pt"))
    module = dense.module if isinstance(dense, nn.parallel.DistributedDataParallel) else dense
    module.load_state_dict(saved["dense"])
    optimizer.load_state_dict(saved["optimizer"])
    return saved["step"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=512, help="examples a step, over all processes")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--optimizer", default="adagrad", choices=["sgd", "adagrad", "rowwise_adagrad"])
    p.add_argument("--checkpoint", help="save the model here at the end")
    p.add_argument("--resume", help="start from this checkpoint (of any number of processes)")
    args = p.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    tables, dense, optimizer, plan = build(world, args.optimizer, args.lr)
    first = resume(args.resume, tables, dense, optimizer) + 1 if args.resume else 1
    if rank == 0:
        print(f"{world} process(es); plan {plan}; from step {first}")

    start = time.monotonic()

    def report(step, losses):
        if rank == 0 and step % 50 == 0:
            rate = len(losses) * args.batch / (time.monotonic() - start)
            print(f"step {step}: loss {sum(losses[-50:]) / len(losses[-50:]):.4f} ({rate:,.0f} examples/s)")

    train(tables, dense, optimizer, range(first, args.steps + 1), args.batch, rank, world, report)
    if args.checkpoint:
        save_checkpoint(args.checkpoint, tables, dense, optimizer, args.steps)
        if rank == 0:
            print(f"model saved in {args.checkpoint}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
