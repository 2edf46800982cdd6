"""The autograd functions of the modules: the lookup and the bag forward, each with
its backward (dense or sparse) or with an optimiser step fused into it, all on
the crate's kernels.
"""

import math

import torch
from torch import Tensor

from .. import _native
from ._errors import ArgumentError, torch_errors
from ._arrays import (
    _array,
    _check_table,
    _dense_grad,
    _lookup,
    _sparse,
)


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
    @torch_errors
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
    table is refused by the step, ArgumentError, rather than updated in a copy
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
    @torch_errors
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
            raise ArgumentError(f"{name} must be a finite number >= 0, got {value}")


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
    @torch_errors
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
    @torch_errors
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
    """The crate's bag forward on the tensors' NumPy views: ``(out, max_indices or None)``,
    ``out`` allocated unzeroed by the kernel, which writes it whole."""
    mode, include_last_offset, padding_idx, _, _ = options
    weights = None if per_sample_weights is None else _array(per_sample_weights)
    offsets_array = None if offsets is None else _array(offsets)
    return _native.embedding_bag(
        _array(weight), _array(ids), offsets_array, mode, weights, include_last_offset, padding_idx
    )


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
