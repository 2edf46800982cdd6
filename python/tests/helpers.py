"""Shared helpers of the tests: bitwise comparison, the rounding bound, and NaN-filled
outputs for the modules' inference path."""

import numpy as np
import torch

EPS = 2.0**-24  # the unit roundoff of float32


def bits(t):
    """The tensor's bits (float32, or a half type), so that -0.0 and 0.0 (and NaNs)
    compare as bits."""
    as_int = torch.int32 if t.dtype == torch.float32 else torch.int16
    return t.detach().contiguous().view(as_int)


def assert_bitwise(ours, theirs):
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert ours.dtype == theirs.dtype
    assert ours.dtype in (torch.float32, torch.float16, torch.bfloat16)
    assert torch.equal(bits(ours), bits(theirs)), (ours.float() - theirs.float()).abs().max()


def assert_within_sum_bound(ours, theirs, abs_sum, terms):
    """Both are float32 sums of at most ``terms`` products whose magnitudes add up to
    ``abs_sum`` (computed in float64): each is within terms * EPS * abs_sum of the exact
    value (the classic bound for recursive summation, one more term for a product or a
    division), so they are within twice that of each other."""
    bound = 2 * (terms + 1) * EPS * abs_sum
    diff = (ours.double() - theirs.double()).abs()
    assert torch.all(diff <= bound), (diff - bound).max()


class NanOutputs:
    """Stands in for ``embedding_kernels._native`` where the torch modules call their
    forward kernels (``NanOutputs.install(monkeypatch)``): a lookup or a bag forward
    called without ``out`` (the kernel allocates it unzeroed) runs again into a
    NaN-filled ``out`` of the same shape, which is what the module gets back; ``shapes``
    records those shapes."""

    # Where `out` sits among each function's positional arguments.
    _OUT_AT = {"embedding": 3, "embedding_bag": 7}

    def __init__(self, native):
        self._native = native
        self.shapes = []

    @classmethod
    def install(cls, monkeypatch):
        """A stand-in for the kernels the modules' operators call (``_ops._lookup`` and
        ``_ops._bag`` among them)."""
        import embedding_kernels.torch as ekt

        stand_in = cls(ekt._ops._native)
        monkeypatch.setattr(ekt._ops, "_native", stand_in)
        return stand_in

    def __getattr__(self, name):
        real = getattr(self._native, name)
        at = self._OUT_AT.get(name)
        if at is None:
            return real

        def into_nan(*args, **kwargs):
            if len(args) > at or kwargs.get("out") is not None:
                return real(*args, **kwargs)
            first = real(*args, **kwargs)
            shape = (first[0] if isinstance(first, tuple) else first).shape
            self.shapes.append(tuple(shape))
            return real(*args, out=np.full(shape, np.nan, dtype=np.float32), **kwargs)

        return into_nan


HUGE_PAGE = 2 << 20


def huge_bytes_in(address, nbytes):
    """The bytes in transparent huge pages (``AnonHugePages`` of ``/proc/self/smaps``)
    of the mappings that hold ``[address, address + nbytes)``, each counted up to its
    overlap with the range: what that memory has in huge pages, whatever the rest of the
    process gains or frees meanwhile (a garbage collection during the call); 0 off
    Linux."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return 0
    total, overlap, end = 0, 0, address + nbytes
    for line in lines:
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            overlap = max(0, min(hi, end) - max(lo, address))
        elif head == "AnonHugePages:" and overlap:
            total += min(int(line.split()[1]) * 1024, overlap)
    return total


def kernel_collapses():
    """Whether this kernel has ``MADV_COLLAPSE`` (Linux 6.1 on) and transparent huge pages."""
    import os
    import platform

    if platform.system() != "Linux" or not os.path.isdir("/sys/kernel/mm/transparent_hugepage"):
        return False
    parts = platform.release().replace("-", ".").split(".")
    major, minor = (int(p) if p.isdigit() else 0 for p in (parts + ["0", "0"])[:2])
    return (major, minor) >= (6, 1)


def huge_pages_on_advice():
    """Whether the system hands out huge pages where advised and only there (THP
    ``madvise``): memory nobody advised stays in 4 KiB pages, so a test can tell advice
    from none."""
    try:
        return "[madvise]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


def whole_huge_pages(address, nbytes):
    """The bytes of the whole 2 MiB pages inside ``[address, address + nbytes)``."""
    first = -(-address // HUGE_PAGE) * HUGE_PAGE
    last = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    return max(last - first, 0)
