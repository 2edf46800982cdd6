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
from helpers import assert_bitwise, assert_within_sum_bound
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


def abs_sums(single, kjt):
    """Per table, its features' pooled ``|weight|`` in float64 (sum pooling, a mean's
    divided alike): the scale of the summation bound."""
    out = {}
    for table in single.embedding_bag_configs():
        weight = single.embedding_bags[table.name].weight.detach().abs().double()
        bag = torch.nn.EmbeddingBag.from_pretrained(
            weight, mode="mean" if table.pooling == "mean" else "sum", include_last_offset=True
        )
        pooled = []
        for feature in table.feature_names:
            k, batch = kjt.keys().index(feature), kjt.stride()
            first, last = int(kjt.offsets()[k * batch]), int(kjt.offsets()[(k + 1) * batch])
            pooled.append(bag(kjt.values()[first:last], kjt.offsets()[k * batch:(k + 1) * batch + 1] - first))
        out[table.name] = torch.cat(pooled, dim=1)
    return out


def join(rank, world, port, timeout_s=60):
    """A worker's process group: gloo over loopback, one intra-op thread."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, plan_names, out_dir):
    join(rank, world, port)
    try:
        results = {}
        for plan_name in plan_names:
            sharded = shard(collection(), PLANS[plan_name](world))
            with torch.no_grad():
                # Ranks feed batches of their own, some bags empty.
                for step in range(3):
                    results[(plan_name, step)] = sharded(features(100 * rank + step)).values()
                # The same batch again: the same bits (no order depends on the schedule).
                results[(plan_name, "again")] = sharded(features(100 * rank)).values()
                if plan_name == "mixed":
                    # A compiled model around it: the exchanges run between its graphs.
                    model = torch.compile(lambda kjt: torch.relu(sharded(kjt).values()) * 2)
                    results["compiled"] = model(features(100 * rank))
                # One rank's bad id: every rank raises, naming it.
                batch = features(7)
                if rank == world - 1:
                    values = batch.values().clone()
                    values[-1] = 1000
                    batch = type(batch)(batch.keys(), values, offsets=batch.offsets())
                try:
                    sharded(batch)
                    results[(plan_name, "error")] = None
                except IndexError as e:
                    results[(plan_name, "error")] = str(e)
        torch.save(results, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_forward_matches_one_process(tmp_path, world):
    """Every plan in one set of processes a world size."""
    mp.spawn(worker, args=(world, free_port(), sorted(PLANS), str(tmp_path)), nprocs=world)
    single = collection()
    results = [torch.load(tmp_path / f"{rank}.pt") for rank in range(world)]
    bounds, start = {}, {}
    at = 0
    for table in single.embedding_bag_configs():
        start[table.name] = at
        at += table.embedding_dim * len(table.feature_names)
    for rank in range(world):
        for step in range(3):
            bounds[(rank, step)] = abs_sums(single, features(100 * rank + step))
    for plan_name in sorted(PLANS):
        plan = PLANS[plan_name](world)
        for rank in range(world):
            for step in range(3):
                want = single(features(100 * rank + step))
                got = results[rank][(plan_name, step)]
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
                            # Partial sums added in rank order: both within the summation
                            # bound of the exact sum (the bag's ids, and the partials).
                            # Bags hold 4 ids at most; the ranks' partials add world - 1
                            # more roundings, a mean's division one.
                            off = cols.start - start[table.name]
                            scale = bounds[(rank, step)][table.name][:, off:off + table.embedding_dim]
                            assert_within_sum_bound(ours, theirs, scale, 4 + world)
            assert_bitwise(results[rank][(plan_name, "again")], results[rank][(plan_name, 0)])
            if plan_name == "mixed":
                want = torch.relu(results[rank][(plan_name, 0)]) * 2
                assert_bitwise(results[rank]["compiled"], want)
            error = results[rank][(plan_name, "error")]
            assert error is not None, (plan_name, rank)
            assert f"rank {world - 1}" in error and "1000" in error


TRAIN_PLANS = {
    "row_wise": {"user": "row_wise", "item": "row_wise", "tag": "row_wise"},
    "mixed": {"user": "row_wise", "item": 0, "tag": "replicated"},
}
STEPS = 25


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
    join(rank, world, port)
    try:
        sharded = shard(train_collection(), TRAIN_PLANS[plan_name])
        if optimizer == "sgd":
            sharded.sgd_in_backward(0.1)
        elif optimizer == "rowwise_adagrad":
            sharded.rowwise_adagrad_in_backward(0.1)
        else:
            sharded.adagrad_in_backward(0.1)
        def loss_of(kjt, target):
            return (sharded(kjt).values() * target).sum()

        if optimizer == "sgd":  # and the SGD run, compiled
            loss_of = torch.compile(loss_of)
        losses = []
        for step in range(STEPS):
            loss = loss_of(features(100 * rank + step), target(rank, step))
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


def checkpoint_worker(rank, world, port, plan_name, directory, out_dir, write):
    """Trains two Adagrad steps and saves (``write``), or loads and reports the shards."""
    from embedding_kernels.torch.distributed import load, save

    join(rank, world, port)
    try:
        sharded = shard(train_collection(), TRAIN_PLANS[plan_name]).adagrad_in_backward(0.1)
        if write:
            for step in range(2):
                sharded(features(100 * rank + step)).values().sum().backward()
            save(sharded, directory)
        else:
            load(sharded, directory)
        shards = {name: bag.weight.detach().clone() for name, bag in sharded.shards.items()}
        state = {name: (s.clone(), t.clone()) for name, (s, t) in sharded._state.items()}
        torch.save({"shards": shards, "state": state}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def assembled(results, plan, name, world):
    """A table from the ranks' shards."""
    if plan[name] == "row_wise":
        return torch.cat([results[r]["shards"][name] for r in range(world)])
    rank = 0 if plan[name] == "replicated" else plan[name]
    return results[rank]["shards"][name]


def test_a_checkpoint_reshards_and_loads_in_one_process(tmp_path):
    pytest.importorskip("safetensors")
    from embedding_kernels.torch.distributed import load, save

    directory = str(tmp_path / "ckpt")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    mp.spawn(checkpoint_worker, args=(2, free_port(), "row_wise", directory, str(tmp_path / "a"), True), nprocs=2)
    written = [torch.load(tmp_path / "a" / f"{r}.pt") for r in range(2)]
    # Into one process: the tables the two ranks held.
    single = train_collection()
    load(single, directory)
    for name, bag in single.embedding_bags.items():
        assert torch.equal(bag.weight.detach(), assembled(written, TRAIN_PLANS["row_wise"], name, 2))
    # Into three processes and another plan: the same tables, and Adagrad's state.
    mp.spawn(checkpoint_worker, args=(3, free_port(), "mixed", directory, str(tmp_path / "b"), False), nprocs=3)
    read = [torch.load(tmp_path / "b" / f"{r}.pt") for r in range(3)]
    for name, bag in single.embedding_bags.items():
        assert torch.equal(assembled(read, TRAIN_PLANS["mixed"], name, 3), bag.weight.detach())
    user_sum = torch.cat([written[r]["state"]["user"][0] for r in range(2)])
    assert torch.equal(torch.cat([read[r]["state"]["user"][0] for r in range(3)]), user_sum)
    assert read[0]["state"]["tag"][1].item() == 2
    # And back: the single process's checkpoint loads as it was saved.
    save(single, str(tmp_path / "again"))
    other = train_collection()
    load(other, str(tmp_path / "again"))
    for name, bag in other.embedding_bags.items():
        assert torch.equal(bag.weight, single.embedding_bags[name].weight)


def test_a_checkpoint_without_its_manifest_is_refused(tmp_path):
    pytest.importorskip("safetensors")
    from embedding_kernels.torch import ArgumentError
    from embedding_kernels.torch.distributed import load, save

    single = train_collection()
    save(single, str(tmp_path))
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(ArgumentError, match="no whole checkpoint"):
        load(train_collection(), str(tmp_path))
    save(single, str(tmp_path))
    (tmp_path / "shard-0-of-1.safetensors").unlink()
    with pytest.raises(ArgumentError, match="misses"):
        load(train_collection(), str(tmp_path))
    with pytest.raises(ArgumentError, match="tables differ"):
        load(collection(), str(tmp_path))


def faulty_worker(rank, world, port, out_dir, fault):
    """After one batch the last rank dies (``fault="die"``) or stops answering
    (``"hang"``); the others run one more batch and write what happened and when."""
    import time

    join(rank, world, port, 20 if fault == "die" else 3)
    sharded = shard(collection(), PLANS["row_wise"](world))
    with torch.no_grad():
        sharded(features(rank))
    if rank == world - 1:
        if fault == "die":
            os._exit(3)  # a rank that dies between two batches
        time.sleep(8)  # alive, but answering nobody
        os._exit(0)
    start = time.monotonic()
    try:
        with torch.no_grad():
            sharded(features(rank + 10))
        outcome = "returned"
    except Exception as e:  # what the survivors raise is gloo's
        outcome = f"raised {type(e).__name__}"
    with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
        f.write(f"{outcome} {time.monotonic() - start:.1f}")
    os._exit(0)  # the group cannot be torn down with a rank gone


def run_faulty(tmp_path, world, fault):
    """Starts the faulty workers and waits for all of them; their exit codes."""
    context = mp.get_context("spawn")
    port = free_port()
    procs = [context.Process(target=faulty_worker, args=(r, world, port, str(tmp_path), fault))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
        assert not p.is_alive()
    return [p.exitcode for p in procs]


def test_a_dead_rank_makes_the_others_raise_not_hang(tmp_path):
    """The survivors' next exchange fails within the process group's timeout (20 s)."""
    world = 3
    assert run_faulty(tmp_path, world, "die")[-1] == 3
    for rank in range(world - 1):
        outcome, seconds = (tmp_path / f"{rank}.txt").read_text().rsplit(" ", 1)
        assert outcome.startswith("raised"), outcome
        assert float(seconds) < 30


def meta_worker(rank, world, port, out_dir):
    import resource

    from embedding_kernels.torch.distributed import EmbeddingBagConfig

    join(rank, world, port)
    try:
        big = EmbeddingBagConfig(num_embeddings=500_000, embedding_dim=256, name="big")
        tables = [big, *train_collection().embedding_bag_configs()]
        meta = EmbeddingBagCollection(tables, device="meta")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        sharded = shard(meta, {"big": "row_wise", **TRAIN_PLANS["mixed"]}, seed=5)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        small = {n: b.weight.detach().clone() for n, b in sharded.shards.items() if n != "big"}
        block = sharded.shards["big"].weight.detach()
        torch.save({"grown": grown, "small": small, "big_rows": block.shape[0],
                    "big_edges": (block[:2].clone(), block[-2:].clone())},
                   os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_a_meta_collection_is_drawn_shard_by_shard(tmp_path):
    """Sharded from the meta device, each rank allocates its rows only (a row-wise table
    of 512 MB over 2 ranks grows each rank by well under 512 MB), and they are the rows
    of the whole collection drawn from the same seed."""
    world = 2
    mp.spawn(meta_worker, args=(world, free_port(), str(tmp_path)), nprocs=world)
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]
    table_bytes = 500_000 * 256 * 4
    for r in range(world):
        assert results[r]["grown"] < 0.7 * table_bytes, results[r]["grown"]
        assert results[r]["big_rows"] == 250_000
    whole = train_collection()
    whole.reset_parameters(seed=5)
    plan = TRAIN_PLANS["mixed"]
    for name, bag in whole.embedding_bags.items():
        got = torch.cat([results[r]["small"][name] for r in range(world)]) if plan[name] == "row_wise" \
            else results[0 if plan[name] == "replicated" else plan[name]]["small"][name]
        assert torch.equal(got, bag.weight.detach()), name
    from embedding_kernels.torch.distributed._collection import draw_rows

    edges = draw_rows("big", 5, 500_000, 249_998, 250_002, 256)
    assert torch.equal(results[0]["big_edges"][1], edges[:2])
    assert torch.equal(results[1]["big_edges"][0], edges[2:])


@pytest.mark.parametrize("world, plan_name", [(2, "mixed")])
def test_sharded_rowwise_adagrad_follows_one_process(tmp_path, world, plan_name):
    """As the SGD and Adagrad runs above, with row-wise Adagrad's accumulators."""
    mp.spawn(train_worker, args=(world, free_port(), plan_name, "rowwise_adagrad", str(tmp_path)),
             nprocs=world)
    single = train_collection()
    for bag in single.embedding_bags.values():
        bag.rowwise_adagrad_in_backward(0.1)
    for step in range(STEPS):
        out = single(global_batch([features(100 * r + step) for r in range(world)]))
        (out.values() * torch.cat([target(r, step) for r in range(world)])).sum().backward()
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]
    plan = TRAIN_PLANS[plan_name]
    for name, bag in single.embedding_bags.items():
        table = assembled(results, plan, name, world)
        torch.testing.assert_close(table, bag.weight.detach(), rtol=1e-5, atol=1e-6)


def test_a_rank_that_stops_answering_makes_the_others_raise_within_the_timeout(tmp_path):
    """A rank alive but silent: the others' next exchange raises once the process
    group's timeout (3 s here) has passed, instead of waiting forever."""
    run_faulty(tmp_path, 2, "hang")
    outcome, seconds = (tmp_path / "0.txt").read_text().rsplit(" ", 1)
    assert outcome.startswith("raised"), outcome
    assert 2.5 < float(seconds) < 7.5, seconds


def packed_worker(rank, world, port, out_dir):
    from embedding_kernels.torch import NotSupportedError
    from test_collection import PACKED_TABLES

    join(rank, world, port)
    try:
        torch.manual_seed(6)
        sharded = shard(EmbeddingBagCollection(PACKED_TABLES), {"user": "row_wise", "item": 0, "tag": "row_wise"})
        with torch.no_grad():
            out = sharded(features(100 * rank)).values()
        try:
            sharded.sgd_in_backward(0.1)
            refused = None
        except NotSupportedError as e:
            refused = str(e)
        torch.save({"out": out, "refused": refused}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_packed_tables_shard_for_inference(tmp_path):
    """int8 (row-wise sum), int4 (table-wise) and int2 (row-wise max) tables over two
    ranks against one process: the table-wise and max columns bit for bit, the row-wise
    sum up to the order of adding the ranks' partial sums; training them is refused."""
    from test_collection import PACKED_TABLES

    mp.spawn(packed_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    torch.manual_seed(6)
    single = EmbeddingBagCollection(PACKED_TABLES)
    for rank in range(2):
        result = torch.load(tmp_path / f"{rank}.pt")
        assert "not float32" in result["refused"]
        want = single(features(100 * rank)).values()
        got = result["out"]
        assert_bitwise(got[:, 8:], want[:, 8:])  # item's two features (int4), tag's max (int2)
        torch.testing.assert_close(got[:, :8], want[:, :8], rtol=1e-6, atol=1e-6)
