"""The fused optimiser steps as operators (see ``_ops.py`` for the rest): the steps
themselves (``sgd_step_``, ``adagrad_step_``, ``rowwise_adagrad_step_``, which update a
table and its state in place), the forwards whose backward is one of them
(``embedding_with_step``, ``embedding_bag_with_step``), and the modules' step
settings (`Sgd`, `Adagrad`, `RowWiseAdagrad`).
"""

from typing import Optional

import torch
from torch import Tensor

from ._arrays import _check_ids, _check_table
from ._errors import ArgumentError
from ._ops import (
    _Batch,
    _bag,
    _bag_batch,
    _check_bag,
    _check_fake,
    _lookup,
    _lookup_batch,
    _needs_grad,
    _num_bags,
    _operator,
    _sample_weights_grad,
)


def _step_batch(indices, offsets, per_sample_weights, grad_output, bag_mode, include_last_offset,
                padding_idx, scale_grad_by_freq) -> _Batch:
    """The batch of a step: the lookup's when ``bag_mode`` is ``None``, else a bag's."""
    _check_table(grad_output, "grad_output")
    if bag_mode is None:
        return _lookup_batch(indices, grad_output, padding_idx, scale_grad_by_freq)
    return _bag_batch(
        indices, offsets, grad_output, per_sample_weights, bag_mode, include_last_offset,
        padding_idx, scale_grad_by_freq,
    )


def _table(weight: Tensor, name: str = "weight"):
    """``weight``'s own memory as NumPy sees it (never a copy: a non-contiguous table
    is refused by the step, ``ArgumentError``, rather than updated in a copy thrown
    away)."""
    _check_table(weight, name)
    return weight.detach().numpy()


def _written(*tensors: Tensor) -> None:
    """Bumps the autograd version of tensors written behind autograd's back, so that a
    graph that saved them before (a tied layer) raises instead of using new values.
    (The operator bumps them too when dispatched; once more does no harm.)"""
    for tensor in tensors:
        torch.autograd.graph.increment_version(tensor)


@_operator(("weight",))
def sgd_step_(
    weight: Tensor,
    indices: Tensor,
    offsets: Optional[Tensor],
    per_sample_weights: Optional[Tensor],
    grad_output: Tensor,
    bag_mode: Optional[str],
    include_last_offset: bool,
    padding_idx: Optional[int],
    scale_grad_by_freq: bool,
    lr: float,
    weight_decay: float = 0.0,
) -> None:
    """One SGD step of a batch's gradient on the rows it touched, in place: the
    lookup's batch (``bag_mode=None``) or a bag forward's (``"sum"``, ``"mean"``).

    (``bag_mode``, not ``mode`` as elsewhere: a compiled graph calls an operator that
    mutates its arguments through ``auto_functionalized``, which takes them as keywords
    beside a ``mode`` of its own.)"""
    batch = _step_batch(indices, offsets, per_sample_weights, grad_output, bag_mode,
                        include_last_offset, padding_idx, scale_grad_by_freq)
    batch.sgd(_table(weight), lr, weight_decay)
    _written(weight)


@sgd_step_.register_fake
def _(weight, indices, offsets, per_sample_weights, grad_output, bag_mode, include_last_offset,
      padding_idx, scale_grad_by_freq, lr, weight_decay=0.0):
    _check_fake(weight, indices)
    return None


@_operator(("weight", "state_sum", "state_step"))
def adagrad_step_(
    weight: Tensor,
    state_sum: Tensor,
    state_step: Tensor,
    indices: Tensor,
    offsets: Optional[Tensor],
    per_sample_weights: Optional[Tensor],
    grad_output: Tensor,
    bag_mode: Optional[str],
    include_last_offset: bool,
    padding_idx: Optional[int],
    scale_grad_by_freq: bool,
    lr: float,
    lr_decay: float = 0.0,
    weight_decay: float = 0.0,
    eps: float = 1e-10,
) -> None:
    """One Adagrad step (``torch.optim.Adagrad``'s rule) on the touched rows of
    ``weight`` and of their accumulators ``state_sum``, in place; ``state_step``
    (a tensor of one number, as ``torch.optim.Adagrad`` keeps it) counts the steps
    taken and goes up by one once this one is."""
    batch = _step_batch(indices, offsets, per_sample_weights, grad_output, bag_mode,
                        include_last_offset, padding_idx, scale_grad_by_freq)
    if state_step.numel() != 1:
        raise ArgumentError(f"state_step must hold one number, got shape {list(state_step.shape)}")
    step = int(state_step.item()) + 1
    rule = {"lr_decay": lr_decay, "weight_decay": weight_decay, "eps": eps}
    batch.adagrad(_table(weight), _table(state_sum, "state_sum"), step, lr, rule)
    _written(weight, state_sum)
    # Counted only once the step is taken: a refused step changes nothing.
    state_step.fill_(step)


@adagrad_step_.register_fake
def _(weight, state_sum, state_step, indices, offsets, per_sample_weights, grad_output, bag_mode,
      include_last_offset, padding_idx, scale_grad_by_freq, lr, lr_decay=0.0,
      weight_decay=0.0, eps=1e-10):
    _check_fake(weight, indices)
    return None


@_operator(("weight", "state"))
def rowwise_adagrad_step_(
    weight: Tensor,
    state: Tensor,
    indices: Tensor,
    offsets: Optional[Tensor],
    per_sample_weights: Optional[Tensor],
    grad_output: Tensor,
    bag_mode: Optional[str],
    include_last_offset: bool,
    padding_idx: Optional[int],
    scale_grad_by_freq: bool,
    lr: float,
    weight_decay: float = 0.0,
    eps: float = 1e-8,
) -> None:
    """One row-wise Adagrad step (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``: one accumulator a
    row, fed the mean square of the row's gradient) on the touched rows of ``weight``
    and their accumulators ``state`` (``[num_embeddings]``), in place."""
    batch = _step_batch(indices, offsets, per_sample_weights, grad_output, bag_mode,
                        include_last_offset, padding_idx, scale_grad_by_freq)
    _check_table(state, "state")
    batch.rowwise_adagrad(_table(weight), state.detach().numpy(), lr, weight_decay, eps)
    _written(weight, state)


@rowwise_adagrad_step_.register_fake
def _(weight, state, indices, offsets, per_sample_weights, grad_output, bag_mode,
      include_last_offset, padding_idx, scale_grad_by_freq, lr, weight_decay=0.0, eps=1e-8):
    _check_fake(weight, indices)
    return None


class Sgd:
    """The fused SGD step of `sgd_in_backward`: its rates."""

    def __init__(self, lr: float, weight_decay: float) -> None:
        self.lr, self.weight_decay = lr, weight_decay

    def args(self):
        """The step's arguments to `embedding_with_step` / `embedding_bag_with_step`."""
        return ("sgd", self.lr, 0.0, self.weight_decay, 0.0, None, None)


class Adagrad:
    """The fused Adagrad step of `adagrad_in_backward`, and its state: the
    accumulators (``sum``) and the number of steps taken (``step``, a float32
    tensor of one number), as ``torch.optim.Adagrad`` keeps them for a parameter."""

    def __init__(self, lr, lr_decay, weight_decay, eps, state_sum: Tensor, step: Tensor) -> None:
        self.lr, self.lr_decay, self.weight_decay, self.eps = lr, lr_decay, weight_decay, eps
        self.sum, self.step = state_sum, step

    def args(self):
        return ("adagrad", self.lr, self.lr_decay, self.weight_decay, self.eps, self.sum, self.step)


class RowWiseAdagrad:
    """The fused row-wise Adagrad step of `rowwise_adagrad_in_backward`, and its state:
    one accumulator a row (``state``, float32 ``[num_embeddings]``)."""

    def __init__(self, lr, weight_decay, eps, state: Tensor) -> None:
        self.lr, self.weight_decay, self.eps, self.state = lr, weight_decay, eps, state

    def args(self):
        return ("rowwise_adagrad", self.lr, 0.0, self.weight_decay, self.eps, self.state, None)


def _step(ctx, grad_output, indices, offsets, per_sample_weights, mode, include_last_offset):
    """The fused backward: the step ``ctx`` holds, on the table it saved."""
    weight, state_sum, state_step = ctx.table
    optimizer, lr, lr_decay, weight_decay, eps = ctx.step
    batch = (indices, offsets, per_sample_weights, grad_output, mode, include_last_offset,
             *ctx.options)
    if optimizer == "sgd":
        sgd_step_(weight, *batch, lr, weight_decay)
    elif optimizer == "rowwise_adagrad":
        rowwise_adagrad_step_(weight, state_sum, *batch, lr, weight_decay, eps)
    else:
        adagrad_step_(weight, state_sum, state_step, *batch, lr, lr_decay, weight_decay, eps)


def _check_optimizer(optimizer: str, state_sum, state_step) -> None:
    if optimizer == "adagrad":
        if state_sum is None or state_step is None:
            raise ArgumentError("the adagrad step needs state_sum and state_step")
    elif optimizer == "rowwise_adagrad":
        if state_sum is None:
            raise ArgumentError("the rowwise_adagrad step needs its state (state_sum)")
    elif optimizer != "sgd":
        raise ArgumentError(
            f'optimizer must be "sgd", "adagrad" or "rowwise_adagrad", got {optimizer!r}'
        )


@_operator(())
def embedding_with_step(
    weight: Tensor,
    indices: Tensor,
    padding_idx: Optional[int],
    scale_grad_by_freq: bool,
    optimizer: str,
    lr: float,
    lr_decay: float,
    weight_decay: float,
    eps: float,
    state_sum: Optional[Tensor] = None,
    state_step: Optional[Tensor] = None,
) -> Tensor:
    """The lookup whose backward is a fused optimiser step on ``weight`` (``"sgd"``,
    ``"adagrad"`` with ``state_sum`` and ``state_step``, or ``"rowwise_adagrad"`` with its
    accumulators a row as ``state_sum``), which returns no gradient for it."""
    _check_table(weight)
    _check_ids(indices, "indices")
    _check_optimizer(optimizer, state_sum, state_step)
    return _lookup(weight, indices, padding_idx)


@embedding_with_step.register_fake
def _(weight, indices, padding_idx, scale_grad_by_freq, optimizer, lr, lr_decay, weight_decay,
      eps, state_sum=None, state_step=None):
    _check_fake(weight, indices)
    _check_optimizer(optimizer, state_sum, state_step)
    return weight.new_empty((*indices.shape, weight.shape[1]))


def _with_step_setup(ctx, inputs, output) -> None:
    weight, indices, padding_idx, scale_grad_by_freq, *step, state_sum, state_step = inputs
    # The table itself, not a copy: the step writes into it. Its version is checked
    # as the backward unpacks it, before the step bumps it.
    ctx.save_for_backward(weight, indices, state_sum, state_step)
    ctx.options = (padding_idx, scale_grad_by_freq)
    ctx.step = step


def _with_step_backward(ctx, grad_output):
    weight, indices, state_sum, state_step = ctx.saved_tensors
    ctx.table = (weight, state_sum, state_step)
    _step(ctx, grad_output, indices, None, None, None, False)
    return (None,) * 11


embedding_with_step.register_autograd(_with_step_backward, setup_context=_with_step_setup)


@_operator(())
def embedding_bag_with_step(
    weight: Tensor,
    indices: Tensor,
    offsets: Optional[Tensor],
    per_sample_weights: Optional[Tensor],
    mode: str,
    include_last_offset: bool,
    padding_idx: Optional[int],
    scale_grad_by_freq: bool,
    optimizer: str,
    lr: float,
    lr_decay: float,
    weight_decay: float,
    eps: float,
    state_sum: Optional[Tensor] = None,
    state_step: Optional[Tensor] = None,
) -> Tensor:
    """The bag forward (sum or mean) whose backward is a fused optimiser step on
    ``weight``; ``per_sample_weights`` still get their gradient, from the rows as the
    forward read them."""
    _check_bag(weight, indices, offsets, per_sample_weights, halves=False)
    _check_optimizer(optimizer, state_sum, state_step)
    if mode == "max":
        raise ArgumentError('a fused step needs mode "sum" or "mean": max\'s gradient is not fused')
    out, _ = _bag(weight, indices, offsets, per_sample_weights, mode, include_last_offset, padding_idx)
    return out


@embedding_bag_with_step.register_fake
def _(weight, indices, offsets, per_sample_weights, mode, include_last_offset, padding_idx,
      scale_grad_by_freq, optimizer, lr, lr_decay, weight_decay, eps, state_sum=None,
      state_step=None):
    _check_fake(weight, indices)
    _check_optimizer(optimizer, state_sum, state_step)
    return weight.new_empty((_num_bags(indices, offsets, include_last_offset), weight.shape[1]))


def _bag_with_step_setup(ctx, inputs, output) -> None:
    (weight, indices, offsets, per_sample_weights, mode, include_last_offset, padding_idx,
     scale_grad_by_freq, *step, state_sum, state_step) = inputs
    ctx.save_for_backward(weight, indices, offsets, per_sample_weights, state_sum, state_step)
    ctx.bag = (mode, include_last_offset)
    ctx.options = (padding_idx, scale_grad_by_freq)
    ctx.step = step


def _bag_with_step_backward(ctx, grad_output):
    weight, indices, offsets, per_sample_weights, state_sum, state_step = ctx.saved_tensors
    mode, include_last_offset = ctx.bag
    grad_weights = None
    if _needs_grad(ctx, 3):
        # Before the step changes the rows.
        grad_weights = _sample_weights_grad(
            grad_output, weight, indices, offsets, include_last_offset, ctx.options[0]
        )
    ctx.table = (weight, state_sum, state_step)
    _step(ctx, grad_output, indices, offsets, per_sample_weights, mode, include_last_offset)
    return (None, None, None, grad_weights) + (None,) * 11


embedding_bag_with_step.register_autograd(
    _bag_with_step_backward, setup_context=_bag_with_step_setup
)
