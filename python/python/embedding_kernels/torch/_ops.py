"""The crate's kernels as PyTorch operators, ``torch.ops.embedding_kernels.*``.

Each is an operator of a ``torch.library.Library`` (`_Op`): a kernel that takes plain CPU tensors and
reaches the crate through their NumPy views (no copy for contiguous ones), a fake
kernel that gives the output's shape and dtype to ``torch.compile``, ``torch.export``
and the meta device, and, for the forwards, a registered autograd formula whose
backward is again an operator. A compiled or exported graph therefore holds these
operators as single nodes, and a ``torch.jit.trace`` records them.

============================  =====================================================
operator                      what it is
============================  =====================================================
``embedding``                 the lookup; its backward is one of the next two
``embedding_dense_backward``  the dense gradient of the table
``embedding_sparse_backward`` the coalesced gradient ``(rows, values)``
``embedding_bag``             the bag forward, ``(output, max_indices)``
``embedding_bag_backward``    the dense gradient of a bag forward
``embedding_bag_sparse_backward``  its coalesced gradient
``embedding_with_step``       the lookup whose backward is a fused optimiser step
``embedding_bag_with_step``   the bag forward whose backward is one
``sgd_step_``                 the fused SGD step on a table, in place (``_steps.py``)
``adagrad_step_``             the fused Adagrad step on a table and its state
``rowwise_adagrad_step_``     the fused row-wise Adagrad step (an accumulator a row)
``embedding_renorm_``         ``max_norm``: checks the batch, then renormalises
``keyed_segments``            a table's features of a jagged batch (``distributed``)
``packed_embedding_bag``      the bags of a packed table (``distributed``)
============================  =====================================================

The modules call them, except for an inference call in eager mode (autograd off
or nothing requiring grad, no compiler or tracer running), which goes straight to
the same kernel (`_direct`): an operator costs some microseconds of dispatch,
which is most of a small lookup's time.

Errors are the modules' (``_errors.py``): ``IndexError`` for a bad id, an
``ArgumentError`` (also a ``RuntimeError``) for the rest, raised before anything is
written.
"""

import math
from typing import Optional

import torch
from torch import Tensor

from .. import _native
from ._arrays import HALVES, _array, _check_ids, _check_table, _dense_grad
from ._errors import ArgumentError, NotSupportedError, torch_errors

_NS = "embedding_kernels"


def _direct() -> bool:
    """Whether a call may skip the operators: no ``torch.compile`` or ``torch.export``
    tracing it (``is_compiling`` first: those read it as a constant), no
    ``torch.jit.trace`` recording, and no ``TorchDispatchMode`` (``make_fx``) watching."""
    if torch.compiler.is_compiling():
        return False
    return torch._C._get_tracing_state() is None and torch._C._len_torch_dispatch_stack() == 0


# The operators' library: defined here, so that a model that calls them loads this module.
_LIBRARY = torch.library.Library(_NS, "DEF")


class _Op:
    """An operator and the function it runs. Called, it runs the function itself where
    nothing traces the call (`_direct`): under autograd through an
    ``autograd.Function`` made of the operator's own formula, so that eager training
    pays neither the dispatcher's cost per call nor a second copy of the formula.

    Defined through ``torch.library.Library`` with the schema ``infer_schema`` reads off
    the function's annotations, its kernel registered for the CPU: the same operator
    as ``torch.library.custom_op`` makes, without the Python wrappers that decorator
    puts around every call (several microseconds each)."""

    def __init__(self, impl, mutates_args) -> None:
        self.impl = impl
        self.name = f"{_NS}::{impl.__name__}"
        schema = torch.library.infer_schema(impl, mutates_args=mutates_args)
        _LIBRARY.define(impl.__name__ + schema)
        _LIBRARY.impl(impl.__name__, impl, "CPU")
        self.op = getattr(getattr(torch.ops, _NS), impl.__name__).default
        self.eager = None

    def register_fake(self, fake):
        torch.library.register_fake(self.name, fake, lib=_LIBRARY)
        return fake

    def register_autograd(self, backward, setup_context) -> None:
        torch.library.register_autograd(
            self.name, backward, setup_context=setup_context, lib=_LIBRARY
        )
        impl = self.impl

        # `forward(ctx, *args)` rather than a `setup_context` member: given one,
        # `Function.apply` binds its arguments through `inspect.signature` on every call.
        def forward(ctx, *args):
            output = impl(*args)
            setup_context(ctx, args, output)
            return output

        members = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
        self.eager = type(impl.__name__, (torch.autograd.Function,), members)

    def __call__(self, *args):
        if not _direct():
            return self.op(*args)
        if self.eager is not None and torch.is_grad_enabled():
            return self.eager.apply(*args)
        return self.impl(*args)


def _operator(mutates_args=()):
    """Makes a function an `_Op` named after it, its ``ValueError``s the modules'."""

    def wrap(impl) -> _Op:
        return _Op(torch_errors(impl), mutates_args)

    return wrap


def _check_fake(weight: Tensor, indices: Tensor, name: str = "weight") -> None:
    """The fake kernels' checks: what the real kernel would refuse of the dtypes and
    layouts, on the CPU or on the meta device (shapes only)."""
    if weight.device.type not in ("cpu", "meta"):
        raise ArgumentError(f"embedding_kernels runs on the CPU only, but {name} is on {weight.device}")
    if weight.dtype is not torch.float32 and not (name == "weight" and weight.dtype in HALVES):
        raise ArgumentError(f"embedding_kernels needs a float32 {name}, got {weight.dtype}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"indices must hold int32 or int64 ids, got {indices.dtype}")


# --- The lookup -------------------------------------------------------------------


@_operator(())
def embedding(
    weight: Tensor,
    indices: Tensor,
    padding_idx: Optional[int] = None,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """``weight[indices]`` (``F.embedding``); the last three arguments shape the backward.
    A float16 or bfloat16 ``weight`` serves inference (its backward raises)."""
    _check_table(weight, halves=True)
    _check_ids(indices, "indices")
    return _lookup(weight, indices, padding_idx)


@embedding.register_fake
def _(weight, indices, padding_idx=None, scale_grad_by_freq=False, sparse=False):
    _check_fake(weight, indices)
    return weight.new_empty((*indices.shape, weight.shape[1]))


def _lookup(weight: Tensor, ids: Tensor, padding_idx: Optional[int]) -> Tensor:
    """``weight[ids]`` by the crate's gather, into an array it allocates unzeroed and
    writes whole (NumPy's allocation: huge pages for large outputs, see ``_arrays._fresh``)."""
    if weight.dtype is not torch.float32:
        return _half_lookup(weight, ids)
    return torch.from_numpy(_native.embedding(_array(weight), _array(ids), padding_idx))


def _half_table(weight: Tensor):
    """A float16 or bfloat16 table as the crate's half-table kernels read it, in place:
    ``(array, format)``, bfloat16 as its uint16 bits (NumPy has no bfloat16)."""
    if weight.dtype is torch.float16:
        return _array(weight), "f16"
    if weight.dtype is torch.bfloat16:
        return _array(weight.view(torch.int16)).view("uint16"), "bf16"
    raise ArgumentError(f"embedding_kernels needs a float32, float16 or bfloat16 weight, got {weight.dtype}")


def _half_lookup(weight: Tensor, ids: Tensor) -> Tensor:
    """The lookup of a half table: the crate widens each row to float32 exactly, and
    the narrowing back gives the table's own values, in its dtype as PyTorch returns them."""
    table, format = _half_table(weight)
    out = _native.table_embedding(table, _array(ids), format)
    return torch.from_numpy(out).to(weight.dtype)


def _refuse_half_backward(ctx) -> None:
    if ctx.half:
        raise NotSupportedError(
            "a float16 or bfloat16 table serves inference only: the backward needs a "
            "float32 table (.float()); run the forward under torch.no_grad() or freeze "
            "the table (weight.requires_grad_(False))"
        )


def _embedding_setup(ctx, inputs, output) -> None:
    weight, indices, padding_idx, scale_grad_by_freq, sparse = inputs
    ctx.save_for_backward(indices)
    ctx.num_weights = weight.shape[0]
    ctx.options = (padding_idx, scale_grad_by_freq, sparse)
    ctx.half = weight.dtype is not torch.float32


def _embedding_backward(ctx, grad_output):
    _refuse_half_backward(ctx)
    (indices,) = ctx.saved_tensors
    padding_idx, scale_grad_by_freq, sparse = ctx.options
    grad = None
    if _needs_grad(ctx, 0):
        args = (grad_output, indices, ctx.num_weights, padding_idx, scale_grad_by_freq)
        if sparse:
            rows, values = embedding_sparse_backward(*args)
            grad = _coo(rows, values, ctx.num_weights, grad_output.shape[-1])
        else:
            grad = embedding_dense_backward(*args)
    return grad, None, None, None, None


embedding.register_autograd(_embedding_backward, setup_context=_embedding_setup)


def _needs_grad(ctx, i: int) -> bool:
    """Whether input ``i`` of the operator needs its gradient. (The dispatcher drops
    trailing arguments left at their defaults, and ``needs_input_grad`` with them.)"""
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


def _coo(rows: Tensor, values: Tensor, num_weights, embedding_dim) -> Tensor:
    """The crate's coalesced ``(rows, values)`` as a sparse COO gradient of the table's shape."""
    return torch.sparse_coo_tensor(
        rows.unsqueeze(0),
        values,
        (num_weights, embedding_dim),
        is_coalesced=True,
        # The crate's rows are distinct, ascending and in range: nothing to check.
        check_invariants=False,
    )


@_operator(())
def embedding_dense_backward(
    grad_output: Tensor,
    indices: Tensor,
    num_weights: int,
    padding_idx: Optional[int] = None,
    scale_grad_by_freq: bool = False,
) -> Tensor:
    """The lookup's dense gradient, ``[num_weights, embedding_dim]`` (``aten``'s op of
    the same name): row ``r`` sums ``grad_output`` where ``indices == r``."""
    _check_table(grad_output, "grad_output")
    batch = _lookup_batch(indices, grad_output, padding_idx, scale_grad_by_freq)
    # Every row is written (untouched ones with zeros): no need to zero it first.
    grad = _dense_grad((num_weights, grad_output.shape[-1]))
    batch.dense_backward(num_weights, grad)
    return torch.from_numpy(grad)


@embedding_dense_backward.register_fake
def _(grad_output, indices, num_weights, padding_idx=None, scale_grad_by_freq=False):
    _check_fake(grad_output, indices, "grad_output")
    return grad_output.new_empty((num_weights, grad_output.shape[-1]))


@_operator(())
def embedding_sparse_backward(
    grad_output: Tensor,
    indices: Tensor,
    num_weights: int,
    padding_idx: Optional[int] = None,
    scale_grad_by_freq: bool = False,
) -> tuple[Tensor, Tensor]:
    """The lookup's coalesced gradient: the distinct rows (int64, ascending, less
    ``padding_idx``) and their summed gradient rows, with the dense gradient's bits."""
    _check_table(grad_output, "grad_output")
    batch = _lookup_batch(indices, grad_output, padding_idx, scale_grad_by_freq)
    rows, values = batch.sparse_backward(num_weights)
    return torch.from_numpy(rows), torch.from_numpy(values)


def _sparse_fake(grad_output, indices):
    """A coalesced gradient's shapes: as many rows as distinct ids, known only when run."""
    _check_fake(grad_output, indices, "grad_output")
    rows = torch.library.get_ctx().new_dynamic_size()
    return (
        indices.new_empty((rows,), dtype=torch.int64),
        grad_output.new_empty((rows, grad_output.shape[-1])),
    )


@embedding_sparse_backward.register_fake
def _(grad_output, indices, num_weights, padding_idx=None, scale_grad_by_freq=False):
    return _sparse_fake(grad_output, indices)


# --- Bags ---------------------------------------------------------------------------


def _num_bags(indices: Tensor, offsets: Optional[Tensor], include_last_offset: bool):
    if indices.dim() == 2:
        return indices.shape[0]
    if offsets is None:
        raise ArgumentError("1-D ids need offsets (or pass 2-D ids [B, N], one bag per row)")
    return offsets.shape[0] - int(include_last_offset)


@_operator(())
def embedding_bag(
    weight: Tensor,
    indices: Tensor,
    offsets: Optional[Tensor] = None,
    per_sample_weights: Optional[Tensor] = None,
    mode: str = "mean",
    include_last_offset: bool = False,
    padding_idx: Optional[int] = None,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> tuple[Tensor, Tensor]:
    """The bags' pooled rows (``F.embedding_bag``), ``[num_bags, embedding_dim]``, and
    in max mode the id each value came from (``max_indices``, int64, the same shape;
    empty in the other modes). ``scale_grad_by_freq`` and ``sparse`` shape the backward."""
    _check_bag(weight, indices, offsets, per_sample_weights)
    out, max_indices = _bag(
        weight, indices, offsets, per_sample_weights, mode, include_last_offset, padding_idx
    )
    if max_indices is None:
        return out, _no_indices(indices)
    return out, max_indices


def _no_indices(indices: Tensor) -> Tensor:
    return indices.new_empty((0,), dtype=torch.int64)


@embedding_bag.register_fake
def _(
    weight, indices, offsets=None, per_sample_weights=None, mode="mean",
    include_last_offset=False, padding_idx=None, scale_grad_by_freq=False, sparse=False,
):
    _check_fake(weight, indices)
    shape = (_num_bags(indices, offsets, include_last_offset), weight.shape[1])
    out = weight.new_empty(shape)
    if mode == "max":
        return out, indices.new_empty(shape, dtype=torch.int64)
    return out, _no_indices(indices)


def _check_bag(weight, indices, offsets, per_sample_weights, halves=True, name="indices") -> None:
    """Raises ArgumentError unless a bag forward's tensors suit the kernels (the ids
    called ``name`` in the message)."""
    _check_table(weight, halves=halves)
    _check_ids(indices, name)
    if offsets is not None:
        _check_ids(offsets, "offsets")
    if per_sample_weights is not None:
        _check_table(per_sample_weights, "per_sample_weights", halves=halves)
        _check_weights_dtype(weight, per_sample_weights)


def _check_weights_dtype(weight: Tensor, per_sample_weights: Tensor) -> None:
    """``per_sample_weights`` in ``weight``'s dtype, as PyTorch asks."""
    if per_sample_weights.dtype is not weight.dtype:
        raise ArgumentError(
            f"per_sample_weights must have weight's dtype {weight.dtype}, "
            f"got {per_sample_weights.dtype}"
        )


def _bag(weight, indices, offsets, per_sample_weights, mode, include_last_offset, padding_idx):
    """The crate's bag forward: ``(out, max_indices or None)`` as tensors, ``out``
    allocated unzeroed by the kernel, which writes it whole. A half table's bags are
    those of its float32 widening, narrowed to its dtype."""
    offsets = None if offsets is None else _array(offsets)
    if weight.dtype is torch.float32:
        weights = None if per_sample_weights is None else _array(per_sample_weights)
        out, max_indices = _native.embedding_bag(
            _array(weight), _array(indices), offsets, mode, weights, include_last_offset,
            padding_idx,
        )
        return torch.from_numpy(out), None if max_indices is None else torch.from_numpy(max_indices)
    table, format = _half_table(weight)
    if per_sample_weights is not None:
        _check_weights_dtype(weight, per_sample_weights)
    # Widened exactly: the crate's weights are float32.
    weights = None if per_sample_weights is None else _array(per_sample_weights.float())
    out, max_indices = _native.table_embedding_bag(
        table, _array(indices), offsets, mode, weights, include_last_offset, padding_idx, format
    )
    max_indices = None if max_indices is None else torch.from_numpy(max_indices)
    return torch.from_numpy(out).to(weight.dtype), max_indices


def _bag_setup(ctx, inputs, output) -> None:
    weight, indices, offsets, per_sample_weights, *options = inputs
    ctx.save_for_backward(weight, indices, offsets, per_sample_weights, output[1])
    ctx.options = options
    ctx.half = weight.dtype is not torch.float32
    # `max_indices` has no gradient: none to make of zeros either.
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _bag_backward(ctx, grad_output, _grad_max_indices):
    _refuse_half_backward(ctx)
    weight, indices, offsets, per_sample_weights, max_indices = ctx.saved_tensors
    mode, include_last_offset, padding_idx, scale_grad_by_freq, sparse = ctx.options
    num_weights = weight.shape[0]
    grad = grad_weights = None
    if _needs_grad(ctx, 0):
        args = (grad_output, indices, offsets, per_sample_weights)
        options = (num_weights, mode, include_last_offset, padding_idx, scale_grad_by_freq)
        if sparse:
            rows, values = embedding_bag_sparse_backward(*args, *options)
            grad = _coo(rows, values, num_weights, grad_output.shape[-1])
        else:
            grad = embedding_bag_backward(*args, max_indices, *options)
    if _needs_grad(ctx, 3):
        grad_weights = _sample_weights_grad(
            grad_output, weight, indices, offsets, include_last_offset, padding_idx
        )
    return grad, None, None, grad_weights, None, None, None, None, None


embedding_bag.register_autograd(_bag_backward, setup_context=_bag_setup)


@_operator(())
def embedding_bag_backward(
    grad_output: Tensor,
    indices: Tensor,
    offsets: Optional[Tensor],
    per_sample_weights: Optional[Tensor],
    max_indices: Tensor,
    num_weights: int,
    mode: str = "mean",
    include_last_offset: bool = False,
    padding_idx: Optional[int] = None,
    scale_grad_by_freq: bool = False,
) -> Tensor:
    """A bag forward's dense gradient, ``[num_weights, embedding_dim]``; max mode
    takes the forward's ``max_indices``."""
    _check_table(grad_output, "grad_output")
    batch = _bag_batch(
        indices, offsets, grad_output, per_sample_weights, mode, include_last_offset,
        padding_idx, scale_grad_by_freq,
    )
    grad = _dense_grad((num_weights, grad_output.shape[-1]))
    batch.dense_backward(num_weights, grad, _array(max_indices) if mode == "max" else None)
    return torch.from_numpy(grad)


@embedding_bag_backward.register_fake
def _(
    grad_output, indices, offsets, per_sample_weights, max_indices, num_weights, mode="mean",
    include_last_offset=False, padding_idx=None, scale_grad_by_freq=False,
):
    _check_fake(grad_output, indices, "grad_output")
    return grad_output.new_empty((num_weights, grad_output.shape[-1]))


@_operator(())
def embedding_bag_sparse_backward(
    grad_output: Tensor,
    indices: Tensor,
    offsets: Optional[Tensor],
    per_sample_weights: Optional[Tensor],
    num_weights: int,
    mode: str = "mean",
    include_last_offset: bool = False,
    padding_idx: Optional[int] = None,
    scale_grad_by_freq: bool = False,
) -> tuple[Tensor, Tensor]:
    """A bag forward's coalesced gradient ``(rows, values)`` (sum and mean)."""
    _check_table(grad_output, "grad_output")
    batch = _bag_batch(
        indices, offsets, grad_output, per_sample_weights, mode, include_last_offset,
        padding_idx, scale_grad_by_freq,
    )
    rows, values = batch.sparse_backward(num_weights)
    return torch.from_numpy(rows), torch.from_numpy(values)


@embedding_bag_sparse_backward.register_fake
def _(
    grad_output, indices, offsets, per_sample_weights, num_weights, mode="mean",
    include_last_offset=False, padding_idx=None, scale_grad_by_freq=False,
):
    return _sparse_fake(grad_output, indices)


def _sample_weights_grad(grad_out, weight, ids, offsets, include_last_offset, padding_idx):
    """d loss / d per_sample_weights[p] = <grad_out[bag(p)], weight[ids[p]]>; 0 off any
    bag or at padding. PyTorch's own ops, which the compilers trace."""
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


# --- What a backward or a fused step needs of a batch ----------------------------


class _Batch:
    """A batch as NumPy arrays: the ids, the output gradient, and for bags
    (``bag`` not ``None``) their offsets and ``mode``, ``per_sample_weights``
    and ``include_last_offset``."""

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

    def sgd(self, table, lr: float, weight_decay: float) -> None:
        if self.bag is None:
            _native.embedding_sparse_sgd_step(
                table, self.ids, self.grad_out, lr, weight_decay, **self.options
            )
        else:
            offsets, options = self.bag
            _native.embedding_bag_sparse_sgd_step(
                table, self.ids, offsets, self.grad_out, lr, weight_decay,
                **options, **self.options,
            )

    def rowwise_adagrad(self, table, state, lr: float, weight_decay: float, eps: float) -> None:
        if self.bag is None:
            _native.embedding_sparse_rowwise_adagrad_step(
                table, state, self.ids, self.grad_out, lr, weight_decay, eps, **self.options
            )
        else:
            offsets, options = self.bag
            _native.embedding_bag_sparse_rowwise_adagrad_step(
                table, state, self.ids, offsets, self.grad_out, lr, weight_decay, eps,
                **options, **self.options,
            )

    def adagrad(self, table, state, step: int, lr: float, rule: dict) -> None:
        if self.bag is None:
            _native.embedding_sparse_adagrad_step(
                table, state, self.ids, self.grad_out, lr, step, **rule, **self.options
            )
        else:
            offsets, options = self.bag
            _native.embedding_bag_sparse_adagrad_step(
                table, state, self.ids, offsets, self.grad_out, lr, step,
                **rule, **options, **self.options,
            )


def _bag_batch(
    ids, offsets, grad_out, per_sample_weights, mode, include_last_offset, padding_idx,
    scale_grad_by_freq,
) -> _Batch:
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


# --- max_norm ---------------------------------------------------------------------


@_operator(("weight",))
def embedding_renorm_(
    weight: Tensor,
    indices: Tensor,
    max_norm: float,
    norm_type: float,
    offsets: Optional[Tensor] = None,
    per_sample_weights: Optional[Tensor] = None,
    bag_mode: Optional[str] = None,
    include_last_offset: bool = False,
) -> None:
    """``max_norm``: the rows ``indices`` read renormalised in place by PyTorch's
    ``torch.embedding_renorm_``, once the crate has checked the whole batch (the
    lookup's with ``bag_mode=None``, else the bag forward's arguments too), so that a
    refused batch leaves the table as it was."""
    _check_table(weight)
    _check_ids(indices, "indices")
    if bag_mode is None:
        _lookup(weight, indices, None)
    else:
        _check_bag(weight, indices, offsets, per_sample_weights)
        _bag(weight, indices, offsets, per_sample_weights, bag_mode, include_last_offset, None)
    with torch.no_grad():
        torch.embedding_renorm_(weight, indices, max_norm, norm_type)


@embedding_renorm_.register_fake
def _(weight, indices, max_norm, norm_type, offsets=None, per_sample_weights=None, bag_mode=None,
      include_last_offset=False):
    _check_fake(weight, indices)
    return None
