"""The collection of bag tables, in one process: TorchRec's shapes on the crate's bags.

``EmbeddingBagCollection`` takes a list of ``EmbeddingBagConfig`` (a table: its rows,
width, pooling, format and the features that read it) and pools a batch of
keyed, jagged ids (``KeyedJaggedTensor``: for each key, one bag per example) into one
``[batch, Σ dims]`` tensor whose columns are the features' pooled rows in the order
the configs list them (``KeyedTensor``). The names, arguments and layouts are
TorchRec's, so a TorchRec user reads the same code; TorchRec's own
``KeyedJaggedTensor`` is accepted as input, and when it is loaded the output is its
``KeyedTensor``. Each table is an ``EmbeddingBag`` of this package, so its pooling,
gradients and fused optimiser steps are the crate's, and its weight sits at
``embedding_bags.<table>.weight`` in the ``state_dict``, as in TorchRec.
"""

import sys
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn

from ... import _native
from .. import EmbeddingBag
from .._arrays import _array
from .._errors import ArgumentError
from .._ops import _direct, _operator
from ._packed import PACKED, PackedEmbeddingBag, pack

# A table's format: its dtype, or packed rows (`PackedEmbeddingBag`). Only float32
# tables train; the others serve inference.
_FORMATS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


# Rows drawn a chunk at a time, each chunk from a generator of its own: any block of
# rows can be drawn alone, with the values the whole table would have.
CHUNK_ROWS = 1 << 16


def draw_rows(name: str, seed: int, num_embeddings: int, first: int, end: int,
              embedding_dim: int) -> Tensor:
    """Rows ``[first, end)`` of table ``name`` drawn from N(0, 1) (PyTorch's bag
    initialisation) by the chunked rule: chunk ``c`` (``CHUNK_ROWS`` rows) from a
    generator seeded by ``seed``, the table's name and ``c``. The same rows on any rank
    and in any plan; a rank draws only the chunks its block touches."""
    out = torch.empty((end - first, embedding_dim))
    if end <= first:
        return out
    tag = zlib.crc32(name.encode())
    for chunk in range(first // CHUNK_ROWS, (end - 1) // CHUNK_ROWS + 1):
        lo = chunk * CHUNK_ROWS
        hi = min(lo + CHUNK_ROWS, num_embeddings)
        generator = torch.Generator().manual_seed(((seed & 0xFFFFFFFF) << 31) ^ (tag << 16) ^ chunk)
        rows = torch.randn((hi - lo, embedding_dim), generator=generator)
        a, b = max(lo, first), min(hi, end)
        out[a - first:b - first] = rows[a - lo:b - lo]
    return out


def _pooling_name(pooling) -> str:
    """``"sum"``, ``"mean"`` or ``"max"`` from a string or TorchRec's ``PoolingType``."""
    name = getattr(pooling, "name", pooling)
    if not isinstance(name, str) or name.lower() not in ("sum", "mean", "max"):
        raise ArgumentError(f'pooling must be "sum", "mean" or "max", got {pooling!r}')
    return name.lower()


@dataclass
class EmbeddingBagConfig:
    """One table of a collection, with TorchRec's field names.

    ``feature_names`` are the input keys that read the table (each gives one pooled
    row per example); none means the table's own ``name``. ``pooling`` is ``"sum"``
    (TorchRec's default), ``"mean"`` or ``"max"``, or TorchRec's ``PoolingType``.
    ``format`` is ``"f32"``, or for a table that serves inference ``"f16"`` / ``"bf16"``
    (half rows) or ``"int8"`` / ``"int4"`` / ``"int2"`` (packed rows, a scale and bias a row:
    `PackedEmbeddingBag`)."""

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    feature_names: List[str] = field(default_factory=list)
    pooling: object = "sum"
    format: str = "f32"

    def __post_init__(self) -> None:
        if not self.name:
            raise ArgumentError("a table needs a name")
        if self.num_embeddings <= 0 or self.embedding_dim <= 0:
            raise ArgumentError(
                f"table {self.name!r} needs positive num_embeddings and embedding_dim, got "
                f"{self.num_embeddings} and {self.embedding_dim}"
            )
        self.pooling = _pooling_name(self.pooling)
        if self.format not in _FORMATS and self.format not in PACKED:
            raise ArgumentError(
                f"table {self.name!r}: format must be one of {', '.join([*_FORMATS, *PACKED])}, "
                f"got {self.format!r}"
            )
        self.feature_names = list(self.feature_names) or [self.name]


class KeyedJaggedTensor:
    """Keyed, jagged ids, laid out as TorchRec's ``KeyedJaggedTensor``: ``values``
    holds every id, key after key and, within a key, example after example;
    ``lengths[k * stride + b]`` is the count of key ``k``'s ids in example ``b``
    (or ``offsets``, the ``K * stride + 1`` running sums from 0). ``weights``, one per
    id, weight a sum pooling (``per_sample_weights``)."""

    def __init__(
        self,
        keys: Sequence[str],
        values: Tensor,
        weights: Optional[Tensor] = None,
        lengths: Optional[Tensor] = None,
        offsets: Optional[Tensor] = None,
        stride: Optional[int] = None,
    ) -> None:
        self._keys = list(keys)
        if len(set(self._keys)) != len(self._keys):
            raise ArgumentError(f"keys must be distinct, got {self._keys}")
        if (lengths is None) == (offsets is None):
            raise ArgumentError("give lengths or offsets, one of them")
        if values.dim() != 1 or (weights is not None and weights.shape != values.shape):
            raise ArgumentError("values must be 1-D, and weights (if given) one per value")
        if offsets is None:
            offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
            torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
        if offsets.dim() != 1 or offsets.numel() < 1:
            raise ArgumentError("offsets must be 1-D and start with 0")
        segments = offsets.numel() - 1
        if stride is None:
            stride = segments // len(self._keys) if self._keys else 0
        if segments != stride * len(self._keys):
            raise ArgumentError(
                f"{segments} bags do not make {len(self._keys)} keys of {stride} examples"
            )
        self._values, self._weights, self._offsets, self._stride = values, weights, offsets, stride

    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def weights_or_none(self) -> Optional[Tensor]:
        return self._weights

    def offsets(self) -> Tensor:
        return self._offsets

    def lengths(self) -> Tensor:
        return torch.diff(self._offsets)

    def stride(self) -> int:
        return self._stride


class KeyedTensor:
    """Pooled rows of several keys side by side, laid out as TorchRec's ``KeyedTensor``:
    ``values()`` is ``[batch, Σ length_per_key()]``, key ``k``'s columns following the
    keys before it."""

    def __init__(self, keys: List[str], length_per_key: List[int], values: Tensor) -> None:
        self._keys, self._lengths, self._values = keys, length_per_key, values
        starts = [0]
        for length in length_per_key:
            starts.append(starts[-1] + length)
        self._starts = starts

    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def length_per_key(self) -> List[int]:
        return self._lengths

    def __getitem__(self, key: str) -> Tensor:
        k = self._keys.index(key)
        return self._values[:, self._starts[k] : self._starts[k + 1]]

    def to_dict(self) -> Dict[str, Tensor]:
        return {key: self[key] for key in self._keys}


def _keyed_tensor(keys, lengths, values):
    """TorchRec's ``KeyedTensor`` where TorchRec is loaded (a caller that handed in its
    ``KeyedJaggedTensor`` gets its own type back), else this module's."""
    torchrec = sys.modules.get("torchrec")
    if torchrec is not None and hasattr(torchrec, "KeyedTensor"):
        return torchrec.KeyedTensor(keys=keys, length_per_key=lengths, values=values)
    return KeyedTensor(keys, lengths, values)


def _segments(values: Tensor, offsets: Tensor, weights: Optional[Tensor], features: List[int],
              batch: int, starts: Optional[List[int]] = None):
    """The ids, bag offsets (from 0, the last one ending the last bag) and weights of
    features ``features`` of a jagged batch, their bags one feature after the other:
    what a table reading those features pools in one call. Views where one feature
    suffices. ``starts``: each feature's first position and the end, if read already."""
    if starts is None:
        starts = offsets[::batch].tolist() if batch > 0 else [0] * (max(features, default=0) + 2)
    ids, bags, sample_weights, base = [], [], [], 0
    for k in features:
        first, last = starts[k], starts[k + 1]
        ids.append(values[first:last])
        # The feature's bag boundaries, moved after the features before it.
        bags.append(offsets[k * batch + (1 if bags else 0):(k + 1) * batch + 1] - (first - base))
        base += last - first
        if weights is not None:
            sample_weights.append(weights[first:last])
    if len(features) == 1:
        ids, bag_offsets = ids[0], bags[0]
        sample_weights = None if weights is None else sample_weights[0]
    else:
        ids, bag_offsets = torch.cat(ids), torch.cat(bags)
        sample_weights = None if weights is None else torch.cat(sample_weights)
    return ids, bag_offsets.long(), sample_weights


@_operator(())
def keyed_segments(
    values: Tensor, offsets: Tensor, weights: Optional[Tensor], features: List[int], batch: int
) -> tuple[Tensor, Tensor, Tensor]:
    """`_segments` as an operator (copies, an empty tensor for no weights): how a
    compiled collection reads its features. Its output's length is data, a size of its
    own to the compiler, not a sum of the features' bounds (which a compiled backward
    could not bind)."""
    ids, bag_offsets, sample_weights = _segments(values, offsets, weights, features, batch)
    if sample_weights is None:
        sample_weights = values.new_empty((0,), dtype=torch.float32)
    return ids.clone(), bag_offsets.clone(), sample_weights.clone()


@keyed_segments.register_fake
def _(values, offsets, weights, features, batch):
    n = torch.library.get_ctx().new_dynamic_size()
    sample_weights = values.new_empty((0 if weights is None else n,), dtype=torch.float32)
    return values.new_empty((n,)), offsets.new_empty((len(features) * batch + 1,), dtype=torch.int64), sample_weights


class EmbeddingBagCollection(nn.Module):
    """Bag tables looked up by keyed features, in one process (TorchRec's
    ``EmbeddingBagCollection``).

    ``forward(features)`` takes a ``KeyedJaggedTensor`` (this module's or TorchRec's)
    holding at least every feature of every table, and returns a ``KeyedTensor`` of the
    features in table order (each table's ``feature_names`` in order), each feature's
    columns its table's pooled rows. ``is_weighted`` pools with the features' weights
    (sum pooling only). Each table is an `EmbeddingBag` of this package in
    ``embedding_bags[name]``, initialised as PyTorch's (N(0, 1)); ``device="meta"`` makes
    the tables without memory, for `shard` to draw each rank's rows alone. Its
    ``sgd_in_backward`` / ``adagrad_in_backward`` fuse the
    optimiser into the backward, one step a table a backward (its features' bags are
    pooled in one call). A bad id raises ``IndexError`` naming the table, its position
    counted along the table's features' ids in order."""

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool = False,
        device=None,
    ) -> None:
        super().__init__()
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ArgumentError(f"table names must be distinct, got {names}")
        features = [f for t in tables for f in t.feature_names]
        if len(set(features)) != len(features):
            raise ArgumentError(f"a feature may read one table only, got {features}")
        if is_weighted and any(t.pooling != "sum" for t in tables):
            raise ArgumentError("weighted features need sum pooling in every table")
        self._tables = list(tables)
        self._is_weighted = is_weighted
        self.embedding_bags = nn.ModuleDict(
            {
                t.name: PackedEmbeddingBag(
                    t.num_embeddings, t.embedding_dim, t.pooling, t.format, device=device
                ) if t.format in PACKED else EmbeddingBag(
                    t.num_embeddings, t.embedding_dim, mode=t.pooling, include_last_offset=True,
                    device=device, dtype=_FORMATS[t.format],
                )
                for t in tables
            }
        )

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return self._tables

    def reset_parameters(self, seed: int = 0) -> None:
        """Draws every table by the chunked rule (`draw_rows`) from ``seed``: the values a
        collection made on the meta device and sharded with the same seed holds."""
        with torch.no_grad():
            for t in self._tables:
                rows = draw_rows(t.name, seed, t.num_embeddings, 0, t.num_embeddings, t.embedding_dim)
                bag = self.embedding_bags[t.name]
                if t.format in PACKED:
                    bag.packed = pack(rows, t.format)
                else:
                    bag.weight.copy_(rows)

    def is_weighted(self) -> bool:
        return self._is_weighted

    def _trains(self) -> bool:
        return any(p.requires_grad for p in self.parameters())

    def _into_columns(self) -> bool:
        """Whether inference may write each table's bags into its columns of the output
        (`_pool_into_columns`): float32 and packed tables pool into float32, while a half
        table's bags are rounded to its dtype first (also one made half after the fact)."""
        return all(isinstance(bag, PackedEmbeddingBag) or bag.weight.dtype is torch.float32
                   for bag in self.embedding_bags.values())

    def _layout(self, keys):
        """Each table's features' positions among ``keys``, and the output's keys and
        widths (the features in table order)."""
        index = {key: k for k, key in enumerate(keys)}
        positions, out_keys, dims = [], [], []
        for table in self._tables:
            ks = []
            for feature in table.feature_names:
                k = index.get(feature)
                if k is None:
                    raise ArgumentError(f"feature {feature!r} of table {table.name!r} is not among the keys {keys}")
                ks.append(k)
                out_keys.append(feature)
                dims.append(table.embedding_dim)
            positions.append(ks)
        return positions, out_keys, dims

    def _pool_into_columns(self, layout, batch, offsets, values, weights, starts):
        """Inference in eager mode: each feature's bags written by the crate straight
        into its columns of the ``[batch, Σ dims]`` output, instead of pooled apart
        and concatenated (a copy of the whole output). The same bits."""
        positions, out_keys, dims = layout
        result = torch.empty((batch, sum(dims)), dtype=torch.float32)
        out, column = result.numpy(), 0
        for table, ks in zip(self._tables, positions):
            bag = self.embedding_bags[table.name]
            if isinstance(bag, PackedEmbeddingBag):
                rows, format = _array(bag.packed), table.format
            else:
                rows, format = _array(bag.weight), None
            for k in ks:
                first, last = starts[k], starts[k + 1]
                bounds = offsets[k * batch:(k + 1) * batch + 1] - first
                w = None if weights is None else _array(weights[first:last])
                try:
                    _native.table_embedding_bag(
                        rows, _array(values[first:last]), _array(bounds), table.pooling, w, True, None,
                        format, table.embedding_dim, out, column,
                    )
                except IndexError as e:
                    raise IndexError(f"table {table.name!r} (features {table.feature_names}): {e}") from None
                column += table.embedding_dim
        return _keyed_tensor(out_keys, dims, result)

    def forward(self, features) -> "KeyedTensor":
        keys = list(features.keys())
        layout = self._layout(keys)
        batch = features.stride()
        offsets = features.offsets()
        values = features.values()
        weights = features.weights_or_none() if self._is_weighted else None
        if self._is_weighted and weights is None:
            raise ArgumentError("a weighted collection needs features with weights")
        # The features' first and last positions, as Python ints (one read), where the
        # call is not traced.
        direct = _direct()
        if direct:
            starts = offsets[::batch].tolist() if batch > 0 else [0] * (len(keys) + 1)
            if self._into_columns() and not (torch.is_grad_enabled() and self._trains()):
                return self._pool_into_columns(layout, batch, offsets, values, weights, starts)
        positions, out_keys, dims = layout
        pooled = []
        for table, ks in zip(self._tables, positions):
            # A table's features pooled in one call (their bags one after the other), so
            # that a fused optimiser step takes one step a backward, as TorchRec's does.
            if direct:
                ids, bag_offsets, sample_weights = _segments(values, offsets, weights, ks, batch, starts)
            else:
                ids, bag_offsets, sample_weights = keyed_segments(values, offsets, weights, ks, batch)
                sample_weights = None if weights is None else sample_weights
            try:
                out = self.embedding_bags[table.name](ids, bag_offsets, sample_weights)
            except IndexError as e:
                raise IndexError(f"table {table.name!r} (features {table.feature_names}): {e}") from None
            # One block of rows a feature (an empty batch too, where `split` would give one).
            pooled.extend(out.reshape(len(ks), batch, table.embedding_dim).unbind(0))
        return _keyed_tensor(out_keys, dims, torch.cat(pooled, dim=1))
