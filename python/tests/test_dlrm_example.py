"""python/examples/train_dlrm.py: the DLRM-style model trained for a few hundred steps
on 1, 2 and 3 processes with each fused optimiser, a checkpoint of 2 processes resumed
on 3, and the script itself under ``torchrun``."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from embedding_kernels.torch.distributed import EmbeddingBagCollection, load
from test_sharded import free_port, join

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
STEPS = 200
BATCH = 60  # examples a step over all ranks: 30 or 20 a rank
LR = 0.05
# How far a loss of a sharded run may stray from the one-process run's at the same
# step: the ranks' gradients are added in another order (the partial pooled rows of a
# row-wise table, the owners' sums, DDP's all-reduce), rounding differences that the
# training carries along for 200 steps.
TOLERANCE = 1e-5


def example():
    sys.path.insert(0, EXAMPLES)
    try:
        import train_dlrm
    finally:
        sys.path.pop(0)
    return train_dlrm


def runs(rank, world, checkpoint=None, resume_from=None):
    """Each optimiser's losses over steps 1 to STEPS, saving Adagrad's model after half
    of them in ``checkpoint``; given ``resume_from``, also Adagrad's losses from the
    step after that checkpoint's (``"resumed"``)."""
    dlrm = example()
    out = {}
    for name in OPTIMIZERS:
        tables, dense, optimizer, _ = dlrm.build(world, name, LR)
        half = STEPS // 2
        losses = dlrm.train(tables, dense, optimizer, range(1, half + 1), BATCH, rank, world)
        if name == "adagrad" and checkpoint is not None:
            dlrm.save_checkpoint(checkpoint, tables, dense, optimizer, half)
        losses += dlrm.train(tables, dense, optimizer, range(half + 1, STEPS + 1), BATCH, rank, world)
        out[name] = losses
    if resume_from is not None:
        tables, dense, optimizer, _ = dlrm.build(world, "adagrad", LR)
        first = dlrm.resume(resume_from, tables, dense, optimizer) + 1
        out["resumed"] = dlrm.train(tables, dense, optimizer, range(first, STEPS + 1), BATCH, rank, world)
    return out


def worker(rank, world, port, out_dir, checkpoint, resume_from):
    join(rank, world, port)
    try:
        result = runs(rank, world, checkpoint, resume_from)
        torch.save(result, os.path.join(out_dir, f"{world}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_the_model_trains_alike_on_one_two_and_three_processes(tmp_path):
    """Each step's loss over the global batch, on 2 and 3 processes, within TOLERANCE of
    one process's; every rank reports the same losses (they are all-reduced); the loss
    falls; and Adagrad's model saved by 2 processes after half the steps goes on, on 3,
    as the uninterrupted run did."""
    pytest.importorskip("safetensors")
    torch.set_num_threads(1)
    one = runs(0, 1)
    checkpoint = str(tmp_path / "checkpoint")
    mp.spawn(worker, args=(2, free_port(), str(tmp_path), checkpoint, None), nprocs=2)
    mp.spawn(worker, args=(3, free_port(), str(tmp_path), None, checkpoint), nprocs=3)
    for world in (2, 3):
        results = [torch.load(tmp_path / f"{world}-{r}.pt") for r in range(world)]
        for name in OPTIMIZERS:
            curve = torch.tensor(one[name])
            assert curve[-50:].mean() < curve[:50].mean() - 0.01, (name, curve)
            assert all(result[name] == results[0][name] for result in results)
            gap = (torch.tensor(results[0][name]) - curve).abs().max().item()
            assert gap <= TOLERANCE, (world, name, gap)
    resumed = torch.tensor(results[0]["resumed"])
    assert len(resumed) == STEPS - STEPS // 2
    gap = (resumed - torch.tensor(one["adagrad"][STEPS // 2:])).abs().max().item()
    assert gap <= TOLERANCE, gap


def test_the_script_trains_under_torchrun_and_resumes_in_one_process(tmp_path):
    """The script as the README runs it: two processes under ``torchrun`` for 50 steps
    saving the model, then one process going on from that checkpoint to step 100."""
    pytest.importorskip("safetensors")
    script = os.path.join(EXAMPLES, "train_dlrm.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDDING_KERNELS_")}
    checkpoint = str(tmp_path / "checkpoint")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         f"--master_port={free_port()}", script, "--steps", "50", "--batch", "32",
         "--checkpoint", checkpoint],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "2 process(es)" in run.stdout and "step 50: loss" in run.stdout
    # The trained tables: every one moved from where the script started it.
    torch.manual_seed(0)
    single = EmbeddingBagCollection(example().TABLES)
    before = {name: bag.weight.detach().clone() for name, bag in single.embedding_bags.items()}
    load(single, checkpoint)
    for name, bag in single.embedding_bags.items():
        assert not torch.equal(bag.weight, before[name]), name
    run = subprocess.run(
        [sys.executable, script, "--steps", "100", "--batch", "32", "--resume", checkpoint],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "1 process(es)" in run.stdout and "from step 51" in run.stdout
    assert "step 100: loss" in run.stdout and "step 50: loss" not in run.stdout
