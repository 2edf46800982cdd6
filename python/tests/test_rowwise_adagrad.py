"""The fused row-wise Adagrad step (FBGEMM's EXACT_ROWWISE_ADAGRAD): the NumPy
functions and `rowwise_adagrad_in_backward`, against the rule written out in NumPy."""

import numpy as np
import pytest
import torch

import embedding_kernels as ek
import embedding_kernels.torch as ekt
from helpers import assert_bitwise


def expected(weight, state, rows, values, lr, weight_decay=0.0, eps=1e-8):
    """The rule on each touched row of the coalesced gradient, in float32 and in the
    kernel's order: the squares summed column after column."""
    w, s = weight.copy(), state.copy()
    lr, wd, eps = np.float32(lr), np.float32(weight_decay), np.float32(eps)
    for r, g in zip(rows, values):
        g = g + wd * w[r] if wd != 0 else g
        squares = np.float32(0)
        for x in g:
            squares = np.float32(squares + x * x)
        s[r] = np.float32(s[r] + squares / np.float32(len(g)))
        step = lr / (np.sqrt(s[r]) + eps)
        w[r] = w[r] - step * g
    return w, s


def case(seed, rows=40, dim=9, n=60):
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((rows, dim), dtype=np.float32)
    ids = rng.integers(0, rows, n)
    ids[::4] = 5  # a row summed from several positions
    return weight, ids, rng.standard_normal((n, dim), dtype=np.float32)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("padding_idx", [None, 5])
def test_the_lookups_step_is_the_rule(weight_decay, padding_idx):
    weight, ids, grad = case(1)
    state = np.full(40, 0.1, dtype=np.float32)
    rows, values = ek.embedding_sparse_backward(grad, ids, 40, padding_idx)
    want_w, want_s = expected(weight, state, rows, values, 0.05, weight_decay)
    ek.embedding_sparse_rowwise_adagrad_step(weight, state, ids, grad, 0.05, weight_decay,
                                             padding_idx=padding_idx)
    assert_bitwise(torch.from_numpy(weight), torch.from_numpy(want_w))
    assert_bitwise(torch.from_numpy(state), torch.from_numpy(want_s))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_the_bags_step_is_the_rule(mode):
    weight, ids, _ = case(2)
    offsets = np.array([0, 7, 7, 30, 41])
    grad = np.random.default_rng(3).standard_normal((5, 9), dtype=np.float32)
    state = np.zeros(40, dtype=np.float32)
    rows, values = ek.embedding_bag_sparse_backward(grad, ids, 40, offsets, mode=mode)
    want_w, want_s = expected(weight, state, rows, values, 0.05)
    ek.embedding_bag_sparse_rowwise_adagrad_step(weight, state, ids, offsets, grad, 0.05, mode=mode)
    assert_bitwise(torch.from_numpy(weight), torch.from_numpy(want_w))
    assert_bitwise(torch.from_numpy(state), torch.from_numpy(want_s))


def test_a_refused_step_writes_nothing():
    weight, ids, grad = case(4)
    state = np.zeros(40, dtype=np.float32)
    before = weight.copy()
    ids[3] = 40
    with pytest.raises(IndexError):
        ek.embedding_sparse_rowwise_adagrad_step(weight, state, ids, grad, 0.05)
    ids[3] = 0
    with pytest.raises(ValueError, match="one value a row"):
        ek.embedding_sparse_rowwise_adagrad_step(weight, np.zeros(39, np.float32), ids, grad, 0.05)
    with pytest.raises(ValueError, match="lr"):
        ek.embedding_sparse_rowwise_adagrad_step(weight, state, ids, grad, -1.0)
    assert np.array_equal(weight, before) and not state.any()


@pytest.mark.parametrize("module", [ekt.Embedding, ekt.EmbeddingBag])
def test_the_modules_step_in_backward_is_the_rule(module):
    torch.manual_seed(0)
    layer = module(40, 9, **({"mode": "sum"} if module is ekt.EmbeddingBag else {}))
    layer.rowwise_adagrad_in_backward(lr=0.05, initial_accumulator_value=0.1)
    weight = layer.weight.detach().numpy().copy()
    state = layer.rowwise_adagrad_state().numpy().copy()
    for step in range(3):
        ids = torch.randint(0, 40, (6, 5), generator=torch.Generator().manual_seed(step))
        out = layer(ids)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + step))
        (out * grad).sum().backward()
        g = grad.numpy()
        flat = ids.numpy()
        if module is ekt.EmbeddingBag:
            rows, values = ek.embedding_bag_sparse_backward(g, flat, 40, mode="sum")
        else:
            rows, values = ek.embedding_sparse_backward(g, flat, 40)
        weight, state = expected(weight, state, rows, values, 0.05)
        assert_bitwise(layer.weight.detach(), torch.from_numpy(weight))
        assert_bitwise(layer.rowwise_adagrad_state(), torch.from_numpy(state))
    assert layer.weight.grad is None
