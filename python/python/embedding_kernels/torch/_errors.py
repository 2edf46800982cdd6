"""The modules' exceptions: each is a ``ValueError`` (what the package raised
before, and what its NumPy functions raise) and also the type ``torch.nn``
raises for the same mistake, so code written against PyTorch's modules
catches ours. A bad id stays an ``IndexError``, as in PyTorch."""

import functools


class ArgumentError(ValueError, RuntimeError):
    """An argument the modules refuse where ``torch.nn`` raises ``RuntimeError``:
    a tensor of the wrong dtype, device or layout, offsets that do not start at 0
    or go down, a non-positive ``embedding_dim``."""


class PaddingIdxError(ValueError, AssertionError):
    """A ``padding_idx`` outside the table, which ``torch.nn`` asserts against."""


class NotSupportedError(ArgumentError, NotImplementedError):
    """An option PyTorch does not implement either: ``per_sample_weights`` with a
    mode other than ``"sum"``."""


def torch_error(error: ValueError) -> ValueError:
    """``error`` as one of the types above: itself if it is one, else an
    ``ArgumentError`` with its message and traceback (the kernels' checks raise
    plain ``ValueError``s)."""
    if isinstance(error, (ArgumentError, PaddingIdxError)):
        return error
    return ArgumentError(*error.args).with_traceback(error.__traceback__)


def torch_errors(function):
    """``function`` raising `torch_error` of any ``ValueError``: for the autograd
    functions' backwards, which the kernels' checks may refuse."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ValueError as e:
            raise torch_error(e) from None

    return wrapper
