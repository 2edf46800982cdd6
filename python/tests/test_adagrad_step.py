"""The fused sparse Adagrad step: `embedding_sparse_adagrad_step` and `Embedding.adagrad_in_backward`."""

import ctypes

import numpy as np
import pytest
import torch
from torch import nn

import embedding_kernels as ek
import embedding_kernels.torch as ekt
from helpers import assert_bitwise
from test_training import DIM, VOCAB, Model, train


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


@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("lr_decay, weight_decay, initial", [(0.0, 0.0, 0.0), (0.1, 0.01, 0.3)])
def test_module_backward_is_the_step_bitwise(padding_idx, scale, lr_decay, weight_decay, initial):
    """Three backwards of `adagrad_in_backward` are three calls of the NumPy step, steps
    counted 1, 2, 3, on the module's own accumulators."""
    weight, ids, grads = case(21, shape=(6, 7))
    want_w, want_s = weight.copy(), np.full_like(weight, initial)
    emb = ekt.Embedding.from_pretrained(
        torch.from_numpy(weight.copy()), freeze=False, padding_idx=padding_idx, scale_grad_by_freq=scale
    )
    assert emb.adagrad_state() is None
    assert emb.adagrad_in_backward(0.05, lr_decay, weight_decay, initial) is emb
    for step, grad_out in enumerate(grads, start=1):
        want_w, want_s = expected_step(want_w, want_s, ids, grad_out, 0.05, step, lr_decay,
                                       weight_decay, padding_idx=padding_idx, scale=scale)
        (emb(torch.from_numpy(ids)) * torch.from_numpy(grad_out)).sum().backward()
        assert emb.weight.grad is None
        state = emb.adagrad_state()
        assert int(state["step"]) == step
        assert_bitwise(emb.weight.detach(), torch.from_numpy(want_w))
        assert_bitwise(state["sum"], torch.from_numpy(want_s))
    # Undone: a gradient again, the table and the state left alone.
    emb.adagrad_in_backward(None)
    assert emb.adagrad_state() is None
    stepped = emb.weight.detach().clone()
    emb(torch.from_numpy(ids)).sum().backward()
    assert emb.weight.grad is not None
    assert_bitwise(emb.weight.detach(), stepped)


def test_module_goes_on_from_pytorchs_adagrad_state():
    """Two steps of `torch.optim.Adagrad`, then its state handed to the module for a
    third: the same as PyTorch's third step to a few roundings, with PyTorch's `sum`
    tensor updated in place; and the module's state handed back to PyTorch for a fourth."""
    weight, ids, grads = case(23, shape=(200,))
    grads.append(grads[0] * 0.5)
    theirs = nn.Embedding.from_pretrained(torch.from_numpy(weight.copy()), freeze=False, sparse=True)
    opt = torch.optim.Adagrad(theirs.parameters(), lr=0.1, lr_decay=0.05)

    def their_step(grad_out):
        opt.zero_grad()
        (theirs(torch.from_numpy(ids)) * torch.from_numpy(grad_out)).sum().backward()
        opt.step()

    their_step(grads[0])
    their_step(grads[1])
    ours = ekt.Embedding.from_pretrained(theirs.weight.detach().clone(), freeze=False)
    handed = {"step": opt.state[theirs.weight]["step"].clone(),
              "sum": opt.state[theirs.weight]["sum"].clone()}
    ours.adagrad_in_backward(0.1, lr_decay=0.05, state=handed)
    their_step(grads[2])
    (ours(torch.from_numpy(ids)) * torch.from_numpy(grads[2])).sum().backward()
    state = ours.adagrad_state()
    assert state["sum"] is handed["sum"] and int(state["step"]) == 3
    assert torch.allclose(state["sum"], opt.state[theirs.weight]["sum"], rtol=1e-5, atol=1e-6)
    assert torch.allclose(ours.weight.detach(), theirs.weight.detach(), rtol=0, atol=1e-5)
    # Back to PyTorch: its optimiser over our table and state gives its fourth step.
    back = nn.Embedding.from_pretrained(ours.weight.detach().clone(), freeze=False, sparse=True)
    back_opt = torch.optim.Adagrad(back.parameters(), lr=0.1, lr_decay=0.05)
    back_opt.state[back.weight] = {"step": state["step"], "sum": state["sum"].clone()}
    their_step(grads[3])
    back_opt.zero_grad()
    (back(torch.from_numpy(ids)) * torch.from_numpy(grads[3])).sum().backward()
    back_opt.step()
    assert torch.allclose(back.weight.detach(), theirs.weight.detach(), rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lr": -0.1}, "lr"),
        ({"lr_decay": float("nan")}, "lr_decay"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"initial_accumulator_value": float("inf")}, "initial_accumulator_value"),
        ({"eps": -1e-3}, "eps"),
        ({"state": {"step": 0, "sum": torch.zeros(10, 3)}}, "shape"),
        ({"state": {"step": 0, "sum": torch.zeros(10, 4, dtype=torch.float64)}}, "float32"),
        ({"state": {"step": 0, "sum": torch.zeros(4, 10).t()}}, "contiguous"),
        ({"state": {"step": -1, "sum": torch.zeros(10, 4)}}, "step"),
    ],
)
def test_module_rejects_bad_arguments(kwargs, message):
    emb = ekt.Embedding(10, 4).sgd_in_backward(0.1)
    before = emb._step_in_backward
    with pytest.raises(ValueError, match=message):
        emb.adagrad_in_backward(**kwargs)
    assert emb._step_in_backward is before


def test_module_refused_step_changes_nothing():
    """A state that shares the table's memory passes the module's checks but is refused
    by the step in the backward: table, state and step count unchanged."""
    weight = torch.randn(10, 4)
    emb = ekt.Embedding.from_pretrained(weight, freeze=False)
    emb.adagrad_in_backward(0.1, state={"step": 2, "sum": weight})
    before = weight.clone()
    with pytest.raises(ValueError, match="share memory"):
        emb(torch.tensor([1, 2, 2])).sum().backward()
    assert_bitwise(weight, before)
    assert int(emb.adagrad_state()["step"]) == 2


def adagrad(params):
    return torch.optim.Adagrad(params, lr=0.1)


def test_training_with_adagrad_in_backward_follows_pytorch():
    """`test_training`'s model: nn.Embedding(sparse=True) with Adagrad on the table, and
    ours with the step in its backward (the linear layer on Adagrad in both)."""

    def run(ours: bool):
        torch.manual_seed(0)
        if ours:
            table = ekt.Embedding(VOCAB, DIM, padding_idx=0).adagrad_in_backward(0.1)
        else:
            table = nn.Embedding(VOCAB, DIM, padding_idx=0, sparse=True)
        return train(Model(table, False), True, adagrad, table_in_backward=ours)

    theirs, ours = run(False), run(True)
    assert theirs[-1] < 0.5 * theirs[0]
    diff = (ours - theirs).abs().max().item()
    print(f"adagrad_in_backward: max |loss difference| {diff:.3g}")
    assert diff <= 1e-5
