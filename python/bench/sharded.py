#!/usr/bin/env python3
"""Throughput of the sharded collection over 1, 2 and 4 processes (gloo, loopback).

Each world size is its own set of processes (spawned here, one after the other), every
rank feeding its own batches; rank 0 prints, per workload and plan, the pooled lookups a
second of the whole world (examples x features / wall time a step, median over steps)
for the forward alone (``torch.no_grad()``) and for forward + backward + fused SGD
update, and the bytes a rank sent per step.

    python python/bench/sharded.py                        # recsys and dlrm, 1, 2 and 4 processes
    python python/bench/sharded.py --procs 2 --workloads dlrm --steps 20
    python python/bench/sharded.py --backend torchrec     # TorchRec's collection, table-wise,
                                                          # in an environment that has it

Workloads: ``recsys``, one table of 1 000 000 x 128 read by one feature, bags of 16
ids, 4096 examples a rank; ``dlrm``, 26 tables of 64 columns from 1 000 to 2 000 000
rows (8 of them over 100 000), one feature each, bags of 1 to 20 ids, 2048 examples a
rank. Plans: ``table_wise`` (``plan_shards`` with nothing replicated or row-wise) and
``row_wise`` (every table). With one process both are the unsharded collection.
``--backend torchrec`` runs TorchRec's ``EmbeddingBagCollection`` under
``DistributedModelParallel``, table-wise, with its fused SGD (FBGEMM's CPU kernel): run
it in an environment with torchrec and fbgemm-gpu-cpu built for its torch.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORKLOADS = {
    "recsys": {"tables": [(1_000_000, 128)], "batch": 4096, "bag": (16, 16)},
    "dlrm": {
        "tables": [(r, 64) for r in (
            2_000_000, 1_500_000, 1_000_000, 800_000, 500_000, 300_000, 200_000, 150_000,
            90_000, 60_000, 40_000, 30_000, 20_000, 15_000, 10_000, 8_000, 6_000, 5_000,
            4_000, 3_000, 2_500, 2_000, 1_500, 1_200, 1_100, 1_000,
        )],
        "batch": 2048,
        "bag": (1, 20),
    },
}
LR = 0.01


def batch_of(workload, generator, kjt_type):
    """One rank's batch: a feature per table, bags of the workload's sizes."""
    spec = WORKLOADS[workload]
    lo, hi = spec["bag"]
    keys, values, lengths = [], [], []
    for t, (rows, _) in enumerate(spec["tables"]):
        n = torch.randint(lo, hi + 1, (spec["batch"],), generator=generator)
        keys.append(f"f{t}")
        lengths.append(n)
        values.append(torch.randint(0, rows, (int(n.sum()),), generator=generator))
    return kjt_type(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))


def ours(workload, plan_name, world):
    from embedding_kernels.torch.distributed import (
        EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, plan_shards, shard,
    )

    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(rows, dim, name=f"t{t}", feature_names=[f"f{t}"])
        for t, (rows, dim) in enumerate(WORKLOADS[workload]["tables"])
    ]
    collection = EmbeddingBagCollection(tables)
    if world == 1:
        for bag in collection.embedding_bags.values():
            bag.sgd_in_backward(LR)
        return collection, KeyedJaggedTensor, lambda: 0
    if plan_name == "row_wise":
        plan = {t.name: "row_wise" for t in tables}
    else:
        plan = plan_shards(collection, world, replicate_below=0, row_wise_above=1 << 62)
    module = shard(collection, plan).sgd_in_backward(LR)
    return module, KeyedJaggedTensor, lambda: module.sent_bytes


def torchrec(workload, plan_name, world):
    """TorchRec's collection, sharded table-wise by its planner, fused SGD."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType

    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(num_embeddings=rows, embedding_dim=dim, name=f"t{t}", feature_names=[f"f{t}"])
        for t, (rows, dim) in enumerate(WORKLOADS[workload]["tables"])
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}
    )
    constraints = {t.name: ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value])
                   for t in tables}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu"), constraints=constraints
    )
    plan = planner.collective_plan(ebc, [sharder], dist.GroupMember.WORLD)
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    return model, KeyedJaggedTensor, lambda: 0


def run(rank, world, port, args, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    rows = []
    try:
        for workload in args.workloads.split(","):
            plans = ["table_wise"] if world == 1 else args.plans.split(",")
            for plan_name in plans:
                if args.backend == "torchrec" and plan_name != "table_wise":
                    continue
                make = ours if args.backend == "ours" else torchrec
                module, kjt_type, sent = make(workload, plan_name, world)
                generator = torch.Generator().manual_seed(1 + rank)
                batches = [batch_of(workload, generator, kjt_type) for _ in range(4)]
                row = {"workload": workload, "plan": plan_name, "world": world,
                       "backend": args.backend}
                for phase in ("forward", "train"):
                    times, before = [], sent()
                    for step in range(args.warmup + args.steps):
                        kjt = batches[step % len(batches)]
                        dist.barrier()
                        t0 = time.perf_counter()
                        if phase == "forward":
                            with torch.no_grad():
                                module(kjt)
                        else:
                            module(kjt).values().sum().backward()
                        dist.barrier()
                        if step >= args.warmup:
                            times.append(time.perf_counter() - t0)
                    step_s = statistics.median(times)
                    lookups = WORKLOADS[workload]["batch"] * len(WORKLOADS[workload]["tables"]) * world
                    row[f"{phase}_lookups_per_s"] = lookups / step_s
                    row[f"{phase}_ms"] = step_s * 1e3
                    row[f"{phase}_sent_bytes_per_step"] = (sent() - before) / (args.warmup + args.steps)
                rows.append(row)
                del module
    finally:
        if rank == 0:
            with open(out, "w") as f:
                json.dump(rows, f)
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", default="1,2,4")
    p.add_argument("--workloads", default="recsys,dlrm")
    p.add_argument("--plans", default="table_wise,row_wise")
    p.add_argument("--backend", choices=["ours", "torchrec"], default="ours")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", metavar="FILE", help="also write every row to FILE")
    args = p.parse_args()
    import tempfile

    results = []
    for world in [int(w) for w in args.procs.split(",")]:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            mp.spawn(run, args=(world, free_port(), args, out.name), nprocs=world)
            with open(out.name) as f:
                results += json.load(f)
    print(f"{'workload':8} {'plan':10} {'procs':>5} {'forward Mlookups/s':>19} "
          f"{'train Mlookups/s':>17} {'sent MB/step':>13}   ({args.backend}; torch {torch.__version__})")
    for r in results:
        print(f"{r['workload']:8} {r['plan']:10} {r['world']:5} "
              f"{r['forward_lookups_per_s'] / 1e6:19.2f} {r['train_lookups_per_s'] / 1e6:17.2f} "
              f"{(r['forward_sent_bytes_per_step'] + r['train_sent_bytes_per_step']) / 2e6:13.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
