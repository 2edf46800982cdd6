"""The collection sharded over ``torch.distributed``: the plan and the forward.

A plan places each table of a collection: **table-wise** on one rank (an ``int``),
**row-wise** (``"row_wise"``: rank ``r`` holds the contiguous block of rows
``[r * k, (r + 1) * k)``, ``k = ceil(rows / world)``) or **replicated**
(``"replicated"``: every rank holds it). Every rank feeds its own batch (the same
number of examples on each); the ids of a routed table go to the ranks that hold
their rows, which pool them and send the pooled rows back:

1. each rank checks its ids, buckets them by owner (the extension's ``bucket_rows``,
   one pass to count and one to place, stable: a bag's ids keep their order) and
   sends every owner the bags' lengths with its first bad id if any (on which every
   rank raises alike), then the ids (``all_to_all_single``);
2. each owner pools what it received with its shard (a row-wise table's sum and mean
   as sums, its max as a max);
3. the pooled rows go back (``all_to_all_single``), and each rank combines a row-wise
   table's partial rows in rank order: sums added, a mean divided by the whole bag's
   count, a max the largest of the ranks that held any of the bag's ids.

Table-wise and replicated tables give the single-process bits; a row-wise sum adds
its partial sums in rank order (equal up to that order), its max is exact (ties
between ranks go to the lower rank). The collective calls are the same on every
rank whatever its batch holds, so none is left waiting.
"""

import itertools
import math
from typing import Dict, List, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ... import _native
from .. import EmbeddingBag, _check_rates
from .. import _ops, _steps
from .._arrays import _array
from .._errors import ArgumentError, NotSupportedError
from .._ops import _bag
from ._collection import EmbeddingBagCollection, _keyed_tensor, draw_rows
from ._packed import PACKED, PackedEmbeddingBag, pack

# A table's place in a plan: a rank (table-wise), "row_wise" or "replicated".
Placement = Union[int, str]


def plan_shards(collection: EmbeddingBagCollection, world_size: int,
                replicate_below: int = 1 << 20, row_wise_above: int = 64 << 20) -> Dict[str, Placement]:
    """A plan that balances table bytes per rank: tables under ``replicate_below``
    bytes replicated, over ``row_wise_above`` bytes row-wise, the rest table-wise,
    largest first, each on the rank holding the fewest bytes so far."""
    plan: Dict[str, Placement] = {}
    held = [0] * world_size
    tables = sorted(
        collection.embedding_bag_configs(),
        key=lambda t: -t.num_embeddings * t.embedding_dim,
    )
    for table in tables:
        size = table.num_embeddings * table.embedding_dim * 4
        if size < replicate_below:
            plan[table.name] = "replicated"
        elif size > row_wise_above or world_size == 1:
            plan[table.name] = "row_wise" if world_size > 1 else 0
            held = [h + size // world_size for h in held]
        else:
            rank = min(range(world_size), key=lambda r: held[r])
            plan[table.name] = rank
            held[rank] += size
    return plan


def _offsets(lengths: Tensor) -> Tensor:
    """Bag offsets from bag lengths, the last one ending the last bag."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return offsets


def _joined(parts):
    """Bags given as ``(ids, lengths, weights)`` parts, one after the other:
    ``(ids, offsets, weights or None)``."""
    ids = torch.cat([p[0] for p in parts])
    offsets = _offsets(torch.cat([p[1] for p in parts]))
    weights = None if parts[0][2] is None else torch.cat([p[2] for p in parts])
    return ids, offsets, weights


def _rows_of(rank: int, rows: int, world: int):
    """Rank ``rank``'s block of a row-wise table: ``(first, end)``."""
    per = math.ceil(rows / world)
    return min(rank * per, rows), min((rank + 1) * per, rows)


# The length of a rank's bad-id record: rank, table, feature, position, value.
_RECORD = 5


def _raise_first_bad(tables, records: Tensor) -> None:
    """Raises ``IndexError`` for the lowest rank's bad id among every rank's records
    (``[world, _RECORD]``, ``-1``s for none): each rank has the same records, so either
    all raise, naming the same id, or none does."""
    for rank, t, f, p, value in records.tolist():
        if rank >= 0:
            table = tables[t]
            raise IndexError(
                f"rank {rank}, table {table.name!r}, feature {table.feature_names[f]!r}: id "
                f"{value} at position {p} is out of range for a table of "
                f"{table.num_embeddings} rows"
            )


def _pool_shard(shard, ids: Tensor, offsets: Tensor, weights) -> Tensor:
    """A shard's bags, in float32 (a half table's widened exactly)."""
    if isinstance(shard, PackedEmbeddingBag):
        return shard(ids, offsets, weights)
    return _bag(shard.weight, ids, offsets, weights, shard.mode, True, None)[0].float()


class ShardedEmbeddingBagCollection(nn.Module):
    """An `EmbeddingBagCollection` placed on the ranks of ``process_group`` by ``plan``
    (see the module notes); made by `shard`. It trains through a fused step
    (`sgd_in_backward`, `adagrad_in_backward`): in the backward, which every rank runs,
    the pooled gradient goes to the owners, and each shard takes one step with every
    rank's bags (no dense gradient of a routed table is built). Sum and mean tables
    train; max tables serve inference."""

    def __init__(self, collection: EmbeddingBagCollection, plan: Dict[str, Placement],
                 process_group=None, seed: int = 0) -> None:
        super().__init__()
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.world = dist.get_world_size(process_group)
        self._tables = collection.embedding_bag_configs()
        self._is_weighted = collection.is_weighted()
        self.plan = dict(plan)
        for table in self._tables:
            place = self.plan.get(table.name)
            ok = place in ("row_wise", "replicated") or (
                isinstance(place, int) and 0 <= place < self.world
            )
            if not ok:
                raise ArgumentError(
                    f"table {table.name!r}: the plan must place it on a rank below {self.world}, "
                    f"\"row_wise\" or \"replicated\", got {place!r}"
                )
        self._step = None
        self._state = {}
        # Bytes sent to other ranks so far (the exchanges and all-reduces), for benchmarks.
        self.sent_bytes = 0
        # What the autograd graph hangs on: the shards are stepped in place, not differentiated.
        self._anchor = torch.zeros((), requires_grad=True)
        self.shards = nn.ModuleDict()
        for table in self._tables:
            place, module = self.plan[table.name], collection.embedding_bags[table.name]
            if place == "row_wise":
                first, end = _rows_of(self.rank, table.num_embeddings, self.world)
                mode = "max" if table.pooling == "max" else "sum"
            elif place == "replicated" or place == self.rank:
                first, end, mode = 0, table.num_embeddings, table.pooling
            else:
                continue
            if table.format in PACKED:
                if module.packed.is_meta:
                    rows = pack(draw_rows(table.name, seed, table.num_embeddings, first, end,
                                          table.embedding_dim), table.format)
                else:
                    rows = module.packed[first:end].clone()
                if rows.shape[0] == 0:  # a block past the table's end: no id comes here
                    rows = pack(torch.zeros(1, table.embedding_dim), table.format)
                self.shards[table.name] = PackedEmbeddingBag.from_packed(
                    rows, table.embedding_dim, mode, table.format)
                continue
            full = module.weight
            if full.is_meta:
                # Only this rank's rows are ever allocated.
                weight = draw_rows(table.name, seed, table.num_embeddings, first, end,
                                   table.embedding_dim).to(full.dtype)
            else:
                weight = full.detach()[first:end].clone()
            self.shards[table.name] = EmbeddingBag.from_pretrained(
                weight, freeze=False, mode=mode, include_last_offset=True
            ) if weight.shape[0] > 0 else EmbeddingBag(1, table.embedding_dim, mode=mode)

    def _routed(self, rank: int) -> List:
        """The features whose ids go to ``rank``, in the order every rank uses:
        the tables it holds whole, then every row-wise table."""
        whole = [(t, f) for t in self._tables if self.plan[t.name] == rank for f in t.feature_names]
        rows = [(t, f) for t in self._tables if self.plan[t.name] == "row_wise" for f in t.feature_names]
        return whole + rows

    def _check_trainable(self) -> None:
        """Only float32 tables train: half and packed tables serve inference."""
        frozen = [t.name for t in self._tables if t.format != "f32"]
        if frozen:
            raise NotSupportedError(
                f"tables {frozen} are not float32: train in float32, then load the checkpoint "
                "into a collection of half or packed tables"
            )

    def sgd_in_backward(self, lr: float, weight_decay: float = 0.0):
        """Trains the shards by SGD fused into the backward (`EmbeddingBag.sgd_in_backward`'s
        rule): each owner steps its rows once a backward, with every rank's gradients."""
        self._check_trainable()
        _check_rates(lr=lr, weight_decay=weight_decay)
        self._step = ("sgd", float(lr), 0.0, float(weight_decay), 0.0)
        return self

    def adagrad_in_backward(self, lr: float = 1e-2, lr_decay: float = 0.0,
                            weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                            eps: float = 1e-10):
        """Trains the shards by Adagrad fused into the backward (`torch.optim.Adagrad`'s
        rule on the touched rows); each shard keeps its own accumulators."""
        self._check_trainable()
        _check_rates(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                     initial_accumulator_value=initial_accumulator_value, eps=eps)
        self._step = ("adagrad", float(lr), float(lr_decay), float(weight_decay), float(eps))
        self._state = {
            name: (torch.full_like(bag.weight, float(initial_accumulator_value)), torch.tensor(0.0))
            for name, bag in self.shards.items()
        }
        return self

    def rowwise_adagrad_in_backward(self, lr: float = 1e-2, weight_decay: float = 0.0,
                                    eps: float = 1e-8, initial_accumulator_value: float = 0.0):
        """Trains the shards by row-wise Adagrad fused into the backward (TorchRec's
        ``EXACT_ROWWISE_ADAGRAD``): one accumulator a row, kept with the row's shard."""
        self._check_trainable()
        _check_rates(lr=lr, weight_decay=weight_decay, eps=eps,
                     initial_accumulator_value=initial_accumulator_value)
        self._step = ("rowwise_adagrad", float(lr), 0.0, float(weight_decay), float(eps))
        self._state = {
            name: (torch.full((bag.weight.shape[0],), float(initial_accumulator_value)),
                   torch.tensor(0.0))
            for name, bag in self.shards.items()
        }
        return self

    # Under torch.compile the exchanges run as written, between the graphs of the model
    # around them: their split sizes are data (the ids each owner gets), which a graph
    # would recompile for at every batch.
    @torch.compiler.disable
    def forward(self, features):
        # Decided alike on every rank (a rank may hold no shard, and so no parameter):
        # the backward's exchanges need them all.
        if not torch.is_grad_enabled():
            return self._pool(features)[0]
        if self._step is None:
            if not any(p.requires_grad for p in self.parameters()):
                return self._pool(features)[0]
            raise ArgumentError(
                "a sharded collection trains through a fused step: call sgd_in_backward or "
                "adagrad_in_backward first, or run the forward under torch.no_grad()"
            )
        if any(t.pooling == "max" for t in self._tables):
            raise NotSupportedError("a sharded collection trains sum and mean tables only")
        pooled, saved = self._pool(features)
        values = _Backward.apply(self._anchor, self, saved, pooled.values())
        return _keyed_tensor(pooled.keys(), pooled.length_per_key(), values)

    def _pool(self, features):
        """The pooled rows of the local batch (a ``KeyedTensor``) and what the backward
        needs: the ids each owner received, the bags' whole counts, the local ids of the
        replicated tables."""
        keys = list(features.keys())
        index = {key: k for k, key in enumerate(keys)}
        batch = features.stride()
        feature_offsets = features.offsets()
        # Each feature's first position, as Python ints (one read).
        starts = feature_offsets[::batch].tolist() if batch > 0 else [0] * (len(keys) + 1)
        values = features.values()
        weights = features.weights_or_none() if self._is_weighted else None

        # Every feature's ids, bag lengths and weights, read once.
        segments = {}
        for table in self._tables:
            for feature in table.feature_names:
                k = index.get(feature)
                if k is None:
                    raise ArgumentError(f"feature {feature!r} is not among the keys {keys}")
                first, last = starts[k], starts[k + 1]
                lengths = torch.diff(feature_offsets[k * batch:(k + 1) * batch + 1])
                w = None if weights is None else weights[first:last]
                segments[feature] = (values[first:last], lengths, w)

        # This rank's first bad id, sent to every rank with the lengths (below): a rank
        # that has one buckets nothing and sends empty bags.
        record = self._first_bad(segments)
        bad_here = bool(record[0] >= 0)

        # 1. Bucket each routed feature's ids by owner; lengths and ids per destination.
        send_lengths, send_ids, send_weights, counts = [], [], [], {}
        buckets = {}
        for table in self._tables:
            if self.plan[table.name] != "row_wise":
                continue
            if bad_here:
                for feature in table.feature_names:
                    for dest in range(self.world):
                        empty = torch.zeros(batch, dtype=torch.int64)
                        buckets[(feature, dest)] = (empty[:0], empty, None if weights is None else weights[:0])
                continue
            for feature in table.feature_names:
                ids, lengths, w = segments[feature]
                # The crate's bucketing: one pass to count, one to place (stable).
                held, local, positions = _native.bucket_rows(
                    _array(ids), _array(lengths), table.num_embeddings, self.world
                )
                held, local = torch.from_numpy(held), torch.from_numpy(local)
                edges = [0, *torch.cumsum(held.sum(1), 0).tolist()]
                for dest in range(self.world):
                    part = slice(edges[dest], edges[dest + 1])
                    sent_w = None if w is None else w[torch.from_numpy(positions[part])]
                    buckets[(feature, dest)] = (local[part], held[dest], sent_w)
        for dest in range(self.world):
            for table, feature in self._routed(dest):
                if self.plan[table.name] == "row_wise":
                    ids, lengths, w = buckets[(feature, dest)]
                    counts[(feature, dest)] = lengths
                else:
                    ids, lengths, w = segments[feature]
                send_lengths.append(lengths)
                send_ids.append(ids.long())
                if weights is not None:
                    send_weights.append(w)
        lengths_out = torch.cat(send_lengths) if send_lengths else torch.zeros(0, dtype=torch.int64)
        split_lengths = [len(self._routed(d)) * batch for d in range(self.world)]
        mine = len(self._routed(self.rank))
        # Each destination's lengths, then this rank's record: every rank learns every
        # rank's first bad id from the first exchange, and all raise before the second.
        edges = [0, *itertools.accumulate(split_lengths)]
        with_records = torch.cat([
            part for d in range(self.world) for part in (lengths_out[edges[d]:edges[d + 1]], record)
        ])
        incoming = torch.empty(self.world * (mine * batch + _RECORD), dtype=torch.int64)
        self._exchange(incoming, with_records, [mine * batch + _RECORD] * self.world,
                       [n + _RECORD for n in split_lengths])
        incoming = incoming.reshape(self.world, mine * batch + _RECORD)
        _raise_first_bad(self._tables, incoming[:, mine * batch:])
        lengths_in = incoming[:, :mine * batch].reshape(-1)
        ids_out = torch.cat(send_ids) if send_ids else torch.zeros(0, dtype=torch.int64)
        per_dest = [int(n) for n in torch.stack([
            lengths_out[sum(split_lengths[:d]):sum(split_lengths[:d + 1])].sum()
            for d in range(self.world)
        ])]
        per_source = [int(n) for n in lengths_in.reshape(self.world, -1).sum(1)]
        ids_in = torch.empty(sum(per_source), dtype=torch.int64)
        self._exchange(ids_in, ids_out, per_source, per_dest)
        weights_in = None
        if weights is not None:
            weights_in = torch.empty(sum(per_source), dtype=weights.dtype)
            self._exchange(weights_in, torch.cat(send_weights), per_source, per_dest)

        # 2. Pool what each source sent, feature by feature, with this rank's shards.
        pooled_out, at, lengths_at, received = [], 0, 0, {}
        for _source in range(self.world):
            for table, feature in self._routed(self.rank):
                lengths = lengths_in[lengths_at:lengths_at + batch]
                lengths_at += batch
                n = int(lengths.sum())
                ids = ids_in[at:at + n]
                w = None if weights_in is None else weights_in[at:at + n]
                at += n
                shard = self.shards[table.name]
                pooled_out.append(_pool_shard(shard, ids, _offsets(lengths), w).reshape(-1))
                received.setdefault(table.name, []).append((ids, lengths, w))

        # 3. The pooled rows back to where their ids came from.
        dims_to = [sum(t.embedding_dim for t, _ in self._routed(d)) * batch for d in range(self.world)]
        rows_in = torch.empty(sum(dims_to), dtype=torch.float32)
        rows_out = torch.cat(pooled_out) if pooled_out else torch.zeros(0)
        self._exchange(rows_in, rows_out, dims_to, [dims_to[self.rank]] * self.world)
        partial, at = {}, 0
        for source in range(self.world):
            for table, feature in self._routed(source):
                size = table.embedding_dim * batch
                partial[(feature, source)] = rows_in[at:at + size].reshape(batch, table.embedding_dim)
                at += size

        outs, out_keys, dims = [], [], []
        for table in self._tables:
            place = self.plan[table.name]
            for feature in table.feature_names:
                if place == "replicated":
                    ids, lengths, w = segments[feature]
                    shard = self.shards[table.name]
                    out = _pool_shard(shard, ids, _offsets(lengths), w)
                    received.setdefault(table.name, []).append((ids, lengths, w))
                elif place == "row_wise":
                    out = self._combine(table, feature, partial, counts)
                else:
                    out = partial[(feature, place)]
                outs.append(out)
                out_keys.append(feature)
                dims.append(table.embedding_dim)
        saved = {"batch": batch, "received": received, "counts": counts}
        return _keyed_tensor(out_keys, dims, torch.cat(outs, dim=1)), saved

    def _backward(self, grad: Tensor, saved) -> None:
        """The pooled gradient to the owners, and each shard's one fused step with every
        rank's bags; a replicated table's gradient summed over the ranks first."""
        batch, received, counts = saved["batch"], saved["received"], saved["counts"]
        cols, at = {}, 0
        for table in self._tables:
            for feature in table.feature_names:
                cols[feature] = grad[:, at:at + table.embedding_dim]
                at += table.embedding_dim
        send = []
        for dest in range(self.world):
            for table, feature in self._routed(dest):
                g = cols[feature]
                if self.plan[table.name] == "row_wise" and table.pooling == "mean":
                    # Each shard summed part of the bag: its rows take the whole bag's mean.
                    whole = sum(counts[(feature, d)] for d in range(self.world)).to(g.dtype)
                    g = torch.where(whole[:, None] > 0, g / whole.clamp(min=1)[:, None], 0.0)
                send.append(g.reshape(-1))
        dims_to = [sum(t.embedding_dim for t, _ in self._routed(d)) * batch for d in range(self.world)]
        grads_in = torch.empty(dims_to[self.rank] * self.world, dtype=torch.float32)
        grads_out = torch.cat(send) if send else torch.zeros(0)
        self._exchange(grads_in, grads_out, [dims_to[self.rank]] * self.world, dims_to)
        grads, at = {}, 0
        for _source in range(self.world):
            for table, _feature in self._routed(self.rank):
                size = table.embedding_dim * batch
                grads.setdefault(table.name, []).append(
                    grads_in[at:at + size].reshape(batch, table.embedding_dim)
                )
                at += size
        for table in self._tables:
            place = self.plan[table.name]
            if place == "replicated":
                local = [cols[f] for f in table.feature_names]
                self._replicated_step(table, received[table.name], local)
            elif table.name in grads:
                mode = "sum" if place == "row_wise" else table.pooling
                self._shard_step(table.name, received[table.name], grads[table.name], mode)

    def _shard_step(self, name, parts, grads, mode) -> None:
        """One fused step of shard ``name`` over the bags of ``parts`` (``(ids, lengths,
        weights)`` in the order of ``grads``, one ``[batch, dim]`` gradient each)."""
        ids, offsets, weights = _joined(parts)
        grad = torch.cat(grads).contiguous()
        optimizer, lr, lr_decay, weight_decay, eps = self._step
        weight = self.shards[name].weight
        with torch.no_grad():
            if optimizer == "sgd":
                _steps.sgd_step_(weight, ids, offsets, weights, grad, mode, True, None, False, lr,
                               weight_decay)
            elif optimizer == "rowwise_adagrad":
                state, _ = self._state[name]
                _steps.rowwise_adagrad_step_(weight, state, ids, offsets, weights, grad, mode, True,
                                           None, False, lr, weight_decay, eps)
            else:
                state_sum, state_step = self._state[name]
                _steps.adagrad_step_(weight, state_sum, state_step, ids, offsets, weights, grad,
                                   mode, True, None, False, lr, lr_decay, weight_decay, eps)

    def _replicated_step(self, table, parts, grads) -> None:
        """A replicated table: its rows' gradients from every rank's batch (one dense
        all-reduce of the gradient and of the rows touched, which a small table affords),
        then the same step on every replica."""
        ids, offsets, weights = _joined(parts)
        grad = torch.cat(grads).contiguous()
        rows = table.num_embeddings
        dense = _ops.embedding_bag_backward(grad, ids, offsets, weights, ids.new_empty(0), rows,
                                            table.pooling, True, None, False)
        touched = torch.bincount(ids.long(), minlength=rows).clamp(max=1)
        dist.all_reduce(dense, group=self.group)
        dist.all_reduce(touched, group=self.group)
        # A ring all-reduce sends about twice its tensor.
        self.sent_bytes += 2 * (dense.nbytes + touched.nbytes) * (self.world - 1) // self.world
        rows_touched = torch.nonzero(touched).reshape(-1)
        self._shard_step(table.name, [(rows_touched, torch.ones_like(rows_touched), None)],
                         [dense[rows_touched]], "sum")

    def _exchange(self, output, input, output_splits, input_splits) -> None:
        """``all_to_all_single``, counting the bytes this rank sends to the others."""
        dist.all_to_all_single(output, input, output_splits, input_splits, group=self.group)
        self.sent_bytes += (sum(input_splits) - input_splits[self.rank]) * input.element_size()

    def _first_bad(self, segments) -> Tensor:
        """This rank's first out-of-range id as ``[rank, table, feature, position,
        value]``, or ``-1``s: checked before anything is exchanged, sent with the
        lengths (``_raise_first_bad``)."""
        for t, table in enumerate(self._tables):
            for f, feature in enumerate(table.feature_names):
                ids = segments[feature][0]
                bad = (ids < 0) | (ids >= table.num_embeddings)
                if bool(bad.any()):
                    p = int(torch.nonzero(bad)[0])
                    return torch.tensor([self.rank, t, f, p, int(ids[p])])
        return torch.full((_RECORD,), -1, dtype=torch.int64)

    def _combine(self, table, feature, partial, counts) -> Tensor:
        """A row-wise feature's pooled rows from the ranks' partial rows, in rank order."""
        parts = [partial[(feature, d)] for d in range(self.world)]
        held = [counts[(feature, d)] for d in range(self.world)]
        if table.pooling == "max":
            out = torch.zeros_like(parts[0])
            seen = torch.zeros(parts[0].shape[0], dtype=torch.bool)
            for part, n in zip(parts, held):
                has = n > 0
                # Strictly greater replaces: a tie keeps the lower rank's value.
                take = has[:, None] & (~seen[:, None] | (part > out))
                out = torch.where(take, part, out)
                seen |= has
            return out
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        if table.pooling == "mean":
            count = sum(held).to(torch.float32)
            total = torch.where(count[:, None] > 0, total / count.clamp(min=1)[:, None], 0.0)
        return total


class _Backward(torch.autograd.Function):
    """Hangs the sharded forward's output on the autograd graph: its backward sends the
    pooled gradient to the owners, which step their shards (every rank must run it)."""

    @staticmethod
    def forward(ctx, anchor, module, saved, values):
        ctx.module, ctx.saved = module, saved
        return values.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.module._backward(grad.contiguous(), ctx.saved)
        return None, None, None, None


def shard(collection: EmbeddingBagCollection, plan=None, process_group=None, seed: int = 0):
    """``collection`` placed on the ranks of ``process_group`` (the default group if
    ``None``) by ``plan`` (`plan_shards`' if ``None``). Every rank calls it with the same
    collection (the same tables, e.g. from one seed or one checkpoint) and plan. A
    collection made on the meta device is never allocated whole: each rank draws its own
    rows from ``seed`` (`EmbeddingBagCollection.reset_parameters`' values)."""
    if plan is None:
        plan = plan_shards(collection, dist.get_world_size(process_group))
    return ShardedEmbeddingBagCollection(collection, plan, process_group, seed)
