"""The fused sparse steps of a bag forward's gradient: `embedding_bag_sparse_sgd_step`,
`embedding_bag_sparse_adagrad_step`, and `EmbeddingBag.sgd_in_backward` / `adagrad_in_backward`."""

import numpy as np
import pytest
import torch
from torch import nn

import embedding_kernels as ek
import embedding_kernels.torch as ekt
from helpers import assert_bitwise
from test_adagrad_step import adagrad
from test_training import DIM, VOCAB, Model, sgd, train

ROWS, WIDTH = 50, 13


def batch(seed, two_d=False, include_last_offset=False, weighted=False, dtype=np.int64):
    """Ids with repeats, offsets with an empty bag, output gradients for three steps."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((ROWS, WIDTH), dtype=np.float32)
    if two_d:
        ids, offsets, bags = rng.integers(0, ROWS, (6, 5)).astype(dtype), None, 6
    else:
        ids = rng.integers(0, ROWS, 40).astype(dtype)
        offsets = np.array([0, 7, 7, 19, 30] + ([40] if include_last_offset else []), dtype=dtype)
        bags = 5
    ids.reshape(-1)[::4] = 3  # rows that sum several terms
    weights = rng.standard_normal(ids.shape, dtype=np.float32) if weighted else None
    grads = [rng.standard_normal((bags, WIDTH), dtype=np.float32) for _ in range(3)]
    return weight, ids, offsets, weights, grads


def rows_of(grad_out, ids, offsets, bag):
    return ek.embedding_bag_sparse_backward(grad_out, ids, ROWS, offsets, **bag)


def expected_sgd(weight, grad_out, ids, offsets, lr, weight_decay, bag):
    rows, values = rows_of(grad_out, ids, offsets, bag)
    w = weight.copy()
    f = np.float32
    g = values if weight_decay == 0 else values + f(weight_decay) * w[rows]
    w[rows] = w[rows] - f(lr) * g
    return w


def expected_adagrad(weight, state, grad_out, ids, offsets, lr, step, lr_decay, weight_decay, bag):
    rows, values = rows_of(grad_out, ids, offsets, bag)
    w, s, f = weight.copy(), state.copy(), np.float32
    clr = f(lr) / (f(1) + f(step - 1) * f(lr_decay))
    g = values if weight_decay == 0 else values + f(weight_decay) * w[rows]
    s[rows] = s[rows] + g * g
    w[rows] = w[rows] + (-clr) * (g / (np.sqrt(s[rows]) + f(1e-10)))
    return w, s


SHAPES = [
    # (mode, two_d, include_last_offset, weighted, padding_idx, scale)
    ("sum", False, False, False, None, False),
    ("mean", False, True, False, 3, False),
    ("sum", False, False, True, None, True),
    ("mean", True, False, False, None, True),
    ("sum", True, False, True, 3, False),
]


@pytest.mark.parametrize("mode, two_d, last, weighted, padding_idx, scale", SHAPES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_sgd_step_is_the_update_on_the_coalesced_gradient_bitwise(
    mode, two_d, last, weighted, padding_idx, scale, dtype, weight_decay
):
    weight, ids, offsets, weights, grads = batch(1, two_d, last, weighted, dtype)
    bag = {"mode": mode, "per_sample_weights": weights, "include_last_offset": last,
           "padding_idx": padding_idx, "scale_grad_by_freq": scale}
    want = expected_sgd(weight, grads[0], ids, offsets, 0.1, weight_decay, bag)
    ek.embedding_bag_sparse_sgd_step(weight, ids, offsets, grads[0], 0.1, weight_decay, **bag)
    assert_bitwise(torch.from_numpy(weight), torch.from_numpy(want))


@pytest.mark.parametrize("mode, two_d, last, weighted, padding_idx, scale", SHAPES)
@pytest.mark.parametrize("lr_decay, weight_decay", [(0.0, 0.0), (0.1, 0.01)])
def test_adagrad_steps_are_the_rule_bitwise(mode, two_d, last, weighted, padding_idx, scale,
                                             lr_decay, weight_decay):
    weight, ids, offsets, weights, grads = batch(2, two_d, last, weighted)
    bag = {"mode": mode, "per_sample_weights": weights, "include_last_offset": last,
           "padding_idx": padding_idx, "scale_grad_by_freq": scale}
    state = np.full_like(weight, 0.1)
    want_w, want_s = weight.copy(), state.copy()
    for step, grad_out in enumerate(grads, start=1):
        want_w, want_s = expected_adagrad(want_w, want_s, grad_out, ids, offsets, 0.05, step,
                                          lr_decay, weight_decay, bag)
        ek.embedding_bag_sparse_adagrad_step(weight, state, ids, offsets, grad_out, 0.05, step,
                                             lr_decay, weight_decay, **bag)
        assert_bitwise(torch.from_numpy(weight), torch.from_numpy(want_w))
        assert_bitwise(torch.from_numpy(state), torch.from_numpy(want_s))


def test_steps_on_many_bags_and_threads_are_the_rule():
    """Large enough for the crate to split the step across threads."""
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((20_000, 64), dtype=np.float32)
    ids = rng.integers(0, 20_000, 50_000)
    offsets = np.arange(0, 50_000, 16)
    grad_out = rng.standard_normal((offsets.size, 64), dtype=np.float32)
    rows, values = ek.embedding_bag_sparse_backward(grad_out, ids, 20_000, offsets, mode="sum")
    want = weight.copy()
    want[rows] = want[rows] - np.float32(0.05) * values
    ek.embedding_bag_sparse_sgd_step(weight, ids, offsets, grad_out, 0.05, mode="sum")
    assert_bitwise(torch.from_numpy(weight), torch.from_numpy(want))


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda i, o, g, kw: (np.append(i, ROWS), o, g, kw), IndexError, "position 40"),
        (lambda i, o, g, kw: (i, o, g, {**kw, "mode": "max"}), ValueError, "sum\" or \"mean"),
        (lambda i, o, g, kw: (i, o, g[:-1], kw), ValueError, "grad_out has shape"),
        (lambda i, o, g, kw: (i, o, g[:, :-1].copy(), kw), ValueError, "embedding_dim 12"),
        (lambda i, o, g, kw: (i, None, g, kw), ValueError, "offsets"),
        (lambda i, o, g, kw: (i, o[::-1].copy(), g, kw), ValueError, "offsets"),
        (lambda i, o, g, kw: (i, o, g, {**kw, "per_sample_weights": np.ones(3, np.float32)}),
         ValueError, "per_sample_weights"),
        (lambda i, o, g, kw: (i, o, g, {**kw, "padding_idx": ROWS}), ValueError, "padding_idx"),
    ],
)
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_bad_arguments_raise_and_write_nothing(change, error, message, optimizer):
    weight, ids, offsets, _, grads = batch(3)
    state = np.full_like(weight, 0.1)
    i, o, g, kw = change(ids, offsets, grads[0], {"mode": "sum"})
    before_w, before_s = weight.copy(), state.copy()
    with pytest.raises(error, match=message):
        if optimizer == "sgd":
            ek.embedding_bag_sparse_sgd_step(weight, i, o, g, 0.1, **kw)
        else:
            ek.embedding_bag_sparse_adagrad_step(weight, state, i, o, g, 0.1, 1, **kw)
    assert np.array_equal(weight, before_w)
    assert np.array_equal(state, before_s)


@pytest.mark.parametrize("fused", ["sgd", "adagrad"])
@pytest.mark.parametrize("mode, two_d, last, weighted, padding_idx, scale", SHAPES)
def test_module_backward_is_the_numpy_step(fused, mode, two_d, last, weighted, padding_idx, scale):
    """Two backwards of the module against two NumPy steps; `per_sample_weights` (made to
    require grad) get the gradient of the unfused module."""
    weight, ids, offsets, weights, grads = batch(4, two_d, last, weighted)
    options = {"mode": mode, "include_last_offset": last, "padding_idx": padding_idx,
               "scale_grad_by_freq": scale}
    bag = ekt.EmbeddingBag.from_pretrained(torch.from_numpy(weight.copy()), freeze=False, **options)
    plain = ekt.EmbeddingBag.from_pretrained(torch.from_numpy(weight.copy()), freeze=False, **options)
    if fused == "sgd":
        assert bag.sgd_in_backward(0.1) is bag
    else:
        assert bag.adagrad_in_backward(0.1, lr_decay=0.1) is bag
    want, state = weight.copy(), np.zeros_like(weight)
    t_offsets = None if offsets is None else torch.from_numpy(offsets)
    for step, grad_out in enumerate(grads[:2], start=1):
        psw = None if weights is None else torch.from_numpy(weights).requires_grad_()
        psw_plain = None if weights is None else torch.from_numpy(weights).requires_grad_()
        (bag(torch.from_numpy(ids), t_offsets, psw) * torch.from_numpy(grad_out)).sum().backward()
        (plain(torch.from_numpy(ids), t_offsets, psw_plain) * torch.from_numpy(grad_out)).sum().backward()
        if psw is not None:
            assert_bitwise(psw.grad, psw_plain.grad)
        plain.weight.grad = None
        with torch.no_grad():
            plain.weight.copy_(bag.weight)  # the next step's psw gradient reads the same rows
        np_bag = {"mode": mode, "per_sample_weights": weights, "include_last_offset": last,
                  "padding_idx": padding_idx, "scale_grad_by_freq": scale}
        if fused == "sgd":
            ek.embedding_bag_sparse_sgd_step(want, ids, offsets, grad_out, 0.1, **np_bag)
        else:
            ek.embedding_bag_sparse_adagrad_step(want, state, ids, offsets, grad_out, 0.1, step,
                                                 lr_decay=0.1, **np_bag)
        assert bag.weight.grad is None
        assert_bitwise(bag.weight.detach(), torch.from_numpy(want))
    if fused == "adagrad":
        assert int(bag.adagrad_state()["step"]) == 2
        assert_bitwise(bag.adagrad_state()["sum"], torch.from_numpy(state))


def test_module_refuses_max_mode():
    bag = ekt.EmbeddingBag(10, 4, mode="max")
    for fuse in (lambda: bag.sgd_in_backward(0.1), lambda: bag.adagrad_in_backward(0.1)):
        with pytest.raises(ValueError, match="max"):
            fuse()
    assert bag._step_in_backward is None


@pytest.mark.parametrize("fused", ["sgd", "adagrad"])
def test_training_a_bag_with_the_step_in_backward_follows_pytorch(fused):
    """`test_training`'s bag model (mean bags): nn.EmbeddingBag(sparse=True) with SGD or
    Adagrad on the table, against ours with that step in its backward."""

    def run(ours: bool):
        torch.manual_seed(0)
        if ours:
            table = ekt.EmbeddingBag(VOCAB, DIM, mode="mean")
            table = table.sgd_in_backward(0.5) if fused == "sgd" else table.adagrad_in_backward(0.1)
        else:
            table = nn.EmbeddingBag(VOCAB, DIM, mode="mean", sparse=True)
        optimizer = sgd if fused == "sgd" else adagrad
        return train(Model(table, True), True, optimizer, table_in_backward=ours)

    theirs, ours = run(False), run(True)
    assert theirs[-1] < 0.5 * theirs[0]
    diff = (ours - theirs).abs().max().item()
    print(f"bag {fused} in backward: max |loss difference| {diff:.3g}")
    assert diff <= 1e-5
