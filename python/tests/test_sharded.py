"""The sharded collection's forward over 2 and 3 processes (gloo on 127.0.0.1),
against the single-process collection on each rank's own batch."""

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from embedding_kernels.torch.distributed import EmbeddingBagCollection, shard
from helpers import assert_bitwise
from test_collection import TABLES, features

PLANS = {
    "table_wise": lambda world: {"user": 0, "item": world - 1, "tag": 1 % world},
    "row_wise": lambda world: {"user": "row_wise", "item": "row_wise", "tag": "row_wise"},
    "mixed": lambda world: {"user": "row_wise", "item": 0, "tag": "replicated"},
}


def collection():
    """The same tables on every rank: one seed."""
    torch.manual_seed(11)
    return EmbeddingBagCollection(TABLES)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, plan_name, out_dir):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        sharded = shard(collection(), PLANS[plan_name](world))
        results = {}
        with torch.no_grad():
            # Ranks feed batches of their own, some bags empty.
            for step in range(3):
                results[step] = sharded(features(100 * rank + step)).values()
            # One rank's bad id: every rank raises, naming it.
            batch = features(7)
            if rank == world - 1:
                values = batch.values().clone()
                values[-1] = 1000
                batch = type(batch)(batch.keys(), values, offsets=batch.offsets())
            try:
                sharded(batch)
                results["error"] = None
            except IndexError as e:
                results["error"] = str(e)
        torch.save(results, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "world, plan_name", [(2, "table_wise"), (2, "row_wise"), (3, "row_wise"), (3, "mixed")]
)
def test_sharded_forward_matches_one_process(tmp_path, world, plan_name):
    mp.spawn(worker, args=(world, free_port(), plan_name, str(tmp_path)), nprocs=world)
    single = collection()
    plan = PLANS[plan_name](world)
    for rank in range(world):
        results = torch.load(tmp_path / f"{rank}.pt")
        for step in range(3):
            want = single(features(100 * rank + step))
            got = results[step]
            at = 0
            for table in single.embedding_bag_configs():
                for _ in table.feature_names:
                    cols = slice(at, at + table.embedding_dim)
                    at += table.embedding_dim
                    ours, theirs = got[:, cols], want.values()[:, cols].detach()
                    if plan[table.name] != "row_wise" or table.pooling == "max":
                        # Whole tables and maxima: the same bits.
                        assert_bitwise(ours.contiguous(), theirs.contiguous())
                    else:
                        # Partial sums added in rank order: a few roundings apart.
                        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
        assert results["error"] is not None, rank
        assert f"rank {world - 1}" in results["error"] and "1000" in results["error"]


TRAIN_PLANS = {
    "row_wise": {"user": "row_wise", "item": "row_wise", "tag": "row_wise"},
    "mixed": {"user": "row_wise", "item": 0, "tag": "replicated"},
}
STEPS = 4


def train_collection():
    """Sum and mean tables (max tables serve inference only)."""
    from embedding_kernels.torch.distributed import EmbeddingBagConfig

    torch.manual_seed(12)
    tables = [
        TABLES[0],
        TABLES[1],
        EmbeddingBagConfig(num_embeddings=20, embedding_dim=6, name="tag", pooling="sum"),
    ]
    return EmbeddingBagCollection(tables)


def target(rank, step):
    return torch.randn(5, 22, generator=torch.Generator().manual_seed(1000 * rank + step))


def global_batch(kjts):
    """The ranks' batches as one, example after example in rank order."""
    keys, parts, lengths = kjts[0].keys(), [], []
    for k in range(len(keys)):
        for kjt in kjts:
            batch, bounds = kjt.stride(), kjt.offsets()
            parts.append(kjt.values()[bounds[k * batch]:bounds[(k + 1) * batch]])
            lengths.append(kjt.lengths()[k * batch:(k + 1) * batch])
    return type(kjts[0])(keys, torch.cat(parts), lengths=torch.cat(lengths))


def train_worker(rank, world, port, plan_name, optimizer, out_dir):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        sharded = shard(train_collection(), TRAIN_PLANS[plan_name])
        if optimizer == "sgd":
            sharded.sgd_in_backward(0.1)
        else:
            sharded.adagrad_in_backward(0.1)
        losses = []
        for step in range(STEPS):
            loss = (sharded(features(100 * rank + step)).values() * target(rank, step)).sum()
            loss.backward()
            losses.append(loss.item())
        shards = {name: bag.weight.detach().clone() for name, bag in sharded.shards.items()}
        torch.save({"losses": losses, "shards": shards}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world, plan_name, optimizer", [
    (2, "row_wise", "sgd"), (3, "mixed", "adagrad"),
])
def test_sharded_training_follows_one_process(tmp_path, world, plan_name, optimizer):
    """Data-parallel batches on the ranks against one process stepping on their union:
    the same losses and tables up to the order of adding the ranks' gradients."""
    mp.spawn(train_worker, args=(world, free_port(), plan_name, optimizer, str(tmp_path)),
             nprocs=world)
    single = train_collection()
    for bag in single.embedding_bags.values():
        if optimizer == "sgd":
            bag.sgd_in_backward(0.1)
        else:
            bag.adagrad_in_backward(0.1)
    losses = []
    for step in range(STEPS):
        out = single(global_batch([features(100 * r + step) for r in range(world)]))
        targets = torch.cat([target(r, step) for r in range(world)])
        loss = out.values() * targets
        losses.append([loss[5 * r:5 * (r + 1)].sum().item() for r in range(world)])
        loss.sum().backward()
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]
    for r in range(world):
        assert results[r]["losses"] == pytest.approx([l[r] for l in losses], rel=1e-5, abs=1e-5)
    plan = TRAIN_PLANS[plan_name]
    for name, bag in single.embedding_bags.items():
        if plan[name] == "row_wise":
            table = torch.cat([results[r]["shards"][name] for r in range(world)])
        elif plan[name] == "replicated":
            table = results[0]["shards"][name]
            for r in range(1, world):
                assert torch.equal(results[r]["shards"][name], table)  # replicas stay equal
        else:
            table = results[plan[name]]["shards"][name]
        torch.testing.assert_close(table, bag.weight.detach(), rtol=1e-5, atol=1e-6)
        assert not torch.equal(table, train_collection().embedding_bags[name].weight), name
