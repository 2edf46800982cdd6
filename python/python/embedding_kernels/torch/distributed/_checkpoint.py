"""Checkpoints of a collection, sharded or not: one safetensors file a rank, and a
manifest written last.

``save(module, directory)`` writes, on every rank, ``shard-<rank>-of-<world>.safetensors``
with the tables (or blocks of rows) the rank holds and their fused optimiser's state
(Adagrad's or row-wise Adagrad's accumulators, in one process or sharded), each file
written under a temporary name and renamed once whole; after a barrier, rank 0 writes
``manifest.json`` (the plan, the world size, the tables and each file's row blocks),
again through a rename. A checkpoint without its manifest is not one: a rank that
failed while saving leaves none, and ``load`` refuses it. ``load(module, directory)``
reads, for each table block the module holds, the rows it needs from whichever files
hold them (``safe_open`` slices: a rank reads its rows, not the table), so a checkpoint
loads into another world size or plan, or into the single-process collection, and back;
and into tables of another format (a float32 checkpoint into half or packed tables for
inference: rows packed as they are read).
"""

import json
import os
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

from .._errors import ArgumentError
from ._collection import EmbeddingBagCollection
from ._packed import PACKED, PackedEmbeddingBag, pack, unpack
from ._sharded import ShardedEmbeddingBagCollection, _rows_of

MANIFEST = "manifest.json"


def _safetensors():
    try:
        import safetensors.torch
        from safetensors import safe_open
    except ImportError as e:  # an optional dependency: pip install safetensors
        raise ImportError("checkpoints need the safetensors package: pip install safetensors") from e
    return safetensors.torch, safe_open


def _held(module) -> Tuple[int, int, Dict[str, object], Dict[str, Tuple[int, int]], dict]:
    """``(rank, world, plan, blocks, tensors)`` of a module: the rows of each table it
    holds (``blocks``) and the tensors to save."""
    if isinstance(module, EmbeddingBagCollection):
        tables = module.embedding_bag_configs()
        plan = {t.name: 0 for t in tables}
        blocks = {t.name: (0, t.num_embeddings) for t in tables}
        tensors = {}
        for t in tables:
            bag = module.embedding_bags[t.name]
            if isinstance(bag, PackedEmbeddingBag):
                tensors[f"{t.name}.weight"] = bag.packed
                continue
            tensors[f"{t.name}.weight"] = bag.weight.detach()
            adagrad, rowwise = bag.adagrad_state(), bag.rowwise_adagrad_state()
            if adagrad is not None:
                tensors[f"{t.name}.state_sum"] = adagrad["sum"]
                tensors[f"{t.name}.state_step"] = adagrad["step"].reshape(1)
            elif rowwise is not None:
                tensors[f"{t.name}.state_sum"] = rowwise
        return 0, 1, plan, blocks, tensors
    if not isinstance(module, ShardedEmbeddingBagCollection):
        raise ArgumentError(f"save and load take an EmbeddingBagCollection or a sharded one, got {type(module).__name__}")
    blocks, tensors = {}, {}
    for table in module._tables:
        if table.name not in module.shards:
            continue
        place = module.plan[table.name]
        if place == "row_wise":
            blocks[table.name] = _rows_of(module.rank, table.num_embeddings, module.world)
        else:
            blocks[table.name] = (0, table.num_embeddings)
        shard = module.shards[table.name]
        tensors[f"{table.name}.weight"] = (
            shard.packed if isinstance(shard, PackedEmbeddingBag) else shard.weight.detach()
        )
        state = module._state.get(table.name)
        if state is not None:
            tensors[f"{table.name}.state_sum"] = state[0]
            tensors[f"{table.name}.state_step"] = state[1].reshape(1)
    return module.rank, module.world, module.plan, blocks, tensors


def _tables_of(module) -> List[dict]:
    tables = module.embedding_bag_configs() if isinstance(module, EmbeddingBagCollection) else module._tables
    return [{"name": t.name, "num_embeddings": t.num_embeddings, "embedding_dim": t.embedding_dim,
             "pooling": t.pooling, "format": t.format} for t in tables]


def _shapes(tables: List[dict]) -> List[dict]:
    """What a checkpoint's tables must share with a module's: all but the format, which
    a load converts."""
    return [{k: v for k, v in t.items() if k != "format"} for t in tables]


def _converted(rows, saved: str, wanted: str, dim: int):
    """Rows read from a checkpoint of format ``saved`` in format ``wanted``: packed rows
    packed or read back as needed; float rows as they are (``copy_`` casts them)."""
    if saved == wanted or (saved not in PACKED and wanted not in PACKED):
        return rows
    values = unpack(rows, saved, dim) if saved in PACKED else rows
    return pack(values, wanted) if wanted in PACKED else values


def save(module, directory: str, process_group=None) -> None:
    """Writes ``module``'s checkpoint into ``directory`` (made if missing). Every rank of a
    sharded collection calls it; the manifest is written once every rank's file is."""
    st, _ = _safetensors()
    os.makedirs(directory, exist_ok=True)
    rank, world, plan, blocks, tensors = _held(module)
    name = f"shard-{rank}-of-{world}.safetensors"
    meta = {"blocks": json.dumps(blocks), "rank": str(rank), "world": str(world)}
    temporary = os.path.join(directory, f".{name}.partial")
    st.save_file({k: v.contiguous() for k, v in tensors.items()}, temporary, metadata=meta)
    os.replace(temporary, os.path.join(directory, name))
    if world > 1:
        group = module.group if process_group is None else process_group
        dist.barrier(group=group)
    if rank == 0:
        manifest = {"world": world, "plan": plan, "tables": _tables_of(module)}
        temporary = os.path.join(directory, f".{MANIFEST}.partial")
        with open(temporary, "w") as f:
            json.dump(manifest, f)
        os.replace(temporary, os.path.join(directory, MANIFEST))


def load(module, directory: str) -> None:
    """Fills ``module``'s tables (and optimiser state, where both have it) from the
    checkpoint in ``directory``, whatever world size and plan wrote it. Raises
    ``ArgumentError`` for a directory without a whole checkpoint or with other tables."""
    _, safe_open = _safetensors()
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        raise ArgumentError(f"{directory} holds no whole checkpoint (no {MANIFEST})")
    with open(path) as f:
        manifest = json.load(f)
    ours = _tables_of(module)
    if _shapes(manifest["tables"]) != _shapes(ours):
        raise ArgumentError(f"the checkpoint's tables differ from the module's: {manifest['tables']}")
    formats = {t["name"]: (t.get("format", "f32"), o["format"], t["embedding_dim"])
               for t, o in zip(manifest["tables"], ours)}
    world = manifest["world"]
    files = [os.path.join(directory, f"shard-{r}-of-{world}.safetensors") for r in range(world)]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise ArgumentError(f"the checkpoint misses {missing}")
    _, _, _, blocks, tensors = _held(module)
    # Every file's state checked against the module's before anything is written: a
    # checkpoint of Adagrad (a sum a value) does not load into row-wise Adagrad (a sum a row).
    for file in files:
        with safe_open(file, framework="pt") as source:
            for key in set(tensors) & set(source.keys()):
                saved = source.get_slice(key).get_shape()[1:]
                if key.endswith(".state_sum") and list(saved) != list(tensors[key].shape[1:]):
                    raise ArgumentError(
                        f"{key}: the checkpoint's optimiser keeps {saved} a row, the module's "
                        f"{list(tensors[key].shape[1:])}: not the same optimiser"
                    )
    with torch.no_grad():
        for file in files:
            with safe_open(file, framework="pt") as source:
                held = json.loads(source.metadata()["blocks"])
                for table, (first, end) in blocks.items():
                    if table not in held:
                        continue
                    start, stop = held[table]
                    lo, hi = max(first, start), min(end, stop)
                    if lo >= hi:
                        continue
                    for kind in ("weight", "state_sum"):
                        key = f"{table}.{kind}"
                        if key in tensors and key in source.keys():
                            rows = source.get_slice(key)[lo - start:hi - start]
                            if kind == "weight":
                                rows = _converted(rows, *formats[table])
                            tensors[key][lo - first:hi - first].copy_(rows)
                    key = f"{table}.state_step"
                    if key in tensors and key in source.keys():
                        tensors[key].copy_(source.get_tensor(key))
