"""Drop-in ``torch.nn.Embedding`` and ``torch.nn.EmbeddingBag`` on the crate's kernels.

``Embedding`` and ``EmbeddingBag`` take PyTorch's constructor arguments, hold
their table in a ``weight`` ``nn.Parameter`` (so ``state_dict()`` and
``load_state_dict()`` move tables between these modules and PyTorch's, both
ways), and train through ``torch.autograd.Function``s whose forward and
backward are the crate's kernels: a dense gradient, or with ``sparse=True`` a
coalesced ``torch.sparse_coo_tensor`` that PyTorch's optimisers accept.

Tensors reach the kernels as NumPy views (``tensor.numpy()``), without a copy
when they are contiguous (a contiguous copy otherwise, as PyTorch would make;
for float32, into NumPy's memory). Only CPU float32 tables and gradients are supported, with int32 or
int64 ids; any other device or dtype raises ``ValueError``. An id out of range
(negative ones included) raises ``IndexError`` naming its flat position and
value, before anything is written.

``max_norm`` renormalises the looked-up rows in place, under ``no_grad``,
with PyTorch's own ``torch.embedding_renorm_`` (the crate renormalises only
tables it owns, not a borrowed one), after the crate has checked every id.
"""

import math
import sys
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import init

from . import _native

__all__ = ["Embedding", "EmbeddingBag", "empty_cache"]


def _check_table(weight: Tensor, name: str = "weight") -> None:
    """Raises ValueError unless ``weight`` is a CPU float32 tensor."""
    if not weight.is_cpu:
        raise ValueError(
            f"embedding_kernels runs on the CPU only, but {name} is on {weight.device}"
        )
    if weight.dtype is not torch.float32:
        raise ValueError(f"embedding_kernels needs a float32 {name}, got {weight.dtype}")
    if weight.layout != torch.strided:
        raise ValueError(f"embedding_kernels needs a dense {name}, got {weight.layout}")


def _check_ids(ids: Tensor, name: str) -> None:
    """Raises ValueError unless ``ids`` is a CPU int32 or int64 tensor."""
    if not isinstance(ids, Tensor):
        raise ValueError(f"{name} must be a tensor of int32 or int64 ids, got {type(ids).__name__}")
    if not ids.is_cpu:
        raise ValueError(f"embedding_kernels runs on the CPU only, but {name} is on {ids.device}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must hold int32 or int64 ids, got {ids.dtype}")


def _array(tensor: Tensor):
    """A NumPy view of ``tensor`` (a contiguous copy first if it is not contiguous)."""
    # Each step only where needed: a call on a small batch is mostly this kind of cost.
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        if tensor.dtype == torch.float32:
            # Into NumPy's memory (huge pages for large arrays, see `_fresh`): the
            # gradient of `out.sum()` is one row expanded to the output's shape, and
            # its copy by `.contiguous()` into fresh 4 KiB pages took longer than the
            # backward's kernel.
            copy = _fresh(tuple(tensor.shape))
            torch.from_numpy(copy).copy_(tensor)
            return copy
        tensor = tensor.contiguous()
    return tensor.numpy()


def _fresh(shape) -> "np.ndarray":
    """A fresh float32 array for a kernel that writes every element of it: ``np.empty``.

    Not zeroed, like the outputs the NumPy functions allocate themselves; made here and
    passed as ``out`` so that the tests can hand the modules NaN-filled arrays instead and
    check that nothing of them survives. On an error the array is dropped, so nobody sees
    what it held. NumPy's allocation, not ``torch.empty``:
    NumPy asks for huge pages for large arrays (``madvise``), and the first touch of a
    fresh 48 MB output in 4 KiB pages took twice as long (gpt2's lookup, 33 against 13 ms,
    2026-11-24)."""
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
    fresh array's first touch, one page fault per page, took minilm's dense backward
    (30 522 x 384) from 2.4-2.9 ms into a held array to 8.9-12.4 ms. Two tables of one
    shape get an array each."""
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


def _lookup(weight: Tensor, ids: Tensor, padding_idx: Optional[int]) -> Tensor:
    """``weight[ids]`` by the crate's gather, into a fresh unzeroed array (see ``_fresh``)."""
    out = _fresh((*ids.shape, weight.shape[1]))
    _native.embedding(_array(weight), _array(ids), padding_idx, out)
    return torch.from_numpy(out)


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


def _check_factory(device, dtype) -> None:
    """Refuses a ``device`` or ``dtype`` the kernels cannot serve."""
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"embedding_kernels runs on the CPU only, got device={device}")
    if dtype is not None and dtype != torch.float32:
        raise ValueError(f"embedding_kernels needs float32 tables, got dtype={dtype}")


def _padding_row(padding_idx: Optional[int], num_embeddings: int) -> Optional[int]:
    """``padding_idx`` as a row (a negative one counts from the end), as PyTorch does."""
    if padding_idx is None:
        return None
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(
            f"padding_idx {padding_idx} must be within [-{num_embeddings}, {num_embeddings})"
        )
    return padding_idx + num_embeddings if padding_idx < 0 else padding_idx


def _sparse(rows, values, num_embeddings: int, embedding_dim: int) -> Tensor:
    """The crate's coalesced ``(rows, values)`` as a sparse COO gradient of the table's shape."""
    return torch.sparse_coo_tensor(
        torch.from_numpy(rows).unsqueeze(0),
        torch.from_numpy(values),
        (num_embeddings, embedding_dim),
        is_coalesced=True,
        # The crate's rows are distinct, ascending and in range: nothing to check.
        check_invariants=False,
    )


def _parameter(
    num_embeddings: int, embedding_dim: int, weight: Optional[Tensor], requires_grad: bool
) -> nn.Parameter:
    """A module's table: a fresh float32 one (for `reset_parameters`), or `weight` (the
    `_weight` argument), checked against the module's shape."""
    if weight is None:
        fresh = torch.empty((num_embeddings, embedding_dim), dtype=torch.float32)
        return nn.Parameter(fresh, requires_grad=requires_grad)
    if list(weight.shape) != [num_embeddings, embedding_dim]:
        raise ValueError(
            f"_weight has shape {list(weight.shape)}, expected [{num_embeddings}, {embedding_dim}]"
        )
    _check_table(weight, "_weight")
    return nn.Parameter(weight, requires_grad=requires_grad)


class _Table(nn.Module):
    """What both modules share: the `weight` table, its padding row, and the
    optimiser steps fused into the backward."""

    weight: nn.Parameter
    padding_idx: Optional[int]
    # The optimiser step run as the backward (`sgd_in_backward`, `adagrad_in_backward`).
    _step_in_backward: Optional[object] = None

    def reset_parameters(self) -> None:
        """Draws the table from N(0, 1) and zeroes the padding row, as PyTorch does."""
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self) -> None:
        if self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].fill_(0)

    def _check_fused(self) -> None:
        """Raises if this layer's backward cannot be a fused step."""

    def sgd_in_backward(self, lr: Optional[float], weight_decay: float = 0.0):
        """Makes the backward an SGD step on ``weight``, fused by the crate; ``lr=None`` undoes it.

        From then on ``loss.backward()`` updates the rows of ``weight`` that the
        forward read, ``w -= lr * (g + weight_decay * w)`` with ``g`` the row's
        summed gradient (less ``padding_idx``, scaled by ``scale_grad_by_freq``;
        for a bag layer, each bag's gradient times the row's per-sample weight or
        ``1/len`` of a mean bag), and leaves ``weight.grad`` at ``None``: no
        gradient is made, stored or read by an optimiser, so leave ``weight`` out
        of the optimiser of the other parameters. Without weight decay the update
        is what ``sparse=True`` with ``torch.optim.SGD(lr)`` gives, in one pass
        instead of three; weight decay applies to the touched rows only, as
        FBGEMM's fused SGD does (PyTorch's SGD refuses weight decay with a sparse
        gradient). Each backward steps at once: a forward called twice before one
        ``backward`` steps twice (the same sum for SGD without weight decay), and
        a table that the graph also reads elsewhere (a tied output layer) must not
        use it: the step bumps the table's autograd version, so such a graph
        raises in its backward. The table must be contiguous (``ValueError`` in
        the backward otherwise). A bag layer must pool with ``"sum"`` or
        ``"mean"``. Replaces an Adagrad step set before. Returns the module."""
        if lr is None:
            self._step_in_backward = None
            return self
        self._check_fused()
        _check_rates(lr=lr, weight_decay=weight_decay)
        self._step_in_backward = _Sgd(float(lr), float(weight_decay))
        return self

    def adagrad_in_backward(
        self,
        lr: Optional[float] = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        state: Optional[dict] = None,
    ):
        """Makes the backward an Adagrad step on ``weight``, fused by the crate; ``lr=None`` undoes it.

        ``torch.optim.Adagrad``'s arguments and rule, on the rows the forward
        read: with ``g`` the row's summed gradient (as for
        :meth:`sgd_in_backward`) plus ``weight_decay * w``, ``sum += g * g`` and
        ``w -= clr * g / (sqrt(sum) + eps)``, ``clr = lr / (1 + (step - 1) * lr_decay)``
        for the ``step``-th backward; untouched rows keep their accumulators, as
        PyTorch's Adagrad does on a sparse gradient (with weight decay, which
        PyTorch refuses on a sparse gradient, the touched rows decay only).

        The accumulators start at ``initial_accumulator_value``, or come from
        ``state``: a dict as ``torch.optim.Adagrad`` keeps for a parameter
        (``{"step": ..., "sum": ...}``, e.g. ``opt.state[weight]``), whose
        ``sum`` tensor is then updated in place. :meth:`adagrad_state` returns
        that dict for a checkpoint or to go on with PyTorch's optimiser. As with
        :meth:`sgd_in_backward`, ``weight.grad`` stays ``None`` and each
        backward steps at once. Replaces an SGD step set before. Returns the
        module."""
        if lr is None:
            self._step_in_backward = None
            return self
        self._check_fused()
        _check_rates(
            lr=lr,
            lr_decay=lr_decay,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            eps=eps,
        )
        shape = tuple(self.weight.shape)
        if state is None:
            state_sum = torch.full(shape, float(initial_accumulator_value), dtype=torch.float32)
            step = 0
        else:
            state_sum, step = state["sum"], int(state["step"])
            if not isinstance(state_sum, Tensor) or state_sum.dtype != torch.float32:
                raise ValueError("state['sum'] must be a float32 tensor")
            if tuple(state_sum.shape) != shape or not state_sum.is_contiguous():
                raise ValueError(
                    f"state['sum'] must be a contiguous tensor of weight's shape {list(shape)}, "
                    f"got {list(state_sum.shape)}"
                )
            if state_sum.device.type != "cpu" or step < 0:
                raise ValueError("state['sum'] must be on the CPU and state['step'] >= 0")
        self._step_in_backward = _Adagrad(
            float(lr), float(lr_decay), float(weight_decay), float(eps), state_sum, step
        )
        return self

    def adagrad_state(self) -> Optional[dict]:
        """The Adagrad step's state, ``{"step": tensor, "sum": tensor}`` as
        ``torch.optim.Adagrad`` keeps it (the ``sum`` tensor itself, not a copy);
        ``None`` unless :meth:`adagrad_in_backward` is on."""
        step = self._step_in_backward
        if not isinstance(step, _Adagrad):
            return None
        return {"step": torch.tensor(float(step.step)), "sum": step.sum}


class _EmbeddingFunction(torch.autograd.Function):
    """The lookup and its backward (dense or sparse) on the crate's kernels."""

    @staticmethod
    def forward(ctx, weight, ids, padding_idx, scale_grad_by_freq, sparse):
        out = _lookup(weight, ids, padding_idx)
        ctx.save_for_backward(ids)
        ctx.shape = tuple(weight.shape)
        ctx.options = (padding_idx, scale_grad_by_freq, sparse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        (ids,) = ctx.saved_tensors
        padding_idx, scale_grad_by_freq, sparse = ctx.options
        num_embeddings, embedding_dim = ctx.shape
        _check_table(grad_out, "grad_output")
        batch = _lookup_batch(ids, grad_out, padding_idx, scale_grad_by_freq)
        if sparse:
            rows, values = batch.sparse_backward(num_embeddings)
            grad = _sparse(rows, values, num_embeddings, embedding_dim)
        else:
            # Every row is written (untouched ones with zeros): no need to zero it first.
            grad = _dense_grad((num_embeddings, embedding_dim))
            batch.dense_backward(num_embeddings, grad)
            grad = torch.from_numpy(grad)
        return grad, None, None, None, None


class _Batch:
    """What a backward or a fused step needs of a batch, as NumPy arrays: the
    ids, the output gradient, and for bags (``bag`` not ``None``) their
    offsets and ``mode``, ``per_sample_weights`` and ``include_last_offset``."""

    def __init__(self, ids, grad_out, padding_idx, scale_grad_by_freq, bag=None) -> None:
        self.ids, self.grad_out, self.bag = ids, grad_out, bag
        self.options = {"padding_idx": padding_idx, "scale_grad_by_freq": scale_grad_by_freq}

    def sparse_backward(self, num_embeddings: int):
        if self.bag is None:
            return _native.embedding_sparse_backward(
                self.grad_out, self.ids, num_embeddings, **self.options
            )
        offsets, options = self.bag
        return _native.embedding_bag_sparse_backward(
            self.grad_out, self.ids, num_embeddings, offsets, **options, **self.options
        )

    def dense_backward(self, num_embeddings: int, out, max_indices=None) -> None:
        """Into ``out``; a max bag takes the forward's ``max_indices``."""
        if self.bag is None:
            _native.embedding_dense_backward(
                self.grad_out, self.ids, num_embeddings, **self.options, out=out
            )
        else:
            offsets, options = self.bag
            _native.embedding_bag_backward(
                self.grad_out, self.ids, num_embeddings, offsets, **options, **self.options,
                max_indices=max_indices, out=out,
            )


def _bag_batch(ids, offsets, grad_out, per_sample_weights, options) -> _Batch:
    """A bag layer's batch (``options`` as `EmbeddingBag.forward` packs them)."""
    mode, include_last_offset, padding_idx, scale_grad_by_freq, _ = options
    bag = {
        "mode": mode,
        "per_sample_weights": None if per_sample_weights is None else _array(per_sample_weights),
        "include_last_offset": include_last_offset,
    }
    offsets = None if offsets is None else _array(offsets)
    return _Batch(_array(ids), _array(grad_out), padding_idx, scale_grad_by_freq, (offsets, bag))


def _lookup_batch(ids: Tensor, grad_out: Tensor, padding_idx, scale_grad_by_freq) -> _Batch:
    """The lookup's batch for its backward or fused step.

    Autograd often hands the lookup a gradient that repeats rows: ``out.sum()``
    gives one value broadcast to every element, ``out.mean(1)`` each
    sequence's row broadcast over its positions (stride 0 along the repeated
    dimensions). Copied out, such a gradient is as large as the output (50 MB
    for 16 384 ids of 768 values). Instead the distinct rows are taken, ``M``
    of them each repeated over ``T`` consecutive positions, and the ids read
    as ``M`` bags of ``T``: a sum bag's gradient hands each position its bag's
    row, summed per table row in the same order, so the result has the same
    bits (tests/test_backward.py checks it) without the copy."""
    shape, strides = grad_out.shape[:-1], grad_out.stride()[:-1]
    k = len(shape)
    while k > 0 and (strides[k - 1] == 0 or shape[k - 1] == 1):
        k -= 1
    repeats = math.prod(shape[k:])
    if repeats <= 1 or grad_out.numel() == 0:
        return _Batch(_array(ids), _array(grad_out), padding_idx, scale_grad_by_freq)
    sequences = math.prod(shape[:k])
    rows = _array(grad_out[(slice(None),) * k + (0,) * (len(shape) - k)])
    bags = (None, {"mode": "sum", "per_sample_weights": None, "include_last_offset": False})
    return _Batch(
        _array(ids).reshape(sequences, repeats),
        rows.reshape(sequences, grad_out.shape[-1]),
        padding_idx,
        scale_grad_by_freq,
        bags,
    )


class _Sgd:
    """The fused SGD step of `sgd_in_backward`."""

    def __init__(self, lr: float, weight_decay: float) -> None:
        self.lr, self.weight_decay = lr, weight_decay

    def run(self, table, batch: _Batch) -> None:
        if batch.bag is None:
            _native.embedding_sparse_sgd_step(
                table, batch.ids, batch.grad_out, self.lr, self.weight_decay, **batch.options
            )
        else:
            offsets, options = batch.bag
            _native.embedding_bag_sparse_sgd_step(
                table, batch.ids, offsets, batch.grad_out, self.lr, self.weight_decay,
                **options, **batch.options,
            )


class _Adagrad:
    """The fused Adagrad step of `adagrad_in_backward`, and its state: the
    accumulators (``sum``) and the number of steps taken (``step``), as
    ``torch.optim.Adagrad`` keeps them for a parameter."""

    def __init__(self, lr, lr_decay, weight_decay, eps, state_sum: Tensor, step: int) -> None:
        self.lr, self.lr_decay, self.weight_decay, self.eps = lr, lr_decay, weight_decay, eps
        self.sum, self.step = state_sum, step

    def run(self, table, batch: _Batch) -> None:
        rule = {"lr_decay": self.lr_decay, "weight_decay": self.weight_decay, "eps": self.eps}
        state = self.sum.detach().numpy()
        if batch.bag is None:
            _native.embedding_sparse_adagrad_step(
                table, state, batch.ids, batch.grad_out, self.lr, self.step + 1,
                **rule, **batch.options,
            )
        else:
            offsets, options = batch.bag
            _native.embedding_bag_sparse_adagrad_step(
                table, state, batch.ids, offsets, batch.grad_out, self.lr, self.step + 1,
                **rule, **options, **batch.options,
            )
        # Counted only once the step is taken: a refused step changes nothing.
        self.step += 1


def _step_table(step, table: Tensor, batch: _Batch) -> None:
    """Runs `step` on `table`'s own memory (never a copy: a non-contiguous
    table is refused by the step, ValueError, rather than updated in a copy
    thrown away), then bumps its autograd version: written behind autograd's
    back, so that a graph that saved the table elsewhere (a tied layer)
    raises instead of using new values."""
    step.run(table.detach().numpy(), batch)
    torch.autograd.graph.increment_version(table)


class _StepInBackward(torch.autograd.Function):
    """The lookup whose backward is an optimiser step on the table, fused by the crate.

    The backward updates ``weight`` in place (the touched rows, each by its
    summed gradient) and returns no gradient for it, so ``weight.grad`` stays
    ``None`` and no optimiser is needed for it."""

    @staticmethod
    def forward(ctx, weight, ids, padding_idx, scale_grad_by_freq, step):
        out = _lookup(weight, ids, padding_idx)
        ctx.save_for_backward(ids)
        # The table itself, not a copy: the step writes into it.
        ctx.table = weight
        ctx.options = (padding_idx, scale_grad_by_freq, step)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (ids,) = ctx.saved_tensors
        padding_idx, scale_grad_by_freq, step = ctx.options
        _check_table(grad_out, "grad_output")
        batch = _lookup_batch(ids, grad_out, padding_idx, scale_grad_by_freq)
        _step_table(step, ctx.table, batch)
        return None, None, None, None, None


def _check_rates(**values: float) -> None:
    for name, value in values.items():
        if not value >= 0.0 or value == float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")


class Embedding(_Table):
    """``torch.nn.Embedding`` on the crate's kernels: same arguments, same ``weight``.

    Differences from PyTorch: CPU float32 only; ``embedding_dim`` must be
    positive; a bad id raises ``IndexError`` (PyTorch: ``IndexError`` too, with
    another message), a bad argument ``ValueError`` (PyTorch: ``AssertionError``
    for ``padding_idx``); ``sparse=True`` gradients come coalesced.
    """

    __constants__ = [
        "num_embeddings",
        "embedding_dim",
        "padding_idx",
        "max_norm",
        "norm_type",
        "scale_grad_by_freq",
        "sparse",
    ]

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: Optional[int] = None,
        max_norm: Optional[float] = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: Optional[Tensor] = None,
        _freeze: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        _check_factory(device, dtype)
        if embedding_dim <= 0:
            raise ValueError(f"embedding_dim must be positive, got {embedding_dim}")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = _padding_row(padding_idx, num_embeddings)
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        self.weight = _parameter(num_embeddings, embedding_dim, _weight, not _freeze)
        if _weight is None:
            self.reset_parameters()

    def forward(self, input: Tensor) -> Tensor:
        # `self.weight` is an `nn.Module` attribute lookup (a Python call): read it once.
        weight = self.weight
        _check_table(weight)
        _check_ids(input, "input")
        if self.max_norm is not None:
            # Every id is checked before the table changes.
            _native.embedding(_array(weight), _array(input))
            with torch.no_grad():
                torch.embedding_renorm_(weight, input, self.max_norm, self.norm_type)
        if not _needs_graph(weight):
            return _lookup(weight, input, self.padding_idx)
        if self._step_in_backward is not None:
            return _StepInBackward.apply(
                weight, input, self.padding_idx, self.scale_grad_by_freq, self._step_in_backward
            )
        return _EmbeddingFunction.apply(
            weight, input, self.padding_idx, self.scale_grad_by_freq, self.sparse
        )

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        if self.sparse:
            s += ", sparse=True"
        return s

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        padding_idx: Optional[int] = None,
        max_norm: Optional[float] = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> "Embedding":
        """A layer over ``embeddings`` (2-D), frozen unless ``freeze=False``, as PyTorch's."""
        if embeddings.dim() != 2:
            raise ValueError(f"embeddings must be 2-D, got {embeddings.dim()}-D")
        rows, cols = embeddings.shape
        return cls(
            num_embeddings=rows,
            embedding_dim=cols,
            _weight=embeddings,
            _freeze=freeze,
            padding_idx=padding_idx,
            max_norm=max_norm,
            norm_type=norm_type,
            scale_grad_by_freq=scale_grad_by_freq,
            sparse=sparse,
        )


class _BagFunction(torch.autograd.Function):
    """The bag forward and its backward on the crate's kernels.

    The gradient of ``per_sample_weights`` (which the crate has no kernel
    for) is computed here with torch: each position's gradient is the dot
    product of its bag's output gradient with its row.
    """

    @staticmethod
    def forward(ctx, weight, per_sample_weights, ids, offsets, options):
        out, max_indices = _bag_forward(weight, per_sample_weights, ids, offsets, options)
        max_indices = None if max_indices is None else torch.from_numpy(max_indices)
        ctx.save_for_backward(weight, per_sample_weights, ids, offsets, max_indices)
        ctx.options = options
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad_out):
        weight, per_sample_weights, ids, offsets, max_indices = ctx.saved_tensors
        _, include_last_offset, padding_idx, _, sparse = ctx.options
        num_embeddings, embedding_dim = weight.shape
        _check_table(grad_out, "grad_output")
        batch = _bag_batch(ids, offsets, grad_out, per_sample_weights, ctx.options)
        grad_weight = grad_weights = None
        if ctx.needs_input_grad[0]:
            if sparse:
                rows, values = batch.sparse_backward(num_embeddings)
                grad_weight = _sparse(rows, values, num_embeddings, embedding_dim)
            else:
                grad_weight = _dense_grad((num_embeddings, embedding_dim))
                indices = None if max_indices is None else _array(max_indices)
                batch.dense_backward(num_embeddings, grad_weight, indices)
                grad_weight = torch.from_numpy(grad_weight)
        if ctx.needs_input_grad[1]:
            grad_weights = _sample_weights_grad(
                grad_out, weight, ids, offsets, include_last_offset, padding_idx
            )
        return grad_weight, grad_weights, None, None, None


class _BagStepInBackward(torch.autograd.Function):
    """The bag forward whose backward is an optimiser step on the table, fused
    by the crate (see `_StepInBackward`); ``per_sample_weights`` still gets
    its gradient, from the rows as the forward read them."""

    @staticmethod
    def forward(ctx, weight, per_sample_weights, ids, offsets, options, step):
        out, _ = _bag_forward(weight, per_sample_weights, ids, offsets, options)
        ctx.save_for_backward(per_sample_weights, ids, offsets)
        ctx.table = weight
        ctx.options = (options, step)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad_out):
        per_sample_weights, ids, offsets = ctx.saved_tensors
        options, step = ctx.options
        _, include_last_offset, padding_idx, _, _ = options
        _check_table(grad_out, "grad_output")
        grad_weights = None
        if ctx.needs_input_grad[1]:
            # Before the step changes the rows.
            grad_weights = _sample_weights_grad(
                grad_out, ctx.table, ids, offsets, include_last_offset, padding_idx
            )
        batch = _bag_batch(ids, offsets, grad_out, per_sample_weights, options)
        _step_table(step, ctx.table, batch)
        return None, grad_weights, None, None, None, None


def _bag_forward(weight, per_sample_weights, ids, offsets, options):
    """The crate's bag forward on the tensors' NumPy views: ``(out, max_indices or None)``."""
    mode, include_last_offset, padding_idx, _, _ = options
    weights = None if per_sample_weights is None else _array(per_sample_weights)
    offsets_array = None if offsets is None else _array(offsets)
    return _native.embedding_bag(
        _array(weight),
        _array(ids),
        offsets_array,
        mode,
        weights,
        include_last_offset,
        padding_idx,
        _bag_output(weight, ids, offsets, include_last_offset),
    )


def _bag_output(weight, ids, offsets, include_last_offset) -> "Optional[np.ndarray]":
    """A fresh unzeroed output for a bag forward (see ``_fresh``): one row a bag.

    ``None`` where the arguments cannot make bags (no offsets for 1-D ids, a table that
    is not 2-D, say): the NumPy function then raises its error. The bag forward writes every element, an
    empty bag's row with zeros."""
    if weight.dim() != 2:
        return None
    if ids.dim() == 2 and offsets is None:
        bags = ids.shape[0]
    elif ids.dim() == 1 and offsets is not None and offsets.dim() == 1:
        bags = max(offsets.shape[0] - int(include_last_offset), 0)
    else:
        return None
    return _fresh((bags, weight.shape[1]))


def _sample_weights_grad(grad_out, weight, ids, offsets, include_last_offset, padding_idx):
    """d loss / d per_sample_weights[p] = <grad_out[bag(p)], weight[ids[p]]>; 0 off any bag or at padding."""
    flat = ids.reshape(-1).long()
    num_bags = grad_out.shape[0]
    if ids.dim() == 2:
        bag_of = torch.arange(ids.shape[0]).repeat_interleave(ids.shape[1])
    else:
        starts = offsets.long()
        bag_of = torch.searchsorted(starts, torch.arange(flat.numel()), right=True) - 1
    kept = bag_of < num_bags
    if padding_idx is not None:
        kept &= flat != padding_idx
    if num_bags == 0:
        return torch.zeros(ids.shape, dtype=grad_out.dtype)
    rows = weight.detach()[flat]
    grads = grad_out[bag_of.clamp(max=num_bags - 1)]
    return ((grads * rows).sum(1) * kept).reshape(ids.shape)


class EmbeddingBag(_Table):
    """``torch.nn.EmbeddingBag`` on the crate's kernels: same arguments, same ``weight``.

    ``forward(input, offsets=None, per_sample_weights=None)``: 1-D ids with
    ``offsets``, or 2-D ids ``[B, N]`` (a bag per row). Differences from
    PyTorch: CPU float32 only; ``sparse=True`` with ``mode="max"`` is refused
    (PyTorch documents it as unsupported); sparse gradients come coalesced.
    """

    __constants__ = [
        "num_embeddings",
        "embedding_dim",
        "max_norm",
        "norm_type",
        "scale_grad_by_freq",
        "mode",
        "sparse",
        "include_last_offset",
        "padding_idx",
    ]

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: Optional[float] = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight: Optional[Tensor] = None,
        include_last_offset: bool = False,
        padding_idx: Optional[int] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        _check_factory(device, dtype)
        if embedding_dim <= 0:
            raise ValueError(f"embedding_dim must be positive, got {embedding_dim}")
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f'mode must be "sum", "mean" or "max", got {mode!r}')
        if sparse and mode == "max":
            raise ValueError('sparse gradients are not supported with mode="max" (as in PyTorch)')
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.mode = mode
        self.sparse = sparse
        self.include_last_offset = include_last_offset
        self.padding_idx = _padding_row(padding_idx, num_embeddings)
        self.weight = _parameter(num_embeddings, embedding_dim, _weight, True)
        if _weight is None:
            self.reset_parameters()

    def forward(
        self,
        input: Tensor,
        offsets: Optional[Tensor] = None,
        per_sample_weights: Optional[Tensor] = None,
    ) -> Tensor:
        weight = self.weight  # one `nn.Module` attribute lookup (see `Embedding.forward`)
        _check_table(weight)
        _check_ids(input, "input")
        if offsets is not None:
            _check_ids(offsets, "offsets")
        if per_sample_weights is not None:
            _check_table(per_sample_weights, "per_sample_weights")
        options = (
            self.mode,
            self.include_last_offset,
            self.padding_idx,
            self.scale_grad_by_freq,
            self.sparse,
        )
        if self.max_norm is not None:
            # Every argument and id is checked before the table changes.
            _bag_forward(weight, per_sample_weights, input, offsets, options)
            with torch.no_grad():
                torch.embedding_renorm_(weight, input, self.max_norm, self.norm_type)
        if not _needs_graph(weight, per_sample_weights):
            out, _ = _bag_forward(weight, per_sample_weights, input, offsets, options)
            return torch.from_numpy(out)
        if self._step_in_backward is not None and weight.requires_grad:
            return _BagStepInBackward.apply(
                weight, per_sample_weights, input, offsets, options, self._step_in_backward
            )
        return _BagFunction.apply(weight, per_sample_weights, input, offsets, options)

    def _check_fused(self) -> None:
        if self.mode == "max":
            raise ValueError('a fused step needs mode "sum" or "mean": max\'s gradient is not fused')

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        s += f", mode={self.mode!r}"
        if self.sparse:
            s += ", sparse=True"
        if self.include_last_offset:
            s += ", include_last_offset=True"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        max_norm: Optional[float] = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        include_last_offset: bool = False,
        padding_idx: Optional[int] = None,
    ) -> "EmbeddingBag":
        """A layer over ``embeddings`` (2-D), frozen unless ``freeze=False``, as PyTorch's."""
        if embeddings.dim() != 2:
            raise ValueError(f"embeddings must be 2-D, got {embeddings.dim()}-D")
        rows, cols = embeddings.shape
        bag = cls(
            num_embeddings=rows,
            embedding_dim=cols,
            _weight=embeddings,
            max_norm=max_norm,
            norm_type=norm_type,
            scale_grad_by_freq=scale_grad_by_freq,
            mode=mode,
            sparse=sparse,
            include_last_offset=include_last_offset,
            padding_idx=padding_idx,
        )
        bag.weight.requires_grad = not freeze
        return bag
