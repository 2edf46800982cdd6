"""Tensors as the NumPy arrays the kernels read, and the arrays they write.

The checks that the modules' tensors suit the kernels (CPU, float32 tables, int32
or int64 ids), the NumPy views of tensors, fresh unzeroed arrays and the dense
gradient arrays kept for reuse.
"""

import sys
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ._errors import ArgumentError


# The dtypes of the tables the kernels serve: float32 for everything, the halves
# (the crate's f16 and bf16 tables) for inference.
HALVES = (torch.float16, torch.bfloat16)


def _check_table(weight: Tensor, name: str = "weight", halves: bool = False) -> None:
    """Raises ArgumentError unless ``weight`` is a CPU float32 tensor (or, with
    ``halves``, a float16 or bfloat16 one)."""
    if not weight.is_cpu:
        raise ArgumentError(
            f"embedding_kernels runs on the CPU only, but {name} is on {weight.device}"
        )
    if weight.dtype is not torch.float32 and not (halves and weight.dtype in HALVES):
        kinds = "float32, float16 or bfloat16" if halves else "float32"
        raise ArgumentError(f"embedding_kernels needs a {kinds} {name}, got {weight.dtype}")
    if weight.layout != torch.strided:
        raise ArgumentError(f"embedding_kernels needs a dense {name}, got {weight.layout}")


def _check_ids(ids: Tensor, name: str) -> None:
    """Raises ArgumentError unless ``ids`` is a CPU int32 or int64 tensor."""
    if not isinstance(ids, Tensor):
        raise ArgumentError(f"{name} must be a tensor of int32 or int64 ids, got {type(ids).__name__}")
    if not ids.is_cpu:
        raise ArgumentError(f"embedding_kernels runs on the CPU only, but {name} is on {ids.device}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"{name} must hold int32 or int64 ids, got {ids.dtype}")


def _array(tensor: Tensor):
    """A NumPy view of ``tensor`` (a contiguous copy first if it is not contiguous)."""
    # Each step only where needed: a call on a small batch is mostly this kind of cost.
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        if tensor.dtype == torch.float32:
            # Into NumPy's memory (huge pages for large arrays, see `_fresh`): the
            # gradient of `out.sum()` is one row expanded to the output's shape, and
            # its copy by `.contiguous()` into fresh 4 KiB pages costs more than the
            # backward's kernel.
            copy = _fresh(tuple(tensor.shape))
            torch.from_numpy(copy).copy_(tensor)
            return copy
        tensor = tensor.contiguous()
    return tensor.numpy()


def _weight_of(module) -> Tensor:
    """``module.weight``: from ``module._parameters`` where it is, through the attribute
    where something else holds it (a parametrization, a plain tensor).

    ``module.weight`` reaches a parameter through ``nn.Module.__getattr__``, after
    Python's own lookup has failed: far slower than ``_parameters["weight"]``, and a
    fair share of a small inference call.
    (A subclass that defines a ``weight`` property while the parameter stays registered
    would get the parameter here, not its property.)"""
    weight = module._parameters.get("weight")
    return module.weight if weight is None else weight


def _fresh(shape) -> "np.ndarray":
    """A fresh float32 array that a kernel (a dense gradient) or a copy (a strided
    gradient) writes whole: ``np.empty``.

    Not zeroed, like the outputs the NumPy functions allocate themselves; made here and
    passed as ``out`` (or copied into) so that the tests can hand the modules NaN-filled arrays instead and
    check that nothing of them survives. On an error the array is dropped, so nobody sees
    what it held. NumPy's allocation, not ``torch.empty``:
    NumPy asks for huge pages for large arrays (``madvise``), so the first touch of a
    large fresh output faults in a page per 2 MiB rather than per 4 KiB
    (docs/design.md, "Memory: huge pages and aligned tables")."""
    return np.empty(shape, dtype=np.float32)


# The dense gradient arrays handed out last (see `_dense_grad`), oldest first: at most
# `_SPARE_ARRAYS` of them, of any shapes.
_spare_grads: list = []
_SPARE_ARRAYS = 8
# An object held by this module alone: `_dense_grad` counts its references as it counts
# a free array's (in a local variable of the same frame), so the test does not depend on
# how a Python version counts a local's references (3.14 counts one fewer).
_PROBE = object()


def _dense_grad(shape) -> "np.ndarray":
    """An array for a dense gradient of ``shape`` that the backward writes whole.

    An array of this shape handed out before, once nothing but this cache holds it
    (the training loop's ``zero_grad()`` dropped the tensor made from it), else a new
    one from ``_fresh``, kept for the next time. A step that frees its gradient and
    makes another one every time then writes into memory it has written before: a
    fresh array's first touch, one page fault per page, costs the dense backward more
    than its own work (docs/design.md, "The grouped backward"). Two tables of one shape
    get an array each."""
    probe = _PROBE
    for spare in _spare_grads:
        # Held by the list and by `spare`, as `probe` by the module and by `probe`: by
        # nobody else. `spare` holds it from here on, so another thread testing the
        # same array meanwhile counts one more and leaves it.
        if spare.shape == shape and sys.getrefcount(spare) == sys.getrefcount(probe):
            return spare
    grad = _fresh(shape)
    _spare_grads.append(grad)
    if len(_spare_grads) > _SPARE_ARRAYS:
        del _spare_grads[0]
    return grad


def empty_cache() -> None:
    """Lets go of the dense gradient arrays kept for reuse.

    The dense backward of ``Embedding`` and ``EmbeddingBag`` (``sparse=False``) keeps
    the last gradient arrays it made (up to eight) and writes the next gradient of a
    shape into one of them once nothing else holds it, as after
    ``optimizer.zero_grad()``: the memory of one gradient per table stays allocated
    between steps. Call this to return it, as ``torch.cuda.empty_cache()``
    returns the memory PyTorch's CUDA allocator keeps."""
    _spare_grads.clear()


def _needs_graph(weight: Tensor, per_sample_weights: Optional[Tensor] = None) -> bool:
    """Whether autograd records a call on ``weight`` (and ``per_sample_weights``): grad
    mode is on and one of them requires grad.

    Without it the modules call the kernels directly: the same result, without the
    ``autograd.Function``'s cost per call. Called on every forward, so written out
    rather than over a list of tensors."""
    if not torch.is_grad_enabled():
        return False
    if weight.requires_grad:
        return True
    return per_sample_weights is not None and per_sample_weights.requires_grad
