"""Forward passes against PyTorch's modules, bit for bit, on random cases."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import embedding_kernels as ek
import embedding_kernels.torch as ekt
from helpers import NanOutputs, assert_bitwise

ID_TYPES = [torch.int32, torch.int64]


def pair_embedding(n, d, seed, **options):
    """PyTorch's Embedding and ours, with the same table (ours loaded from its state_dict)."""
    torch.manual_seed(seed)
    theirs = torch.nn.Embedding(n, d, **options)
    ours = ekt.Embedding(n, d, **options)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


@pytest.mark.parametrize("dtype", ID_TYPES)
@pytest.mark.parametrize("padding_idx", [None, 0, 5, -1])
@pytest.mark.parametrize("shape", [(), (0,), (1,), (37,), (4, 9), (2, 3, 5), (3, 0)])
def test_embedding_forward_bitwise(dtype, padding_idx, shape):
    g = torch.Generator().manual_seed(hash((str(dtype), padding_idx, shape)) % 2**31)
    n, d = 11, 19
    theirs, ours = pair_embedding(n, d, 3, padding_idx=padding_idx)
    ids = torch.randint(0, n, shape, generator=g, dtype=dtype)
    expected = theirs(ids)
    got = ours(ids)
    assert_bitwise(got, expected)


def test_embedding_same_init_as_pytorch():
    torch.manual_seed(7)
    theirs = torch.nn.Embedding(30, 8, padding_idx=4)
    torch.manual_seed(7)
    ours = ekt.Embedding(30, 8, padding_idx=4)
    assert_bitwise(ours.weight, theirs.weight)
    assert torch.all(ours.weight[4] == 0)


@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.5])
def test_embedding_max_norm_renormalises_as_pytorch(norm_type):
    theirs, ours = pair_embedding(20, 6, 5, max_norm=1.5, norm_type=norm_type)
    ids = torch.tensor([[1, 2, 2], [7, 19, 1]])
    assert_bitwise(ours(ids), theirs(ids))
    # The rows looked up were renormalised in place, the others were not.
    assert_bitwise(ours.weight, theirs.weight)


def test_embedding_non_contiguous_ids():
    theirs, ours = pair_embedding(10, 4, 1)
    ids = torch.randint(0, 10, (6, 5)).t()
    assert not ids.is_contiguous()
    assert_bitwise(ours(ids), theirs(ids))


def random_bags(g, n, num_ids, num_bags, include_last_offset, dtype):
    """Ids and valid offsets (starting at 0, never decreasing, some bags empty)."""
    ids = torch.randint(0, n, (num_ids,), generator=g, dtype=dtype)
    starts = torch.sort(torch.randint(0, num_ids + 1, (num_bags,), generator=g)).values
    if num_bags:
        starts[0] = 0
    if include_last_offset:
        starts = torch.cat([starts, torch.tensor([num_ids])])
    return ids, starts.to(dtype)


def pair_bag(n, d, seed, **options):
    torch.manual_seed(seed)
    theirs = torch.nn.EmbeddingBag(n, d, **options)
    ours = ekt.EmbeddingBag(n, d, **options)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


BAG_CASES = [
    (mode, include_last_offset, padding_idx, dtype, case)
    for mode in ["sum", "mean", "max"]
    for include_last_offset in [False, True]
    for padding_idx in [None, 0, -1]
    for dtype in ID_TYPES
    for case in range(4)
]


@pytest.mark.parametrize("mode,include_last_offset,padding_idx,dtype,case", BAG_CASES)
def test_embedding_bag_forward_bitwise(mode, include_last_offset, padding_idx, dtype, case):
    g = torch.Generator().manual_seed(hash((mode, include_last_offset, padding_idx, str(dtype), case)) % 2**31)
    n = int(torch.randint(1, 40, (1,), generator=g))
    d = int(torch.randint(1, 70, (1,), generator=g))
    num_ids = int(torch.randint(0, 80, (1,), generator=g))
    num_bags = int(torch.randint(1, 10, (1,), generator=g))
    theirs, ours = pair_bag(
        n, d, case, mode=mode, include_last_offset=include_last_offset, padding_idx=padding_idx
    )
    ids, offsets = random_bags(g, n, num_ids, num_bags, include_last_offset, dtype)
    assert_bitwise(ours(ids, offsets), theirs(ids, offsets))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", ID_TYPES)
@pytest.mark.parametrize("shape", [(5, 7), (1, 1), (0, 4)])
def test_embedding_bag_2d_input_bitwise(mode, dtype, shape):
    theirs, ours = pair_bag(25, 33, 2, mode=mode)
    ids = torch.randint(0, 25, shape, dtype=dtype)
    assert_bitwise(ours(ids), theirs(ids))


def test_embedding_bag_all_bags_empty():
    theirs, ours = pair_bag(6, 5, 0, mode="mean")
    ids = torch.tensor([], dtype=torch.int64)
    offsets = torch.tensor([0, 0, 0])
    out = ours(ids, offsets)
    assert_bitwise(out, theirs(ids, offsets))
    assert torch.all(out == 0)


@pytest.mark.parametrize("case", range(34))
def test_embedding_bag_per_sample_weights_bitwise(case):
    """Sum with per_sample_weights: each weighted row fused into the sum (fma), in
    position order, as PyTorch's CPU bag (FBGEMM) adds it: the same bits."""
    g = torch.Generator().manual_seed(case)
    n, d = 30, [24, 7, 64, 130][case % 4]
    num_ids = int(torch.randint(0, 60, (1,), generator=g))
    include_last_offset = bool(case % 2)
    padding_idx = [None, 3][case % 3 == 0]
    theirs, ours = pair_bag(
        n, d, case, mode="sum", include_last_offset=include_last_offset, padding_idx=padding_idx
    )
    ids, offsets = random_bags(g, n, num_ids, 5, include_last_offset, torch.int64)
    weights = torch.randn(num_ids, generator=g)
    assert_bitwise(ours(ids, offsets, weights), theirs(ids, offsets, weights))


def test_embedding_bag_2d_input_of_empty_rows_is_zeros():
    """[B, 0] ids: B empty bags, zeros. (PyTorch 2.15 raises "step must be nonzero".)"""
    ours = ekt.EmbeddingBag(5, 3, mode="mean")
    out = ours(torch.zeros((4, 0), dtype=torch.int64))
    assert out.shape == (4, 3) and torch.all(out == 0)


def test_embedding_bag_include_last_offset_single_offset():
    """include_last_offset with offsets [0]: no bag at all. (PyTorch 2.15 crashes the
    process with a segmentation fault here, so it is not called.)"""
    ours = ekt.EmbeddingBag(5, 3, mode="sum", include_last_offset=True)
    out = ours(torch.tensor([1, 2]), torch.tensor([0]))
    assert out.shape == (0, 3)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_ids_past_the_last_offset_are_left_out(mode):
    """include_last_offset: the last offset ends the last bag, and ids after it belong to no
    bag, in every mode. PyTorch 2.15 leaves them out in sum mode but adds them to the last
    bag in mean and max mode (its docs want the last offset to be the number of ids)."""
    theirs, ours = pair_bag(8, 4, 1, mode=mode, include_last_offset=True)
    ids, offsets = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 3])
    got = ours(ids, offsets)
    assert_bitwise(got, theirs(ids[:3], offsets))
    assert torch.equal(got, theirs(ids, offsets)) == (mode == "sum")


def without_autograd(how, module):
    """A context in which autograd records nothing for ``module``, and the module."""
    if how == "no_grad":
        return torch.no_grad(), module
    if how == "inference_mode":
        return torch.inference_mode(), module
    module.weight.requires_grad_(False)
    return torch.enable_grad(), module


@pytest.mark.parametrize("how", ["no_grad", "inference_mode", "frozen"])
def test_forward_without_autograd_bitwise(how):
    """Where autograd records nothing, the modules call the kernels directly: the same bits,
    and a result outside any graph."""
    g = torch.Generator().manual_seed(11)
    theirs, ours = pair_embedding(40, 24, 4, padding_idx=2)
    ids = torch.randint(0, 40, (6, 5), generator=g)
    context, ours = without_autograd(how, ours)
    with context:
        got = ours(ids)
    assert not got.requires_grad and got.grad_fn is None
    assert_bitwise(got, theirs(ids))
    for mode in ["sum", "mean", "max"]:
        theirs, ours = pair_bag(40, 24, 5, mode=mode)
        ids, offsets = random_bags(g, 40, 30, 6, False, torch.int64)
        context, ours = without_autograd(how, ours)
        with context:
            got = ours(ids, offsets)
        assert not got.requires_grad and got.grad_fn is None
        assert_bitwise(got, theirs(ids, offsets))


def test_bag_with_weights_that_need_a_gradient_records_a_graph():
    """A frozen table whose per_sample_weights require grad still goes through autograd."""
    theirs, ours = pair_bag(10, 4, 6, mode="sum")
    ours.weight.requires_grad_(False)
    weights = torch.rand(5, requires_grad=True)
    out = ours(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2]), weights)
    assert out.grad_fn is not None
    out.sum().backward()
    assert weights.grad is not None and weights.grad.shape == (5,)


def test_fresh_outputs_are_written_whole(monkeypatch):
    """The lookup (into the kernel's own output), the dense gradient and the contiguous
    copy of a strided output gradient (``_fresh``) go into unzeroed arrays: fill them
    with NaN and check that nothing of it survives, against PyTorch bit for bit."""

    shapes = []

    def nan_filled(shape):
        shapes.append(tuple(shape))
        return np.full(shape, np.nan, dtype=np.float32)

    monkeypatch.setattr(ekt._arrays, "_fresh", nan_filled)
    native = NanOutputs.install(monkeypatch)
    # No gradient array kept from an earlier test: this one's comes from `_fresh`.
    ekt.empty_cache()
    theirs, ours = pair_embedding(300, 40, 9, padding_idx=3)
    ids = torch.randint(0, 300, (7, 90), generator=torch.Generator().manual_seed(1))
    ids[0, :5] = 3
    got, expected = ours(ids), theirs(ids)
    assert_bitwise(got, expected)
    got.sum().backward()
    expected.sum().backward()
    # Most rows are untouched (zeros) and the padding row gets no gradient.
    assert_bitwise(ours.weight.grad, theirs.weight.grad)
    with torch.no_grad():
        assert_bitwise(ours(ids[:, :3]), theirs(ids[:, :3]))  # strided ids, copied
        assert_bitwise(ours(ids[:2]), theirs(ids[:2]))
    # The one row of `sum()`'s broadcast output gradient (every element the same value:
    # copied out as one row, not as the whole output), the gradient; the lookups.
    assert shapes == [(40,), (300, 40)]
    assert native.shapes == [(7, 90, 40), (7, 3, 40), (2, 90, 40)]


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_fresh_bag_outputs_are_written_whole(monkeypatch, mode, include_last_offset):
    """The bag forward writes into an array the kernel allocates unzeroed: NaN-filled
    instead, it must come out
    with PyTorch's bits, empty bags and bags of padding only as zeros; also 2-D ids,
    and rows of no ids as zeros."""
    shapes = NanOutputs.install(monkeypatch).shapes
    options = dict(mode=mode, include_last_offset=include_last_offset, padding_idx=3)
    theirs, ours = pair_bag(40, 20, 6, **options)
    ids = torch.tensor([3, 3, 5, 7, 1, 3, 9], dtype=torch.int64)
    # Bags: [3, 3] (padding only), [] (empty), [5, 7, 1], [3, 9]; with the last
    # offset included, the same bags end at the ids' end.
    starts = [0, 2, 2, 5]
    offsets = torch.tensor(starts + [7] if include_last_offset else starts)
    with torch.no_grad():
        assert_bitwise(ours(ids, offsets), theirs(ids, offsets))
        assert (4, 20) in shapes
        if include_last_offset:
            # 2-D ids take no offsets; PyTorch's handling of the flag there has
            # changed between releases.
            return
        rows = torch.tensor([[3, 5], [3, 3], [8, 2]])
        shapes.clear()
        assert_bitwise(ours(rows), theirs(rows))
        assert (3, 20) in shapes
        # Rows of no ids (PyTorch refuses them): three empty bags, zeros.
        shapes.clear()
        assert_bitwise(ours(torch.zeros(3, 0, dtype=torch.int64)), torch.zeros(3, 20))
        assert (3, 20) in shapes


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_fresh_bag_gradients_are_written_whole(monkeypatch, mode):
    """The bags' dense gradient also goes into an unzeroed array: NaN-filled, it must
    come out with the bits of the same backward into zeros (untouched rows zero)."""
    g = torch.Generator().manual_seed(2)
    ids, offsets = random_bags(g, 300, 60, 9, False, torch.int64)
    grad_out = torch.randn(9, 24, generator=g)

    def gradient():
        _, ours = pair_bag(300, 24, 5, mode=mode)
        (ours(ids, offsets) * grad_out).sum().backward()
        return ours.weight.grad

    want = gradient()
    shapes = []

    def nan_filled(shape):
        shapes.append(tuple(shape))
        return np.full(shape, np.nan, dtype=np.float32)

    monkeypatch.setattr(ekt._arrays, "_fresh", nan_filled)
    ekt.empty_cache()
    assert_bitwise(gradient(), want)
    assert (300, 24) in shapes


def test_a_dense_gradient_reuses_the_array_nobody_holds(monkeypatch):
    """A dense backward writes into an array of an earlier gradient of its shape once
    nothing else holds it (after ``weight.grad = None``), with PyTorch's bits; never into
    a gradient the caller still holds; accumulation into a held ``weight.grad`` is
    PyTorch's; two tables of one shape keep an array each; ``empty_cache()`` lets the
    arrays go."""
    made = []
    fresh = ekt._arrays._fresh

    def counted(shape):
        made.append(tuple(shape))
        return fresh(shape)

    def gradients_made():  # of the table's shape: other arrays may come from `_fresh` too
        return made.count((200, 16))

    monkeypatch.setattr(ekt._arrays, "_fresh", counted)
    ekt.empty_cache()
    pairs = [pair_embedding(200, 16, 11), pair_embedding(200, 16, 13)]
    g = torch.Generator().manual_seed(12)

    def step(scale):
        for theirs, ours in pairs:
            ids = torch.randint(0, 200, (6, 25), generator=g)
            grad_out = torch.randn(6, 25, 16, generator=g) * scale
            for module in (theirs, ours):
                (module(ids) * grad_out).sum().backward()
            assert_bitwise(ours.weight.grad, theirs.weight.grad)

    def clear():
        for theirs, ours in pairs:
            ours.weight.grad = theirs.weight.grad = None

    step(1.0)
    assert gradients_made() == 2
    kept = [ours.weight.grad for _, ours in pairs]
    kept_bits = [k.clone() for k in kept]
    clear()
    step(2.0)
    # Both first gradients are held: two new arrays, and the held ones are untouched.
    assert gradients_made() == 4
    for k, bits in zip(kept, kept_bits):
        assert_bitwise(k, bits)
    del kept, k
    clear()
    step(3.0)
    assert gradients_made() == 4, "free arrays are written again"
    step(4.0)  # accumulated into the held weight.grad, as PyTorch does
    clear()
    ekt.empty_cache()
    step(5.0)
    assert gradients_made() == 6


def test_functions_write_every_element_of_the_outputs_they_allocate():
    # Without `out`, the NumPy functions allocate their outputs as np.empty does, relying
    # on every kernel to write each element: into an `out` of NaN and into one of zeros,
    # each gives the bits of its own fresh output (empty bags and a padding id included).
    rng = np.random.default_rng(9)
    rows, dim, n = 50, 12, 40
    w = rng.standard_normal((rows, dim), dtype=np.float32)
    ids = rng.integers(0, rows, n)
    ids[:3] = 4
    offsets = np.array([0, 0, 5, 5, 17, 30])
    g = rng.standard_normal((n, dim), dtype=np.float32)
    g_bags = rng.standard_normal((len(offsets), dim), dtype=np.float32)
    _, at = ek.embedding_bag(w, ids, offsets, mode="max")
    packed = ek.prepack(w, "int8")
    calls = {
        "embedding": lambda out: ek.embedding(w, ids, padding_idx=4, out=out),
        "dense backward": lambda out: ek.embedding_dense_backward(g, ids, rows, 4, out=out),
        "dequantize": lambda out: ek.dequantize(packed, "int8", dim, out=out),
        "table lookup": lambda out: ek.table_embedding(packed, ids, "int8", dim, out=out),
    }
    for mode in ("sum", "mean", "max"):
        calls[f"bag {mode}"] = lambda out, mode=mode: ek.embedding_bag(
            w, ids, offsets, mode=mode, padding_idx=4, out=out
        )[0]
        calls[f"table bag {mode}"] = lambda out, mode=mode: ek.table_embedding_bag(
            packed, ids, offsets, mode=mode, format="int8", embedding_dim=dim, out=out
        )[0]
        calls[f"bag {mode} backward"] = lambda out, mode=mode: ek.embedding_bag_backward(
            g_bags, ids, rows, offsets, mode=mode, padding_idx=4, max_indices=at, out=out
        )
    for name, call in calls.items():
        fresh = call(None)
        for fill in (np.nan, 0.0):
            out = np.full(fresh.shape, fill, dtype=np.float32)
            call(out)
            assert np.array_equal(out.view(np.uint32), fresh.view(np.uint32)), (name, fill)


def test_the_extension_names_its_optimisation_level():
    # Read by bench/compare.py, which refuses to time an unoptimised build.
    assert ek._native.OPT_LEVEL in {"0", "1", "2", "3", "s", "z"}


def _run(code, **env):
    """Runs `code` in a fresh interpreter with `env` added (and the pool's and
    PyTorch's team's opt-outs only if `env` sets them: conftest.py sets the second for
    this process)."""
    inherited = ("EMBEDDING_KERNELS_CALLER_WAITS", "EMBEDDING_KERNELS_OPENMP")
    base = {k: v for k, v in os.environ.items() if k not in inherited}
    return subprocess.run(
        [sys.executable, "-c", code],
        env=dict(base, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _python(code, **env):
    """`_run`'s stdout, stripped, from a run that succeeded."""
    run = _run(code, **env)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


@pytest.mark.skipif(
    "EMBEDDING_KERNELS_CALLER_WAITS" in os.environ, reason="the main thread opted out of the pool"
)
def test_the_importing_main_thread_works_in_the_pool():
    # The main thread that imported the module is in the crate's pool, so that its
    # calls work on themselves; other threads hand their calls to the pool.
    assert ek._native.caller_in_pool()
    seen = []
    other = threading.Thread(target=lambda: seen.append(ek._native.caller_in_pool()))
    other.start()
    other.join()
    assert seen == [False]
    # The lookup from the main thread in the pool gives the bits of one from another.
    weight = np.random.default_rng(5).standard_normal((5_000, 96), dtype=np.float32)
    ids = np.random.default_rng(6).integers(0, 5_000, 40_000)
    here = ek.embedding(weight, ids)
    there = []
    other = threading.Thread(target=lambda: there.append(ek.embedding(weight, ids)))
    other.start()
    other.join()
    assert np.array_equal(here.view(np.uint32), there[0].view(np.uint32))


def test_the_pool_follows_the_environment_and_the_importing_thread():
    code = "import embedding_kernels as ek; print(ek._native.caller_in_pool())"
    assert _python(code) == "True"
    assert _python(code, EMBEDDING_KERNELS_CALLER_WAITS="1") == "False"
    imported_elsewhere = (
        "import threading\n"
        "out = []\n"
        "def f():\n"
        "    import embedding_kernels as ek\n"
        "    out.append(ek._native.caller_in_pool())\n"
        "t = threading.Thread(target=f); t.start(); t.join(); print(out[0])\n"
    )
    assert _python(imported_elsewhere) == "False"
    # A pool of one thread (the main one): a large call from another thread runs on
    # that thread rather than waiting for the pool.
    one = (
        "import threading, numpy as np, embedding_kernels as ek\n"
        "w = np.ones((100_000, 64), np.float32); ids = np.arange(200_000) % 100_000\n"
        "a = ek.embedding(w, ids); out = []\n"
        "t = threading.Thread(target=lambda: out.append(ek.embedding(w, ids)))\n"
        "t.start(); t.join(); print(np.array_equal(a, out[0]))\n"
    )
    assert _python(one, RAYON_NUM_THREADS="1") == "True"


def test_calls_split_across_the_pool_give_the_bits_of_one_thread():
    # Every kernel, on calls large enough that the pool's threads take part,
    # against the same calls in a pool of one thread (the bits of any thread count);
    # the pool's threads run the kernels' largest bodies (an unoptimised build's
    # bag sum needs a stack of megabytes).
    code = (
        "import hashlib, numpy as np, embedding_kernels as ek\n"
        "rng = np.random.default_rng(3)\n"
        "rows, dim, n = 20_000, 384, 16_384\n"
        "w = rng.standard_normal((rows, dim), dtype=np.float32)\n"
        "ids = rng.integers(0, rows, n)\n"
        "offsets = np.arange(0, n, 16)\n"
        "g = rng.standard_normal((n // 16, dim), dtype=np.float32)\n"
        "gl = rng.standard_normal((n, dim), dtype=np.float32)\n"
        "outs = [ek.embedding(w, ids)]\n"
        "for mode in ('sum', 'mean', 'max'):\n"
        "    out, at = ek.embedding_bag(w, ids, offsets, mode=mode)\n"
        "    outs.append(out)\n"
        "    outs.append(ek.embedding_bag_backward(g, ids, rows, offsets, mode=mode, max_indices=at))\n"
        "for fmt in ('f16', 'bf16', 'int8', 'int4'):\n"
        "    t = w.astype(np.float16) if fmt == 'f16' else ek.prepack(w, fmt) if fmt != 'bf16' else (w.view(np.uint32) >> 16).astype(np.uint16)\n"
        "    outs.append(ek.table_embedding(t, ids, format=fmt, embedding_dim=dim))\n"
        "    outs.append(ek.table_embedding_bag(t, ids, offsets, mode='sum', format=fmt, embedding_dim=dim)[0])\n"
        "outs.append(ek.embedding_dense_backward(gl, ids, rows))\n"
        "outs.extend(ek.embedding_sparse_backward(gl, ids, rows))\n"
        "outs.extend(ek.embedding_bag_sparse_backward(g, ids, rows, offsets, mode='sum'))\n"
        "w2 = w.copy(); ek.embedding_sparse_sgd_step(w2, ids, gl, 0.1); outs.append(w2)\n"
        "w3 = w.copy(); ek.embedding_bag_sparse_sgd_step(w3, ids, offsets, g, 0.1, mode='sum'); outs.append(w3)\n"
        "s = np.zeros_like(w); w4 = w.copy()\n"
        "ek.embedding_sparse_adagrad_step(w4, s, ids, gl, 0.1, 1); outs += [w4, s]\n"
        "print(hashlib.sha256(b''.join(np.ascontiguousarray(o).tobytes() for o in outs)).hexdigest())\n"
    )
    one_thread = _python(code, RAYON_NUM_THREADS="1")
    assert _python(code, RAYON_NUM_THREADS="3") == one_thread
    # With a pool thread spinning between the calls, running the next call's tasks
    # from inside its spin.
    spinning = _python(code, RAYON_NUM_THREADS="3", EMBEDDING_KERNELS_SPIN_US="1000000")
    assert spinning == one_thread


def test_a_pool_thread_spins_after_a_call_for_the_time_set():
    # A spin job is queued from a call's end until the spin runs out (0.3 s here) with
    # no call since; calls from the main thread and another thread during it work.
    code = (
        "import threading, time, numpy as np, embedding_kernels as ek\n"
        "w = np.random.default_rng(1).standard_normal((50_000, 64), dtype=np.float32)\n"
        "ids = np.random.default_rng(2).integers(0, 50_000, 100_000)\n"
        "want = ek.embedding(w, ids)\n"
        "up = ek._native.pool_thread_spinning()\n"
        "same = [np.array_equal(ek.embedding(w, ids), want)]\n"
        "t = threading.Thread(target=lambda: same.append(np.array_equal(ek.embedding(w, ids), want)))\n"
        "t.start(); t.join()\n"
        "end = time.monotonic() + 60\n"
        "while ek._native.pool_thread_spinning() and time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
        "print(up, ek._native.pool_thread_spinning(), same)\n"
    )
    assert _python(code, EMBEDDING_KERNELS_SPIN_US="300000") == "True False [True, True]"
    # Never with a spin of 0, nor in a pool of one thread.
    assert _python(code, EMBEDDING_KERNELS_SPIN_US="0") == "False False [True, True]"
    assert _python(code, RAYON_NUM_THREADS="1") == "False False [True, True]"


def test_the_spinning_thread_runs_the_next_calls_tasks():
    # Calls back to back from the main thread, each split across the pool (10 MB
    # out, five times the crate's threshold): a job spins on the pool's other thread
    # and runs their tasks from its spin, with the bits of a pool of one thread.
    code = (
        "import hashlib, numpy as np, embedding_kernels as ek\n"
        "w = np.random.default_rng(1).standard_normal((50_000, 64), dtype=np.float32)\n"
        "ids = np.random.default_rng(2).integers(0, 50_000, 40_000)\n"
        "offsets = np.arange(0, 40_000, 16)\n"
        "h = hashlib.sha256()\n"
        "for _ in range(20):\n"
        "    h.update(ek.embedding(w, ids).tobytes())\n"
        "    h.update(ek.embedding_bag(w, ids, offsets, mode='sum')[0].tobytes())\n"
        "jobs, tasks = ek._native.pool_spin_counts()\n"
        "print(h.hexdigest(), jobs > 0, tasks > 0)\n"
    )
    alone = _python(code, RAYON_NUM_THREADS="1").split()
    assert alone[1:] == ["False", "False"]
    spinning = _python(code, RAYON_NUM_THREADS="2", EMBEDDING_KERNELS_SPIN_US="1000000").split()
    assert spinning == [alone[0], "True", "True"]
    assert _python(code, RAYON_NUM_THREADS="2", EMBEDDING_KERNELS_SPIN_US="0").split() == [
        alone[0],
        "False",
        "False",
    ]


@pytest.mark.parametrize("value", ["-1", "fast", "1e3", "1000001"])
def test_a_bad_spin_time_is_refused_at_import(value):
    run = _run("import embedding_kernels", EMBEDDING_KERNELS_SPIN_US=value)
    assert run.returncode != 0
    assert "EMBEDDING_KERNELS_SPIN_US" in run.stderr and f'"{value}"' in run.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_runs_on_its_main_thread_and_refuses_other_threads():
    code = (
        "import os, threading, warnings, numpy as np, embedding_kernels as ek\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "w = np.random.default_rng(1).standard_normal((50_000, 64), dtype=np.float32)\n"
        "ids = np.random.default_rng(2).integers(0, 50_000, 100_000)\n"
        "want = ek.embedding(w, ids)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = np.array_equal(ek.embedding(w, ids), want)\n"
        "    seen = []\n"
        "    def other():\n"
        "        try:\n"
        "            ek.embedding(w, ids)\n"
        "            seen.append('ran')\n"
        "        except RuntimeError as e:\n"
        "            seen.append('fork' in str(e))\n"
        "    t = threading.Thread(target=other); t.start(); t.join()\n"
        "    os._exit(0 if ok and seen == [True] else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
    )
    assert _python(code) == "0"


# The lookup and the bag forward, on calls large enough to be split, on every
# kind of input that path takes; their bytes hashed.
_FORWARDS = (
    "import hashlib, numpy as np, embedding_kernels as ek\n"
    "rng = np.random.default_rng(4)\n"
    "rows, dim, n = 20_000, 96, 16_384\n"
    "w = rng.standard_normal((rows, dim), dtype=np.float32)\n"
    "ids = rng.integers(0, rows, n)\n"
    "offsets = np.sort(rng.integers(0, n, 1_500)); offsets[0] = 0\n"
    "psw = rng.standard_normal(n, dtype=np.float32)\n"
    "outs = [ek.embedding(w, ids), ek.embedding(w, ids.astype(np.int32).reshape(128, -1))]\n"
    "for mode in ('sum', 'mean', 'max'):\n"
    "    outs.extend(o for o in ek.embedding_bag(w, ids, offsets, mode=mode, padding_idx=7) if o is not None)\n"
    "    outs.extend(o for o in ek.embedding_bag(w, ids.reshape(1_024, 16), mode=mode) if o is not None)\n"
    "    outs.append(ek.embedding_bag(w, ids, offsets, mode=mode, include_last_offset=True)[0])\n"
    "outs.append(ek.embedding_bag(w, ids, offsets, mode='sum', per_sample_weights=psw)[0])\n"
    "for fmt in ('int8', 'int4'):\n"
    "    t = ek.prepack(w, fmt)\n"
    "    outs.append(ek.table_embedding_bag(t, ids, offsets, mode='mean', format=fmt, embedding_dim=dim)[0])\n"
    "print(hashlib.sha256(b''.join(np.ascontiguousarray(o).tobytes() for o in outs)).hexdigest())\n"
)


def test_forwards_on_pytorchs_openmp_threads_give_the_bits_of_the_pool():
    # With PyTorch loaded (and with it libgomp), the lookup and the bag forward
    # run on its OpenMP threads: the crate's tasks, handed to them.
    on_openmp = (
        "import torch; torch.set_num_threads(3)\n"
        "import embedding_kernels as ek\n"
        "assert ek._native.openmp_threads() == 3, ek._native.openmp_threads()\n"
        "assert ek._native.openmp_threads(1_000) == 0  # small calls stay on the pool\n"
    )
    off = "import torch; torch.set_num_threads(3)\nimport embedding_kernels as ek\nassert ek._native.openmp_threads() == 0\n"
    one_thread = _python(_FORWARDS, RAYON_NUM_THREADS="1")
    assert _python(on_openmp + _FORWARDS) == one_thread
    assert _python(off + _FORWARDS, EMBEDDING_KERNELS_OPENMP="0") == one_thread
    # One OpenMP thread: the rayon pool, as without PyTorch.
    alone = "import torch; torch.set_num_threads(1)\nimport embedding_kernels as ek\nassert ek._native.openmp_threads() == 0\n"
    assert _python(alone + _FORWARDS, RAYON_NUM_THREADS="2") == one_thread


def test_pytorchs_thread_count_is_followed():
    # torch.set_num_threads(1) puts every call on its calling thread, small or
    # large, once a large call has found libgomp; two threads put large calls on the
    # team and leave small ones to the pool; the count is read at each call; the
    # bits are the pool's either way.
    code = (
        "import torch; torch.set_num_threads(1)\n"
        "import embedding_kernels as ek\n"
        "big, small = 1 << 20, 1 << 10\n"
        "seen = [ek._native.torch_call_threads(small)]\n"
        + _FORWARDS.replace("print(", "digest = (", 1)
        + "seen += [ek._native.torch_call_threads(big), ek._native.torch_call_threads(small)]\n"
        "torch.set_num_threads(2)\n"
        "seen += [ek._native.torch_call_threads(big), ek._native.torch_call_threads(small)]\n"
        "print(digest)\n"
        "print(*seen)\n"
    )
    pool = _python(_FORWARDS, RAYON_NUM_THREADS="2")
    digest, seen = _python(code).splitlines()
    assert digest == pool
    # Before a large call, a small one does not look for libgomp (0: the pool).
    assert seen == "0 1 1 2 0"
    off = _python(code, EMBEDDING_KERNELS_OPENMP="0").splitlines()
    assert off == [pool, "0 0 0 0 0"]


def _team_against_one_thread(setup, calls, result):
    """Runs `setup`, then each of `calls` (statements), then hashes the arrays of
    `result` (an expression), in a subprocess: with one rayon thread, where no call
    may reach libgomp's team, and with PyTorch's two OpenMP threads, where each call
    must hand tasks to the team; the same bits both ways."""
    code = "import hashlib, numpy as np, embedding_kernels as ek\n" + setup
    code += "runs = [ek._native.openmp_executor_runs()]\n"
    for call in calls:
        code += call + "\nruns.append(ek._native.openmp_executor_runs())\n"
    code += (
        "print(hashlib.sha256(b''.join(np.ascontiguousarray(o).tobytes()"
        f" for o in {result})).hexdigest())\n"
        "print(*(b > a for a, b in zip(runs, runs[1:])))\n"
    )
    one_thread = _python(code, RAYON_NUM_THREADS="1").splitlines()
    assert one_thread[1] == " ".join(["False"] * len(calls))
    on_openmp = _python("import torch; torch.set_num_threads(2)\n" + code).splitlines()
    assert on_openmp == [one_thread[0], " ".join(["True"] * len(calls))]


def test_a_few_long_bags_run_on_the_openmp_threads():
    # 8 bags of 2 048 ids, an output of 8 rows (2 KiB) over 16 384 rows read, in
    # float32 and in packed and half rows: their rows, not their small output, are
    # the work, so with PyTorch loaded they go to its team, in several tasks.
    setup = (
        "rng = np.random.default_rng(9)\n"
        "rows, dim, n = 20_000, 64, 16_384\n"
        "w = rng.standard_normal((rows, dim), dtype=np.float32)\n"
        "ids = rng.integers(0, rows, n)\n"
        "offsets = np.arange(0, n, 2_048)\n"
        "int8, f16 = ek.prepack(w, 'int8'), w.astype(np.float16)\n"
        "outs = []\n"
    )
    calls = [
        f"outs.extend(o for o in ek.embedding_bag(w, ids, offsets, mode='{mode}') if o is not None)"
        for mode in ("sum", "max")
    ] + [
        f"outs.append(ek.table_embedding_bag({fmt}, ids, offsets, format='{fmt}', embedding_dim=dim)[0])"
        for fmt in ("int8", "f16")
    ]
    _team_against_one_thread(setup, calls, "outs")


def test_a_bad_id_on_openmp_threads_writes_nothing():
    # The last id is out of range: every id is checked before any thread writes.
    code = (
        "import torch; torch.set_num_threads(2)\n"
        "import numpy as np, embedding_kernels as ek\n"
        "assert ek._native.openmp_threads() == 2\n"
        "rows, dim, n = 1_000, 64, 8_192\n"
        "w = np.ones((rows, dim), np.float32)\n"
        "for bad in (rows, -1):\n"
        "    ids = np.arange(n) % rows; ids[-1] = bad\n"
        "    for call, shape in (\n"
        "        (lambda out: ek.embedding(w, ids, out=out), (n, dim)),\n"
        "        (lambda out: ek.embedding_bag(w, ids, np.arange(0, n, 4), mode='sum', out=out), (n // 4, dim)),\n"
        "    ):\n"
        "        out = np.full(shape, np.nan, np.float32)\n"
        "        try:\n"
        "            call(out)\n"
        "        except IndexError as e:\n"
        "            assert str(e) == f'id {bad} at position {n - 1} is out of range for a table of {rows} rows', e\n"
        "        else:\n"
        "            raise AssertionError('no error')\n"
        "        assert np.isnan(out).all()\n"
        "print('ok')\n"
    )
    assert _python(code) == "ok"


class _Doubled(torch.nn.Module):
    """A parametrization: the weight is twice the stored tensor (exact in float32)."""

    def forward(self, stored):
        return stored * 2


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("kind", ["Embedding", "EmbeddingBag"])
def test_a_parametrized_weight_is_read_as_pytorch_reads_it(kind, grad):
    """A weight made by ``torch.nn.utils.parametrize`` lives outside ``_parameters``;
    the modules read it where PyTorch's do, in inference and in training."""
    from torch.nn.utils import parametrize

    torch.manual_seed(8)
    # A sum bag: the mean bag's gradient differs from PyTorch's in the last bits.
    options = {"mode": "sum"} if kind == "EmbeddingBag" else {}
    theirs = getattr(torch.nn, kind)(40, 12, **options)
    ours = getattr(ekt, kind)(40, 12, **options)
    ours.load_state_dict(theirs.state_dict())
    for module in (theirs, ours):
        parametrize.register_parametrization(module, "weight", _Doubled())
    # Distinct ids: the order in which PyTorch's bag backward sums a row's terms is not
    # the crate's (python/README.md), and this test is about where the weight is read.
    ids = torch.randperm(40)[:30].reshape(6, 5)
    with torch.set_grad_enabled(grad):
        got, expected = ours(ids), theirs(ids)
    assert_bitwise(got, expected)
    if grad:
        got.pow(2).sum().backward()
        expected.pow(2).sum().backward()
        stored = [m.parametrizations.weight.original.grad for m in (ours, theirs)]
        assert_bitwise(*stored)


@pytest.mark.parametrize("kind", ["Embedding", "EmbeddingBag"])
def test_strided_tensors_are_served_in_inference(kind):
    """A strided weight or strided ids, which the kernels do not read as they stand, are
    copied before the inference call (``_array``) and served, the weight unchanged."""
    torch.manual_seed(9)
    wide = torch.randn(30, 16)
    theirs = getattr(torch.nn, kind).from_pretrained(wide[:, ::2].clone())
    ours = getattr(ekt, kind).from_pretrained(wide.clone()[:, ::2])
    assert not ours.weight.is_contiguous()
    before = ours.weight.detach().clone()
    ids = torch.randint(0, 30, (7, 4)).t()
    with torch.no_grad():
        assert_bitwise(ours(ids), theirs(ids))
        assert_bitwise(ours(ids.contiguous()), theirs(ids))
    assert_bitwise(ours.weight.detach(), before)
