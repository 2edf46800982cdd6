"""Tables of packed rows in a collection: 8-, 4- or 2-bit codes with a scale and a bias a
row (PyTorch's ``embedding_bag_byte_prepack`` / ``_4bit_`` / ``_2bit_prepack`` bytes),
pooled by the crate's packed bags. They serve inference: a table is trained in float32
and packed when made, or when a float32 checkpoint loads into it."""

from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from ... import _native
from .._arrays import _array
from .._errors import ArgumentError
from .._ops import _operator

# The packed formats a table may take, beside f32 / f16 / bf16.
PACKED = ("int8", "int4", "int2")


def row_bytes(embedding_dim: int, format: str) -> int:
    """The bytes of one packed row of ``embedding_dim`` values."""
    return _native.prepack(np.zeros((1, embedding_dim), dtype=np.float32), format).shape[1]


def pack(rows: Tensor, format: str) -> Tensor:
    """Float32 rows ``[n, dim]`` packed: uint8 ``[n, row_bytes]``."""
    return torch.from_numpy(_native.prepack(_array(rows.float().contiguous()), format))


def unpack(packed: Tensor, format: str, embedding_dim: int) -> Tensor:
    """Packed rows read back as float32 ``[n, embedding_dim]``."""
    return torch.from_numpy(_native.dequantize(_array(packed), format, embedding_dim))


@_operator(())
def packed_embedding_bag(
    packed: Tensor,
    indices: Tensor,
    offsets: Tensor,
    per_sample_weights: Optional[Tensor],
    mode: str,
    format: str,
    embedding_dim: int,
) -> Tensor:
    """The bags of a packed table, float32 ``[len(offsets) - 1, embedding_dim]``
    (``offsets`` ends with the last bag's end, ``include_last_offset``)."""
    weights = None if per_sample_weights is None else _array(per_sample_weights)
    out, _ = _native.table_embedding_bag(
        _array(packed), _array(indices), _array(offsets), mode, weights, True, None, format,
        embedding_dim,
    )
    return torch.from_numpy(out)


@packed_embedding_bag.register_fake
def _(packed, indices, offsets, per_sample_weights, mode, format, embedding_dim):
    if packed.dtype is not torch.uint8:
        raise ArgumentError(f"a packed table is uint8, got {packed.dtype}")
    return packed.new_empty((offsets.shape[0] - 1, embedding_dim), dtype=torch.float32)


class PackedEmbeddingBag(nn.Module):
    """A bag table of packed rows (``format`` ``"int8"``, ``"int4"`` or ``"int2"``), for
    inference: ``forward(indices, offsets, per_sample_weights=None)`` as
    `EmbeddingBag`'s with ``include_last_offset=True``, in float32. The rows are the
    ``packed`` buffer (uint8 ``[num_embeddings, row bytes]``), made from float32 rows
    drawn as PyTorch draws a bag table's (N(0, 1)); a float32 checkpoint `load`ed into
    a collection packs its rows."""

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "sum",
                 format: str = "int8", device=None) -> None:
        super().__init__()
        if format not in PACKED:
            raise ArgumentError(f"format must be one of {', '.join(PACKED)}, got {format!r}")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.mode, self.format = mode, format
        if torch.device(device or "cpu").type == "meta":
            packed = torch.empty((num_embeddings, row_bytes(embedding_dim, format)),
                                 dtype=torch.uint8, device="meta")
        else:
            packed = pack(torch.randn(num_embeddings, embedding_dim), format)
        self.register_buffer("packed", packed)

    @classmethod
    def from_packed(cls, packed: Tensor, embedding_dim: int, mode: str, format: str) -> "PackedEmbeddingBag":
        """A table over packed rows already made (kept, not copied)."""
        module = cls(1, embedding_dim, mode, format, device="meta")
        module.num_embeddings = packed.shape[0]
        module.packed = packed
        return module

    def dequantize(self) -> Tensor:
        """The table's values as float32 ``[num_embeddings, embedding_dim]``."""
        return unpack(self.packed, self.format, self.embedding_dim)

    def forward(self, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor] = None) -> Tensor:
        return packed_embedding_bag(self.packed, indices, offsets, per_sample_weights, self.mode,
                                    self.format, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, format={self.format!r}"
