"""Drop-in ``torch.nn.Embedding`` and ``torch.nn.EmbeddingBag`` on the crate's kernels.

``Embedding`` and ``EmbeddingBag`` take PyTorch's constructor arguments, hold
their table in a ``weight`` ``nn.Parameter`` (so ``state_dict()`` and
``load_state_dict()`` move tables between these modules and PyTorch's, both
ways), and call the crate's kernels as PyTorch operators
(``torch.ops.embedding_kernels.*``, ``_ops.py``) with their autograd formulas: a
dense gradient, or with ``sparse=True`` a coalesced ``torch.sparse_coo_tensor``
that PyTorch's optimisers accept. ``torch.compile`` (``fullgraph=True`` included),
``torch.export`` and ``torch.jit.trace`` see those operators as nodes of their
graphs; ``torch.jit.script`` is refused with a message (``NotSupportedError``).
An inference call in eager mode skips the operator's dispatch and calls the same
kernel directly.

Tensors reach the kernels as NumPy views (``tensor.numpy()``), without a copy
when they are contiguous (a contiguous copy otherwise, as PyTorch would make;
for float32, into NumPy's memory). CPU float32 tables and gradients are supported (float16 and bfloat16
tables for inference), with int32 or int64 ids; any other device or dtype raises ``ArgumentError``. An id out of range
(negative ones included) raises ``IndexError`` naming its flat position and
value, before anything is written. The other errors are ``ValueError``s that are
also the type ``torch.nn`` raises for the same mistake (``_errors.py``):
``ArgumentError`` a ``RuntimeError``, ``PaddingIdxError`` an ``AssertionError``,
``NotSupportedError`` a ``NotImplementedError``.

Each module asks Linux to keep its table in transparent huge pages: a fresh one from its
first write, a ``_weight`` (and ``from_pretrained``'s ``embeddings``, shared with the caller
as PyTorch shares it) moved there in place as the module is made, which takes about as long
as a copy of it. Where the kernel cannot (huge pages off, no free ones), the table stays
as it was; a tensor assigned to ``weight`` later is left as it is.

``max_norm`` renormalises the looked-up rows in place, under ``no_grad``,
with PyTorch's own ``torch.embedding_renorm_`` (the crate renormalises only
tables it owns, not a borrowed one), after the crate has checked every id.

Here are the modules; ``_ops.py`` holds the operators and their autograd formulas,
``_steps.py`` the fused optimiser steps, ``_arrays.py`` the tensors' NumPy views and the arrays
the kernels write into.
"""

from typing import Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn import init

from .. import collapse_huge_pages
from ._errors import ArgumentError, NotSupportedError, PaddingIdxError, torch_error
from ._arrays import HALVES, _check_ids, _check_table, _needs_graph, _weight_of, empty_cache
from . import _ops, _steps
from ._ops import _bag, _direct, _lookup
from ._steps import Adagrad, RowWiseAdagrad, Sgd

__all__ = [
    "ArgumentError",
    "Embedding",
    "EmbeddingBag",
    "NotSupportedError",
    "PaddingIdxError",
    "empty_cache",
]


def _check_factory(device, dtype) -> None:
    """Refuses a ``device`` or ``dtype`` the kernels cannot serve: the CPU, or the meta
    device (shapes only, for deferred initialisation); float32, or float16 and bfloat16
    (the crate's half tables, for inference)."""
    if device is not None and torch.device(device).type not in ("cpu", "meta"):
        raise ArgumentError(f"embedding_kernels runs on the CPU only, got device={device}")
    if dtype is not None and dtype != torch.float32 and dtype not in HALVES:
        raise ArgumentError(
            f"embedding_kernels needs float32 tables (float16 or bfloat16 for inference), "
            f"got dtype={dtype}"
        )


def _padding_row(padding_idx: Optional[int], num_embeddings: int) -> Optional[int]:
    """``padding_idx`` as a row (a negative one counts from the end), as PyTorch does."""
    if padding_idx is None:
        return None
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise PaddingIdxError(
            f"padding_idx {padding_idx} must be within [-{num_embeddings}, {num_embeddings})"
        )
    return padding_idx + num_embeddings if padding_idx < 0 else padding_idx


def _check_lookup(weight: Tensor, input: Tensor) -> None:
    """Raises ArgumentError unless `Embedding.forward`'s tensors suit the kernels."""
    _check_table(weight, halves=True)
    _check_ids(input, "input")


def _check_bag(weight, input, offsets, per_sample_weights, mode) -> None:
    """Raises ArgumentError unless `EmbeddingBag.forward`'s tensors suit the kernels."""
    _ops._check_bag(weight, input, offsets, per_sample_weights, name="input")
    if per_sample_weights is not None and mode != "sum":
        raise NotSupportedError(
            f"per_sample_weights are only supported for mode sum, not {mode}"
        )


def _check_rates(**values: float) -> None:
    for name, value in values.items():
        if not value >= 0.0 or value == float("inf"):
            raise ArgumentError(f"{name} must be a finite number >= 0, got {value}")


def _pretrained_shape(embeddings: Tensor):
    """``from_pretrained``'s table shape, ``(rows, cols)``; ArgumentError unless 2-D."""
    if embeddings.dim() != 2:
        raise ArgumentError(f"embeddings must be 2-D, got {embeddings.dim()}-D")
    rows, cols = embeddings.shape
    return rows, cols


def _parameter(
    num_embeddings: int,
    embedding_dim: int,
    weight: Optional[Tensor],
    requires_grad: bool,
    device=None,
    dtype=None,
) -> nn.Parameter:
    """A module's table: a fresh float32 one (for `reset_parameters`), or `weight` (the
    `_weight` argument, shared as PyTorch's modules share it), checked against the
    module's shape; in huge pages either way (`_in_huge_pages`)."""
    if weight is None:
        dtype = torch.float32 if dtype is None else dtype
        fresh = torch.empty((num_embeddings, embedding_dim), dtype=dtype, device=device)
        _in_huge_pages(fresh)
        return nn.Parameter(fresh, requires_grad=requires_grad)
    if list(weight.shape) != [num_embeddings, embedding_dim]:
        raise ArgumentError(
            f"_weight has shape {list(weight.shape)}, expected [{num_embeddings}, {embedding_dim}]"
        )
    _check_table(weight, "_weight", halves=True)
    _in_huge_pages(weight)
    return nn.Parameter(weight, requires_grad=requires_grad)


def _in_huge_pages(table: Tensor) -> None:
    """Backs the whole 2 MiB pages of a contiguous ``table`` with huge pages (Linux): a
    fresh one as it is first written, a written one now, copied in place
    (:func:`embedding_kernels.collapse_huge_pages`).

    PyTorch leaves a tensor in 4 KiB pages, and a lookup into a table much larger than
    the TLB covers then walks the page tables for nearly every id; in 2 MiB pages the
    TLB covers far more of it (docs/design.md, "Memory: huge pages and aligned tables").
    Only a speed-up: a table without a NumPy view (on the meta device, say) is left as
    it is."""
    if not (table.is_cpu and table.is_contiguous()):
        return
    try:
        array = table.detach().numpy()
    except (RuntimeError, TypeError):  # no NumPy view (meta, bfloat16)
        return
    collapse_huge_pages(array)


class _Table(nn.Module):
    """What both modules share: the `weight` table, its padding row, and the
    optimiser steps fused into the backward."""

    weight: nn.Parameter
    padding_idx: Optional[int]
    # The optimiser step run as the backward (`sgd_in_backward`, `adagrad_in_backward`).
    _step_in_backward: Optional[object] = None

    def _apply(self, fn, recurse=True):
        """``nn.Module._apply`` (``.to()``, ``.double()``, ``.half()``, ``.cuda()``,
        ``to_empty()``), refusing a conversion of the table to a dtype or device the
        kernels cannot serve before anything is converted: where ``fn`` takes a table
        shows on an empty tensor like it."""
        weight = self._parameters.get("weight")
        if weight is not None:
            probe = fn(torch.empty(0, dtype=weight.dtype, device=weight.device))
            _check_factory(probe.device, probe.dtype)
        return super()._apply(fn, recurse)

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

    def _norm_repr(self) -> str:
        """The ``extra_repr`` of ``max_norm``, ``norm_type`` and ``scale_grad_by_freq``
        where they differ from the defaults, as PyTorch's modules write them."""
        s = ""
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        return s

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
        raises in its backward. The table must be contiguous (``ArgumentError`` in
        the backward otherwise). A bag layer must pool with ``"sum"`` or
        ``"mean"``. Replaces an Adagrad step set before. Returns the module."""
        if lr is None:
            self._step_in_backward = None
            return self
        self._check_fused()
        _check_rates(lr=lr, weight_decay=weight_decay)
        self._step_in_backward = Sgd(float(lr), float(weight_decay))
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
            step = torch.tensor(0.0)
        else:
            state_sum, step = state["sum"], state["step"]
            if not isinstance(state_sum, Tensor) or state_sum.dtype != torch.float32:
                raise ArgumentError("state['sum'] must be a float32 tensor")
            if tuple(state_sum.shape) != shape or not state_sum.is_contiguous():
                raise ArgumentError(
                    f"state['sum'] must be a contiguous tensor of weight's shape {list(shape)}, "
                    f"got {list(state_sum.shape)}"
                )
            if not isinstance(step, Tensor) or step.numel() != 1 or step.is_floating_point() is False:
                # A number, or a tensor the step cannot count in: counted in a tensor of our own.
                step = torch.tensor(float(step))
            if state_sum.device.type != "cpu" or step.device.type != "cpu" or not step >= 0:
                raise ArgumentError("state['sum'] must be on the CPU and state['step'] >= 0")
        self._step_in_backward = Adagrad(
            float(lr), float(lr_decay), float(weight_decay), float(eps), state_sum, step
        )
        return self

    def rowwise_adagrad_in_backward(
        self,
        lr: Optional[float] = 1e-2,
        weight_decay: float = 0.0,
        eps: float = 1e-8,
        initial_accumulator_value: float = 0.0,
    ):
        """Makes the backward a row-wise Adagrad step on ``weight``, fused by the crate
        (FBGEMM's and TorchRec's ``EXACT_ROWWISE_ADAGRAD``); ``lr=None`` undoes it.

        One accumulator a row instead of a second table: on each touched row, with ``g``
        its summed gradient (as for :meth:`sgd_in_backward`) plus ``weight_decay * w``,
        ``state += mean(g * g)`` and ``w -= lr / (sqrt(state) + eps) * g``. The
        accumulators (float32 ``[num_embeddings]``, from ``initial_accumulator_value``)
        are ``module.rowwise_adagrad_state()``. As with :meth:`sgd_in_backward`,
        ``weight.grad`` stays ``None`` and each backward steps at once. Returns the
        module."""
        if lr is None:
            self._step_in_backward = None
            return self
        self._check_fused()
        _check_rates(lr=lr, weight_decay=weight_decay, eps=eps,
                     initial_accumulator_value=initial_accumulator_value)
        state = torch.full((self.weight.shape[0],), float(initial_accumulator_value))
        self._step_in_backward = RowWiseAdagrad(float(lr), float(weight_decay), float(eps), state)
        return self

    def rowwise_adagrad_state(self) -> Optional[Tensor]:
        """The row-wise Adagrad accumulators (the tensor itself, which each step
        updates); ``None`` unless :meth:`rowwise_adagrad_in_backward` is on."""
        step = self._step_in_backward
        return step.state if isinstance(step, RowWiseAdagrad) else None

    def adagrad_state(self) -> Optional[dict]:
        """The Adagrad step's state, ``{"step": tensor, "sum": tensor}`` as
        ``torch.optim.Adagrad`` keeps it (the tensors themselves, which each step
        updates, not copies); ``None`` unless :meth:`adagrad_in_backward` is on."""
        step = self._step_in_backward
        if not isinstance(step, Adagrad):
            return None
        return {"step": step.step, "sum": step.sum}

    def __prepare_scriptable__(self):
        """``torch.jit.script`` asks this of every module it scripts: these modules
        call Python operators, which TorchScript cannot compile."""
        raise NotSupportedError(
            f"{type(self).__name__} from embedding_kernels cannot be scripted by "
            "torch.jit.script: use torch.compile or torch.export (torch.jit.trace also "
            "records its operators)"
        )


class Embedding(_Table):
    """``torch.nn.Embedding`` on the crate's kernels: same arguments, same ``weight``.

    Differences from PyTorch: CPU only, float32 (float16 and bfloat16 tables
    serve inference, their backward raises); ``embedding_dim`` must be
    positive; a bad id raises ``IndexError`` (PyTorch: ``IndexError`` too, with
    another message), a bad argument a ``ValueError`` that is also PyTorch's type
    for it (``ArgumentError``, a ``RuntimeError``; ``PaddingIdxError``, an
    ``AssertionError``); ``sparse=True`` gradients come coalesced.
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
            raise ArgumentError(f"embedding_dim must be positive, got {embedding_dim}")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = _padding_row(padding_idx, num_embeddings)
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        self.weight = _parameter(
            num_embeddings, embedding_dim, _weight, not _freeze, device, dtype
        )
        if _weight is None:
            self.reset_parameters()

    def forward(self, input: Tensor) -> Tensor:
        try:
            return self._forward(input)
        except ValueError as e:
            raise torch_error(e) from None

    def _forward(self, input: Tensor) -> Tensor:
        weight = _weight_of(self)
        if self.max_norm is None and not _needs_graph(weight) and _direct():
            # The eager inference call, checked only if it fails (see `EmbeddingBag.forward`).
            try:
                return _lookup(weight, input, self.padding_idx)
            except Exception as e:
                refused = e
            if weight.is_meta:
                return self._on_meta(weight, input)
            _check_lookup(weight, input)  # its own error, not chained to the kernel's
            raise refused
        if weight.is_meta:
            return self._on_meta(weight, input)
        _check_lookup(weight, input)
        if self.max_norm is not None:
            _ops.embedding_renorm_(weight, input, self.max_norm, self.norm_type)
        step = self._step_in_backward
        if step is not None and _needs_graph(weight):
            return _steps.embedding_with_step(
                weight, input, self.padding_idx, self.scale_grad_by_freq, *step.args()
            )
        return _ops.embedding(
            weight, input, self.padding_idx, self.scale_grad_by_freq, self.sparse
        )

    def _on_meta(self, weight: Tensor, input: Tensor) -> Tensor:
        """The forward of a table on the meta device (made there for deferred
        initialisation): PyTorch's own op, which gives the output's shape and dtype."""
        return F.embedding(
            input, weight, self.padding_idx, self.max_norm, self.norm_type,
            self.scale_grad_by_freq, self.sparse,
        )

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        s += self._norm_repr()
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
        rows, cols = _pretrained_shape(embeddings)
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


class EmbeddingBag(_Table):
    """``torch.nn.EmbeddingBag`` on the crate's kernels: same arguments, same ``weight``.

    ``forward(input, offsets=None, per_sample_weights=None)``: 1-D ids with
    ``offsets``, or 2-D ids ``[B, N]`` (a bag per row). Differences from
    PyTorch: CPU only, float32 (float16 and bfloat16 for inference);
    ``sparse=True`` with ``mode="max"`` is refused
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
            raise ArgumentError(f"embedding_dim must be positive, got {embedding_dim}")
        if mode not in ("sum", "mean", "max"):
            raise ArgumentError(f'mode must be "sum", "mean" or "max", got {mode!r}')
        if sparse and mode == "max":
            raise ArgumentError('sparse gradients are not supported with mode="max" (as in PyTorch)')
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.mode = mode
        self.sparse = sparse
        self.include_last_offset = include_last_offset
        self.padding_idx = _padding_row(padding_idx, num_embeddings)
        self.weight = _parameter(num_embeddings, embedding_dim, _weight, True, device, dtype)
        if _weight is None:
            self.reset_parameters()

    def forward(
        self,
        input: Tensor,
        offsets: Optional[Tensor] = None,
        per_sample_weights: Optional[Tensor] = None,
    ) -> Tensor:
        try:
            return self._forward(input, offsets, per_sample_weights)
        except ValueError as e:
            raise torch_error(e) from None

    def _forward(self, input, offsets, per_sample_weights) -> Tensor:
        weight = _weight_of(self)
        bag = (self.mode, self.include_last_offset, self.padding_idx)
        if self.max_norm is None and not _needs_graph(weight, per_sample_weights) and _direct():
            # The eager inference call, straight to the kernel, which reads the tensors'
            # NumPy views, refuses any other dtype or a bad id before it writes, and
            # allocates the output. The torch-level checks (the device, the dtype,
            # the layout of each tensor) run only when it fails, to raise their
            # precise error instead of its own: on a small bag they are a fair share
            # of the call's time.
            try:
                return _bag(weight, input, offsets, per_sample_weights, *bag)[0]
            except Exception as e:
                refused = e
            if weight.is_meta:
                return self._on_meta(weight, input, offsets, per_sample_weights)
            _check_bag(weight, input, offsets, per_sample_weights, self.mode)
            raise refused
        if weight.is_meta:
            return self._on_meta(weight, input, offsets, per_sample_weights)
        _check_bag(weight, input, offsets, per_sample_weights, self.mode)
        if self.max_norm is not None:
            _ops.embedding_renorm_(
                weight, input, self.max_norm, self.norm_type, offsets, per_sample_weights,
                self.mode, self.include_last_offset,
            )
        step = self._step_in_backward
        if step is not None and weight.requires_grad and _needs_graph(weight, per_sample_weights):
            return _steps.embedding_bag_with_step(
                weight, input, offsets, per_sample_weights, *bag, self.scale_grad_by_freq,
                *step.args(),
            )
        out, _ = _ops.embedding_bag(
            weight, input, offsets, per_sample_weights, *bag, self.scale_grad_by_freq,
            self.sparse,
        )
        return out

    def _check_fused(self) -> None:
        if self.mode == "max":
            raise ArgumentError('a fused step needs mode "sum" or "mean": max\'s gradient is not fused')

    def _on_meta(self, weight, input, offsets, per_sample_weights) -> Tensor:
        """The forward of a table on the meta device: PyTorch's own op, for the output's
        shape and dtype (see `Embedding._on_meta`)."""
        return F.embedding_bag(
            input, weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq,
            self.mode, self.sparse, per_sample_weights, self.include_last_offset,
            self.padding_idx,
        )

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        s += self._norm_repr()
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
        rows, cols = _pretrained_shape(embeddings)
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
