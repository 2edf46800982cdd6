"""The modules' errors are the types torch.nn raises for the same mistake, so code
written against PyTorch's modules catches them: each case is run through both, and
ours must be an instance of the type PyTorch raised (and, but for a bad id, of
ValueError, what the package raised before)."""

import pytest
import torch
from torch import nn

import embedding_kernels.torch as ekt

W = torch.randn(10, 4)
IDS = torch.tensor([1, 2, 3, 4])


def _bag(module, mode="sum"):
    return module.EmbeddingBag.from_pretrained(W.clone(), mode=mode)


def _emb(module):
    return module.Embedding.from_pretrained(W.clone())


CASES = {
    "float ids": lambda m: _emb(m)(IDS.float()),
    "an id past the table": lambda m: _emb(m)(torch.tensor([1, 20])),
    "padding_idx past the table": lambda m: m.Embedding(10, 4, padding_idx=10),
    "a bag's padding_idx past the table": lambda m: m.EmbeddingBag(10, 4, padding_idx=-11),
    "a negative embedding_dim": lambda m: m.Embedding(10, -1),
    "offsets not starting at 0": lambda m: _bag(m)(IDS, torch.tensor([1, 2])),
    "float offsets": lambda m: _bag(m)(IDS, torch.tensor([0.0, 2.0])),
    "per_sample_weights with max": lambda m: _bag(m, "max")(
        IDS, torch.tensor([0, 2]), per_sample_weights=torch.ones(4)
    ),
    "1-D ids without offsets": lambda m: _bag(m)(IDS),
    "2-D ids with offsets": lambda m: _bag(m)(IDS.reshape(2, 2), torch.tensor([0, 1])),
}


def _raised(call):
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("case", CASES)
def test_a_mistake_raises_the_type_pytorch_raises(case):
    theirs = _raised(lambda: CASES[case](nn))
    ours = _raised(lambda: CASES[case](ekt))
    assert isinstance(ours, type(theirs)), (case, type(theirs), type(ours), str(ours))
    if not isinstance(theirs, IndexError):
        assert isinstance(ours, ValueError), (case, type(ours))


@pytest.mark.parametrize("graph", [False, True])
def test_a_kernels_refusal_is_a_runtime_error_in_both_paths(graph):
    # Offsets that go down are refused by the kernel (PyTorch's own check is an
    # internal assert): through the inference path and through autograd alike.
    bag = _bag(ekt)
    bag.weight.requires_grad_(graph)
    error = _raised(lambda: bag(IDS, torch.tensor([0, 3, 1])))
    assert isinstance(error, ekt.ArgumentError) and isinstance(error, RuntimeError)
    assert "offset 1" in str(error)


def test_a_backward_refusal_is_a_runtime_error():
    # A fused step on a table that is not contiguous is refused in the backward.
    table = torch.randn(4, 10).t()
    emb = ekt.Embedding(10, 4, _weight=table.contiguous()).sgd_in_backward(lr=0.1)
    emb.weight.data = table
    with pytest.raises(RuntimeError) as caught:
        emb(torch.tensor([1, 2])).sum().backward()
    assert isinstance(caught.value, ValueError)


def test_the_types_are_exported_and_ordered():
    assert issubclass(ekt.ArgumentError, ValueError) and issubclass(ekt.ArgumentError, RuntimeError)
    assert issubclass(ekt.PaddingIdxError, ValueError)
    assert issubclass(ekt.PaddingIdxError, AssertionError)
    assert issubclass(ekt.NotSupportedError, ekt.ArgumentError)
    assert issubclass(ekt.NotSupportedError, NotImplementedError)
