"""The fused sparse Adagrad step: `embedding_sparse_adagrad_step`."""

import ctypes

import numpy as np
import pytest
import torch
from torch import nn

import embedding_kernels as ek
from helpers import assert_bitwise


def expected_step(weight, state, ids, grad_out, lr, step, lr_decay=0.0, weight_decay=0.0,
                  eps=1e-10, padding_idx=None, scale=False):
    """The step written out in NumPy on the crate's coalesced gradient, every operation
    rounded to float32 as the crate's rule rounds it; returns the new weight and state."""
    rows, values = ek.embedding_sparse_backward(grad_out, ids, weight.shape[0], padding_idx, scale)
    w, s = weight.copy(), state.copy()
    f = np.float32
    clr = f(lr) / (f(1) + f(step - 1) * f(lr_decay))
    g = values if weight_decay == 0 else values + f(weight_decay) * w[rows]
    s[rows] = s[rows] + g * g
    w[rows] = w[rows] + (-clr) * (g / (np.sqrt(s[rows]) + f(eps)))
    return w, s


def case(seed, rows=50, dim=13, shape=(40,), dtype=np.int64):
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((rows, dim), dtype=np.float32)
    ids = rng.integers(0, rows, shape).astype(dtype)
    grads = [rng.standard_normal(shape + (dim,), dtype=np.float32) for _ in range(3)]
    return weight, ids, grads


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("padding_idx", [None, 3])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("lr_decay, weight_decay", [(0.0, 0.0), (0.1, 0.01)])
@pytest.mark.parametrize("shape", [(0,), (40,), (6, 7)])
def test_steps_are_the_rule_on_the_coalesced_gradient_bitwise(
    dtype, padding_idx, scale, lr_decay, weight_decay, shape
):
    weight, ids, grads = case(len(shape) + (padding_idx or 0), shape=shape, dtype=dtype)
    ids[..., ::3] = 3  # repeated ids: rows that sum several terms
    state = np.full_like(weight, 0.1)
    want_w, want_s = weight.copy(), state.copy()
    for step, grad_out in enumerate(grads, start=1):
        want_w, want_s = expected_step(want_w, want_s, ids, grad_out, 0.05, step, lr_decay,
                                       weight_decay, padding_idx=padding_idx, scale=scale)
        ek.embedding_sparse_adagrad_step(weight, state, ids, grad_out, 0.05, step, lr_decay,
                                         weight_decay, padding_idx=padding_idx,
                                         scale_grad_by_freq=scale)
        assert_bitwise(torch.from_numpy(weight), torch.from_numpy(want_w))
        assert_bitwise(torch.from_numpy(state), torch.from_numpy(want_s))


def test_steps_on_many_rows_and_threads_are_the_rule():
    """Large enough for the crate to split the step across threads."""
    weight, ids, grads = case(5, rows=20_000, dim=64, shape=(50_000,))
    state = np.zeros_like(weight)
    want_w, want_s = expected_step(weight, state, ids, grads[0], 0.05, 1)
    ek.embedding_sparse_adagrad_step(weight, state, ids, grads[0], 0.05, 1)
    assert_bitwise(torch.from_numpy(weight), torch.from_numpy(want_w))
    assert_bitwise(torch.from_numpy(state), torch.from_numpy(want_s))


def test_steps_agree_with_pytorch_sparse_adagrad():
    """`torch.optim.Adagrad` on `sparse=True` gradients, three steps with `lr_decay`: the
    same state to float32 rounding and the same weights to a few roundings (PyTorch sums
    an uncoalesced gradient and fuses its update's multiply and add)."""
    weight, ids, grads = case(7, shape=(200,))
    theirs = nn.Embedding.from_pretrained(torch.from_numpy(weight.copy()), freeze=False, sparse=True)
    opt = torch.optim.Adagrad(theirs.parameters(), lr=0.1, lr_decay=0.05,
                              initial_accumulator_value=0.2)
    state = np.full_like(weight, 0.2)
    for step, grad_out in enumerate(grads, start=1):
        opt.zero_grad()
        (theirs(torch.from_numpy(ids)) * torch.from_numpy(grad_out)).sum().backward()
        opt.step()
        ek.embedding_sparse_adagrad_step(weight, state, ids, grad_out, 0.1, step, lr_decay=0.05)
    their_state = opt.state[theirs.weight]["sum"]
    assert int(opt.state[theirs.weight]["step"]) == 3
    assert torch.allclose(torch.from_numpy(state), their_state, rtol=1e-5, atol=1e-6)
    assert torch.allclose(torch.from_numpy(weight), theirs.weight.detach(), rtol=0, atol=1e-5)
    assert not np.array_equal(weight, case(7, shape=(200,))[0])


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda w, s, i, g: (w, s, np.append(i, 50), np.concatenate([g, g[:1]]), 1), IndexError,
         "position 40"),
        (lambda w, s, i, g: (w, s[:-1].copy(), i, g, 1), ValueError, "state_sum has shape"),
        (lambda w, s, i, g: (w, s.astype(np.float64), i, g, 1), ValueError, "state_sum must be"),
        (lambda w, s, i, g: (w, s, i, g, 0), ValueError, "step counts from 1"),
        (lambda w, s, i, g: (w, s, i, g[:, :-1].copy(), 1), ValueError, "embedding_dim 12"),
        (lambda w, s, i, g: (w, w, i, g, 1), ValueError, "cannot be written"),
    ],
)
def test_bad_arguments_raise_and_write_nothing(change, error, message):
    weight, ids, grads = case(11)
    state = np.full_like(weight, 0.1)
    w, s, i, g, step = change(weight, state, ids, grads[0])
    before_w, before_s = np.array(w, copy=True), np.array(s, copy=True)
    with pytest.raises(error, match=message):
        ek.embedding_sparse_adagrad_step(w, s, i, g, 0.1, step)
    assert np.array_equal(np.asarray(w), before_w)
    assert np.array_equal(np.asarray(s), before_s)


def test_state_over_the_weights_memory_is_refused():
    """Two arrays over one buffer that NumPy does not know are related (the second made
    from the first's address): refused, nothing written."""
    weight, ids, grads = case(13)
    before = weight.copy()
    floats = (ctypes.c_float * weight.size).from_address(weight.ctypes.data)
    state = np.ctypeslib.as_array(floats).reshape(weight.shape)
    assert np.shares_memory(state, weight) and state.flags.writeable
    with pytest.raises(ValueError, match="share memory"):
        ek.embedding_sparse_adagrad_step(weight, state, ids, grads[0], 0.1, 1)
    assert np.array_equal(weight, before)


@pytest.mark.parametrize("name, value", [("lr", -0.1), ("lr_decay", float("nan")),
                                         ("weight_decay", -1.0), ("eps", -1e-3)])
def test_bad_hyper_parameters_raise_and_write_nothing(name, value):
    weight, ids, grads = case(12)
    state = np.zeros_like(weight)
    before_w, before_s = weight.copy(), state.copy()
    args = {"lr": 0.1, "lr_decay": 0.0, "weight_decay": 0.0, "eps": 1e-10, name: value}
    with pytest.raises(ValueError, match=name):
        ek.embedding_sparse_adagrad_step(weight, state, ids, grads[0], args["lr"], 1,
                                         args["lr_decay"], args["weight_decay"], args["eps"])
    assert np.array_equal(weight, before_w)
    assert np.array_equal(state, before_s)
