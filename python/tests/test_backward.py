"""Gradients against PyTorch's: dense, sparse, per_sample_weights."""

import pytest
import torch
import torch.nn.functional as F

import embedding_kernels as ek
import embedding_kernels.torch as ekt
from helpers import assert_bitwise, assert_within_sum_bound
from test_forward import pair_bag, pair_embedding, random_bags


def embedding_grads(theirs, ours, ids, grad_out):
    """Both modules' weight gradients for the loss sum(out * grad_out)."""
    (theirs(ids) * grad_out).sum().backward()
    (ours(ids) * grad_out).sum().backward()
    return ours.weight.grad, theirs.weight.grad


def abs_embedding_grad(ids, grad_out, n, **options):
    """The gradient's terms' magnitudes, summed in float64 (the rounding bound's scale)."""
    w = torch.zeros(n, grad_out.shape[-1], dtype=torch.float64, requires_grad=True)
    (F.embedding(ids, w, **options) * grad_out.double().abs()).sum().backward()
    return w.grad


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("shape", [(0,), (40,), (6, 7), (2, 3, 4)])
def test_embedding_dense_grad_bitwise(dtype, padding_idx, shape):
    """Each row's gradients are summed in position order, as PyTorch's CPU kernel does."""
    g = torch.Generator().manual_seed(len(shape) * 7 + (padding_idx or 0))
    theirs, ours = pair_embedding(9, 13, 4, padding_idx=padding_idx)
    ids = torch.randint(0, 9, shape, generator=g, dtype=dtype)
    grad_out = torch.randn(shape + (13,), generator=g)
    got, expected = embedding_grads(theirs, ours, ids, grad_out)
    assert_bitwise(got, expected)
    if padding_idx is not None:
        assert torch.all(got[padding_idx] == 0)


@pytest.mark.parametrize("case", range(6))
def test_embedding_scale_grad_by_freq_within_bound(case):
    """scale_grad_by_freq: the crate divides each row's sum by its count, PyTorch adds each
    term times 1/count. Equal within the summation bound."""
    g = torch.Generator().manual_seed(case)
    theirs, ours = pair_embedding(7, 10, case, scale_grad_by_freq=True, padding_idx=[None, 1][case % 2])
    ids = torch.randint(0, 7, (50,), generator=g)
    grad_out = torch.randn(50, 10, generator=g)
    got, expected = embedding_grads(theirs, ours, ids, grad_out)
    scale = abs_embedding_grad(ids, grad_out, 7, scale_grad_by_freq=True)
    assert_within_sum_bound(got, expected, scale, 50)


@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_sparse_grad(scale_grad_by_freq, padding_idx):
    """sparse=True: a coalesced sparse gradient of the table's shape, rows ascending, whose
    values are the dense gradient's rows bit for bit; PyTorch's (uncoalesced) sums to the
    same within the bound. PyTorch 2.15 refuses scale_grad_by_freq with sparse gradients;
    there its dense gradient is the reference."""
    g = torch.Generator().manual_seed(11)
    options = dict(scale_grad_by_freq=scale_grad_by_freq, padding_idx=padding_idx)
    theirs, _ = pair_embedding(12, 5, 0, sparse=not scale_grad_by_freq, **options)
    _, ours = pair_embedding(12, 5, 0, sparse=True, **options)
    ids = torch.randint(0, 12, (4, 6), generator=g)
    grad_out = torch.randn(4, 6, 5, generator=g)
    got, expected = embedding_grads(theirs, ours, ids, grad_out)
    assert_coalesced(got, (12, 5))
    rows = got._indices()[0]
    assert padding_idx is None or padding_idx not in rows.tolist()
    dense = ek.embedding_dense_backward(
        grad_out.numpy(), ids.numpy(), 12, padding_idx, scale_grad_by_freq
    )
    assert_bitwise(got.to_dense(), torch.from_numpy(dense))
    scale = abs_embedding_grad(ids, grad_out, 12, scale_grad_by_freq=scale_grad_by_freq)
    expected = expected.coalesce().to_dense() if expected.is_sparse else expected
    assert_within_sum_bound(got.to_dense(), expected, scale, ids.numel())


def assert_coalesced(grad, shape):
    """A sparse COO gradient of ``shape`` whose rows are distinct and ascending. (Autograd
    copies a gradient into ``.grad`` without its is_coalesced flag, so the rows are checked.)"""
    assert grad.is_sparse and grad.shape == shape
    rows = grad._indices()[0]
    assert torch.all(rows[1:] > rows[:-1])


def bag_grads(theirs, ours, ids, offsets, grad_out, weights=None):
    wt = wo = None
    if weights is not None:
        wt, wo = weights.clone().requires_grad_(), weights.clone().requires_grad_()
    (theirs(ids, offsets, wt) * grad_out).sum().backward()
    (ours(ids, offsets, wo) * grad_out).sum().backward()
    return ours.weight.grad, theirs.weight.grad, wo, wt


BAG_CASES = [
    (mode, include_last_offset, padding_idx, sparse, case)
    for mode in ["sum", "mean", "max"]
    for include_last_offset in [False, True]
    for padding_idx in [None, 1]
    for sparse in [False, True]
    for case in range(3)
    if not (sparse and mode == "max")
]


@pytest.mark.parametrize("mode,include_last_offset,padding_idx,sparse,case", BAG_CASES)
def test_embedding_bag_grad(mode, include_last_offset, padding_idx, sparse, case):
    """Max: bitwise (each column's gradient goes to its winner). Sum and mean: PyTorch sums
    a row's terms in another order, so within the summation bound."""
    g = torch.Generator().manual_seed(case * 31 + len(mode))
    n, d = 15, 21
    theirs, ours = pair_bag(
        n, d, case, mode=mode, include_last_offset=include_last_offset,
        padding_idx=padding_idx, sparse=sparse,
    )
    ids, offsets = random_bags(g, n, 45, 6, include_last_offset, torch.int64)
    grad_out = torch.randn(theirs(ids, offsets).shape, generator=g)
    got, expected, _, _ = bag_grads(theirs, ours, ids, offsets, grad_out)
    if sparse:
        assert_coalesced(got, (n, d))
        got, expected = got.to_dense(), expected.coalesce().to_dense()
    if mode == "max":
        assert_bitwise(got, expected)
        return
    w = torch.zeros(n, d, dtype=torch.float64, requires_grad=True)
    out = F.embedding_bag(ids, w, offsets, mode=mode, include_last_offset=include_last_offset, padding_idx=padding_idx)
    (out * grad_out.double().abs()).sum().backward()
    assert_within_sum_bound(got, expected, w.grad, ids.numel())


@pytest.mark.parametrize("case", range(4))
def test_per_sample_weights_grad(case):
    """Both gradients of a weighted sum: the table's within the summation bound, and the
    weights' (a dot product of length embedding_dim per id, computed with torch) within
    the bound of a dot product."""
    g = torch.Generator().manual_seed(case)
    n, d = 10, 16
    theirs, ours = pair_bag(n, d, case, mode="sum", padding_idx=[None, 2][case % 2])
    ids, offsets = random_bags(g, n, 30, 4, False, torch.int64)
    weights = torch.randn(30, generator=g)
    grad_out = torch.randn(4, d, generator=g)
    got, expected, wo, wt = bag_grads(theirs, ours, ids, offsets, grad_out, weights)
    w = torch.zeros(n, d, dtype=torch.float64, requires_grad=True)
    out = F.embedding_bag(ids, w, offsets, mode="sum", per_sample_weights=weights.double().abs(), padding_idx=theirs.padding_idx)
    (out * grad_out.double().abs()).sum().backward()
    assert_within_sum_bound(got, expected, w.grad, 30)
    table = theirs.weight.detach().double().abs()
    bag_of = torch.searchsorted(offsets, torch.arange(30), right=True) - 1
    dot_scale = (grad_out.double().abs()[bag_of] * table[ids]).sum(1)
    assert_within_sum_bound(wo.grad, wt.grad, dot_scale, d)


def test_frozen_table_gets_no_gradient():
    ours = ekt.Embedding.from_pretrained(torch.randn(5, 3))
    out = ours(torch.tensor([1, 2]))
    assert not out.requires_grad and ours.weight.grad is None


# Gradients that repeat rows, as autograd makes them: a loss of `out.sum()` broadcasts one
# value to every element, a sum over the sequence (`out.sum(1)`) each sequence's row over
# its positions (stride 0 in those dimensions). The module reads the distinct rows instead
# of copying the whole gradient out (`_lookup_batch`); the result must have the bits of the
# same gradient made contiguous.
REPEATS = [
    ("sum", (6, 50), lambda out, g: out.sum()),
    ("sum(1)", (6, 50), lambda out, g: (out.sum(1) * g[:, 0]).sum()),
    ("3-D sum(2)", (3, 4, 25), lambda out, g: (out.sum(2) * g[:, :, 0]).sum()),
    ("3-D sum((1, 2))", (3, 4, 25), lambda out, g: (out.sum((1, 2)) * g[:, 0, 0]).sum()),
    ("size-1 dimension", (5, 1, 30), lambda out, g: (out.sum(2) * g[:, :, 0]).sum()),
    ("1-D sum", (200,), lambda out, g: out.sum()),
]


@pytest.mark.parametrize("name, shape, loss", REPEATS, ids=[r[0] for r in REPEATS])
@pytest.mark.parametrize("way", ["dense", "sparse", "sgd", "adagrad"])
@pytest.mark.parametrize("padding_idx, scale", [(None, False), (3, True)])
def test_repeated_gradient_rows_give_the_contiguous_bits(name, shape, loss, way, padding_idx, scale):
    g = torch.Generator().manual_seed(len(shape) * 11 + len(name))
    table = torch.randn(40, 9, generator=g)
    ids = torch.randint(0, 40, shape, generator=g)
    ids.view(-1)[::3] = 3  # rows that sum many terms, the padding row among them
    factors = torch.randn(shape + (9,), generator=g)

    def module():
        m = ekt.Embedding.from_pretrained(table.clone(), freeze=False, padding_idx=padding_idx,
                                          scale_grad_by_freq=scale, sparse=way == "sparse")
        if way == "sgd":
            m.sgd_in_backward(0.1, weight_decay=0.01)
        elif way == "adagrad":
            m.adagrad_in_backward(0.1, lr_decay=0.1)
        return m

    # The gradient the loss hands the lookup, as autograd lays it out: with repeated rows.
    out = torch.zeros(shape + (9,), requires_grad=True)
    handed = []
    out.register_hook(lambda grad: handed.append(grad))
    loss(out, factors).backward()
    assert 0 in handed[0].stride()
    ours, reference = module(), module()
    loss(ours(ids), factors).backward()
    (reference(ids) * handed[0].contiguous()).sum().backward()
    if way in ("dense", "sparse"):
        got, want = ours.weight.grad, reference.weight.grad
        if way == "sparse":
            got, want = got.to_dense(), want.to_dense()
        assert_bitwise(got, want)
    else:
        assert_bitwise(ours.weight.detach(), reference.weight.detach())
        if way == "adagrad":
            assert_bitwise(ours.adagrad_state()["sum"], reference.adagrad_state()["sum"])


# Every backward and fused step, on calls large enough to be split (a dense
# gradient past the caches, sparse gradients of 2 MiB and more); their bytes
# hashed, and how many times the crate handed tasks to libgomp's team.
_BACKWARDS = (
    "import hashlib, numpy as np, embedding_kernels as ek\n"
    "rng = np.random.default_rng(6)\n"
    "rows, dim, n = 40_000, 64, 16_384\n"
    "w = rng.standard_normal((rows, dim), dtype=np.float32)\n"
    "ids = rng.integers(0, 3_000, n)\n"
    "g = rng.standard_normal((n, dim), dtype=np.float32)\n"
    "offsets = np.arange(0, n, 2)\n"
    "gb = rng.standard_normal((offsets.size, dim), dtype=np.float32)\n"
    "outs = [ek.embedding_dense_backward(g, ids, rows, padding_idx=7, scale_grad_by_freq=True)]\n"
    "outs.extend(ek.embedding_sparse_backward(g, ids, rows))\n"
    "for mode in ('sum', 'mean'):\n"
    "    outs.append(ek.embedding_bag_backward(gb, ids, rows, offsets, mode=mode))\n"
    "    outs.extend(ek.embedding_bag_sparse_backward(gb, ids, rows, offsets, mode=mode))\n"
    "_, m = ek.embedding_bag(w, ids, offsets, mode='max')\n"
    "outs.append(ek.embedding_bag_backward(gb, ids, rows, offsets, mode='max', max_indices=m))\n"
    "t, s = w.copy(), np.zeros_like(w)\n"
    "ek.embedding_sparse_sgd_step(t, ids, g, 0.5, weight_decay=0.01, padding_idx=7)\n"
    "ek.embedding_sparse_adagrad_step(t, s, ids, g, 0.1, 1)\n"
    "ek.embedding_bag_sparse_sgd_step(t, ids, offsets, gb, 0.5, mode='sum')\n"
    "ek.embedding_bag_sparse_adagrad_step(t, s, ids, offsets, gb, 0.1, 2)\n"
    "outs += [t, s]\n"
    "print(hashlib.sha256(b''.join(np.ascontiguousarray(o).tobytes() for o in outs)).hexdigest())\n"
    "print(ek._native.openmp_executor_runs() > 0)\n"
)


def test_backwards_on_pytorchs_openmp_threads_give_the_bits_of_one_thread():
    # With PyTorch loaded, the crate hands the backwards' and the steps' tasks
    # to its OpenMP threads: the same tasks, so the same bits.
    from test_forward import _python

    one_thread = _python(_BACKWARDS, RAYON_NUM_THREADS="1")
    digest = one_thread.splitlines()[0]
    assert one_thread.splitlines()[1] == "False"
    on_openmp = "import torch; torch.set_num_threads(3)\n"
    assert _python(on_openmp + _BACKWARDS).splitlines() == [digest, "True"]
    off = _python(on_openmp + _BACKWARDS, EMBEDDING_KERNELS_OPENMP="0")
    assert off.splitlines() == [digest, "False"]


def test_a_gradient_of_one_row_over_many_ids_runs_on_the_openmp_threads():
    # One bag's row over many ids, as the modules hand on a broadcast gradient
    # (`out.sum()`'s): a few bytes of gradient, but a row a position to add, so
    # these calls go to PyTorch's team like a gradient of a row a position would;
    # on the crate's pool instead, they would share the cores with the team's
    # threads still spinning after a torch op. Same bits either way.
    from test_forward import _team_against_one_thread

    setup = (
        "rng = np.random.default_rng(8)\n"
        "rows, dim, n = 40_000, 64, 16_384\n"
        "w = rng.standard_normal((rows, dim), dtype=np.float32)\n"
        "ids = rng.integers(0, 3_000, n)\n"
        "g = rng.standard_normal((1, dim), dtype=np.float32)\n"
        "one_bag = np.zeros(1, np.int64)\n"
        "t, s = w.copy(), np.zeros_like(w)\n"
    )
    calls = [
        "ek.embedding_bag_sparse_sgd_step(t, ids, one_bag, g, 0.5, mode='sum')",
        "ek.embedding_bag_sparse_adagrad_step(t, s, ids, one_bag, g, 0.1, 1)",
        "sparse = ek.embedding_bag_sparse_backward(g, ids, rows, one_bag, mode='sum')",
    ]
    _team_against_one_thread(setup, calls, "[t, s, *sparse]")


def test_a_bad_id_in_a_step_on_openmp_threads_changes_nothing():
    # The last id is out of range: the step is refused before any thread writes.
    from test_forward import _python

    code = (
        "import torch; torch.set_num_threads(2)\n"
        "import numpy as np, embedding_kernels as ek\n"
        "rows, dim, n = 1_000, 64, 16_384\n"
        "w = np.random.default_rng(1).standard_normal((rows, dim), dtype=np.float32)\n"
        "g = np.ones((n, dim), np.float32)\n"
        "for bad in (rows, -1):\n"
        "    ids = np.arange(n) % rows; ids[-1] = bad\n"
        "    t = w.copy()\n"
        "    for call in (\n"
        "        lambda: ek.embedding_sparse_sgd_step(t, ids, g, 0.5),\n"
        "        lambda: ek.embedding_dense_backward(g, ids, rows, out=t),\n"
        "    ):\n"
        "        try:\n"
        "            call()\n"
        "        except IndexError as e:\n"
        "            assert str(e) == f'id {bad} at position {n - 1} is out of range for a table of {rows} rows', e\n"
        "        else:\n"
        "            raise AssertionError('no error')\n"
        "        assert np.array_equal(t, w)\n"
        "print(ek._native.openmp_threads(), 'ok')\n"
    )
    assert _python(code) == "2 ok"
