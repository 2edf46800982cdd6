"""The fused sparse SGD step: `embedding_sparse_sgd_step` and `Embedding.sgd_in_backward`."""

import numpy as np
import pytest
import torch
from torch import nn

import embedding_kernels as ek
import embedding_kernels.torch as ekt
from helpers import assert_bitwise
from test_training import DIM, VOCAB, Model, train


def expected_step(weight, ids, grad_out, lr, weight_decay=0.0, padding_idx=None, scale=False):
    """The step written out in NumPy on the crate's coalesced gradient: each touched row
    once, `w - lr * (g + weight_decay * w)`, every operation rounded to float32 as the
    crate's rule rounds it."""
    rows, values = ek.embedding_sparse_backward(grad_out, ids, weight.shape[0], padding_idx, scale)
    w = weight.copy()
    lr, wd = np.float32(lr), np.float32(weight_decay)
    if wd == 0:
        w[rows] = w[rows] - lr * values
    else:
        w[rows] = w[rows] - lr * (values + wd * w[rows])
    return w


def case(seed, rows=50, dim=13, shape=(40,), dtype=np.int64):
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((rows, dim), dtype=np.float32)
    ids = rng.integers(0, rows, shape).astype(dtype)
    grad_out = rng.standard_normal(shape + (dim,), dtype=np.float32)
    return weight, ids, grad_out


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("padding_idx", [None, 3, -1])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("shape", [(0,), (1,), (40,), (6, 7)])
def test_step_is_the_coalesced_update_bitwise(dtype, padding_idx, scale, weight_decay, shape):
    weight, ids, grad_out = case(len(shape) * 10 + (padding_idx or 0) + 2, shape=shape, dtype=dtype)
    # Repeated ids, so rows sum several terms.
    ids[..., ::3] = 3
    want = expected_step(weight, ids, grad_out, 0.1, weight_decay, padding_idx, scale)
    ek.embedding_sparse_sgd_step(weight, ids, grad_out, 0.1, weight_decay, padding_idx, scale)
    assert_bitwise(torch.from_numpy(weight), torch.from_numpy(want))


def test_step_on_many_rows_and_threads_is_the_coalesced_update():
    """Large enough for the crate to split the step across threads."""
    weight, ids, grad_out = case(5, rows=20_000, dim=64, shape=(50_000,))
    want = expected_step(weight, ids, grad_out, 0.05)
    ek.embedding_sparse_sgd_step(weight, ids, grad_out, 0.05)
    assert_bitwise(torch.from_numpy(weight), torch.from_numpy(want))


def test_step_agrees_with_pytorch_sparse_sgd():
    """PyTorch adds its uncoalesced gradient row by row (fused multiply-adds): the same
    update to within a few float32 roundings."""
    weight, ids, grad_out = case(7, shape=(200,))
    theirs = nn.Embedding.from_pretrained(torch.from_numpy(weight.copy()), freeze=False, sparse=True)
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    (theirs(torch.from_numpy(ids)) * torch.from_numpy(grad_out)).sum().backward()
    opt.step()
    ek.embedding_sparse_sgd_step(weight, ids, grad_out, 0.1)
    assert torch.allclose(torch.from_numpy(weight), theirs.weight.detach(), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda w, i, g: (w, np.append(i, 50), np.concatenate([g, g[:1]])), IndexError, "position 40"),
        (lambda w, i, g: (w, np.append(i, -1), np.concatenate([g, g[:1]])), IndexError, "-1"),
        (lambda w, i, g: (w, i, g[:, :-1].copy()), ValueError, "embedding_dim 12, weight has 13"),
        (lambda w, i, g: (w, i, g[:-1]), ValueError, "grad_out has shape"),
        (lambda w, i, g: (w, i.astype(np.float32), g), ValueError, "ids"),
        (lambda w, i, g: (w, i, g.astype(np.float64)), ValueError, "grad_out must be a float32"),
        (lambda w, i, g: (w.astype(np.float64), i, g), ValueError, "weight must be a float32"),
        (lambda w, i, g: (w[::2], i % 25, g), ValueError, "weight must be C-contiguous"),
        (lambda w, i, g: (w.reshape(-1), i, g), ValueError, "weight must be 2-D"),
    ],
)
def test_bad_arguments_raise_and_write_nothing(change, error, message):
    weight, ids, grad_out = case(11)
    w, i, g = change(weight, ids, grad_out)
    before = np.array(w, copy=True)
    with pytest.raises(error, match=message):
        ek.embedding_sparse_sgd_step(w, i, g, 0.1)
    assert np.array_equal(np.asarray(w), before)


@pytest.mark.parametrize("lr, weight_decay", [(-0.1, 0.0), (float("nan"), 0.0), (0.1, -1.0)])
def test_bad_hyper_parameters_raise_and_write_nothing(lr, weight_decay):
    weight, ids, grad_out = case(12)
    before = weight.copy()
    with pytest.raises(ValueError):
        ek.embedding_sparse_sgd_step(weight, ids, grad_out, lr, weight_decay)
    assert np.array_equal(weight, before)


def test_read_only_or_aliased_weight_is_refused():
    weight, ids, grad_out = case(13)
    frozen = weight.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError):
        ek.embedding_sparse_sgd_step(frozen, ids, grad_out, 0.1)
    assert np.array_equal(frozen, weight)
    # The table passed as its own gradient (ids of one position, a row as wide).
    square, one = weight[:1].copy(), np.zeros(1, dtype=np.int64)
    before = square.copy()
    with pytest.raises(ValueError):
        ek.embedding_sparse_sgd_step(square, one, square, 0.1)
    assert np.array_equal(square, before)


@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("scale", [False, True])
def test_module_backward_steps_the_table(padding_idx, scale):
    weight, ids, grad_out = case(21, shape=(6, 7))
    want = expected_step(weight, ids, grad_out, 0.2, 0.0, padding_idx, scale)
    emb = ekt.Embedding.from_pretrained(
        torch.from_numpy(weight.copy()), freeze=False, padding_idx=padding_idx, scale_grad_by_freq=scale
    )
    assert emb.sgd_in_backward(0.2) is emb
    (emb(torch.from_numpy(ids)) * torch.from_numpy(grad_out)).sum().backward()
    assert emb.weight.grad is None
    assert_bitwise(emb.weight.detach(), torch.from_numpy(want))
    # Undone: the backward makes a gradient again and leaves the table alone.
    emb.sgd_in_backward(None)
    stepped = emb.weight.detach().clone()
    emb(torch.from_numpy(ids)).sum().backward()
    assert emb.weight.grad is not None
    assert_bitwise(emb.weight.detach(), stepped)


def test_module_rejects_bad_hyper_parameters():
    emb = ekt.Embedding(10, 4)
    for lr, wd in [(-1.0, 0.0), (float("nan"), 0.0), (float("inf"), 0.0), (0.1, -0.5)]:
        with pytest.raises(ValueError):
            emb.sgd_in_backward(lr, wd)
    assert emb._step_in_backward is None


def test_module_bad_id_raises_in_the_forward():
    emb = ekt.Embedding(10, 4).sgd_in_backward(0.1)
    before = emb.weight.detach().clone()
    with pytest.raises(IndexError):
        emb(torch.tensor([1, 10]))
    assert_bitwise(emb.weight.detach(), before)


def test_module_steps_with_weight_decay_and_max_norm():
    """max_norm renormalises the looked-up rows in the forward; the step then decays
    and moves those rows only."""
    weight, ids, grad_out = case(31, shape=(30,))
    renormed = torch.from_numpy(weight.copy())
    torch.embedding_renorm_(renormed, torch.from_numpy(ids), 1.5, 2.0)
    want = expected_step(renormed.numpy(), ids, grad_out, 0.2, 0.05)
    emb = ekt.Embedding.from_pretrained(torch.from_numpy(weight.copy()), freeze=False, max_norm=1.5)
    emb.sgd_in_backward(0.2, weight_decay=0.05)
    (emb(torch.from_numpy(ids)) * torch.from_numpy(grad_out)).sum().backward()
    assert_bitwise(emb.weight.detach(), torch.from_numpy(want))
    untouched = np.setdiff1d(np.arange(weight.shape[0]), ids)
    assert_bitwise(emb.weight.detach()[untouched], torch.from_numpy(weight[untouched]))


def test_module_refuses_a_non_contiguous_table():
    """A strided table cannot be updated in place through NumPy: the backward raises
    and the table is unchanged, rather than a copy being stepped."""
    base = torch.randn(13, 20)
    emb = ekt.Embedding.from_pretrained(base.t(), freeze=False).sgd_in_backward(0.1)
    before = emb.weight.detach().clone()
    out = emb(torch.tensor([1, 2, 2]))
    with pytest.raises(ValueError, match="contiguous"):
        out.sum().backward()
    assert_bitwise(emb.weight.detach(), before)


def test_module_step_bumps_the_table_version():
    """A graph that also saved the table (a tied layer) sees the in-place step and raises."""
    emb = ekt.Embedding(10, 4).sgd_in_backward(0.1)
    ids = torch.tensor([1, 2, 3])
    x = torch.randn(5, 4, requires_grad=True)
    tied = x @ emb.weight.t()  # saves emb.weight for x's gradient
    version = emb.weight._version
    emb(ids).sum().backward(retain_graph=True)
    assert emb.weight._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        tied.sum().backward()


def train_in_backward(lr=0.5):
    """`test_training.train`'s model and batches, the table stepped in its backward."""
    torch.manual_seed(0)
    table = ekt.Embedding(VOCAB, DIM, padding_idx=0).sgd_in_backward(lr)
    return train(Model(table, False), False, table_in_backward=True)


def test_training_with_the_step_in_backward_follows_pytorch():
    """The same curve as nn.Embedding(sparse=True) with SGD (test_training's model)."""
    torch.manual_seed(0)
    theirs_model = Model(nn.Embedding(VOCAB, DIM, padding_idx=0, sparse=True), False)
    theirs = train(theirs_model, True)
    ours = train_in_backward()
    assert theirs[-1] < 0.5 * theirs[0]
    diff = (ours - theirs).abs().max().item()
    print(f"sgd_in_backward: max |loss difference| {diff:.3g}")
    assert diff <= 1e-5
