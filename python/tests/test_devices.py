"""dtype and device as torch.nn does them: the meta device for deferred
initialisation (a constructor's device="meta", or `with torch.device("meta")`, then
`to_empty` and `reset_parameters`), and a conversion the kernels cannot serve
refused by `.to()` itself, before anything changes."""

import pytest
import torch
from torch import nn

import embedding_kernels.torch as ekt

IDS = torch.tensor([[1, 2, 3], [4, 5, 9]])


def _made_on_meta(how, module, *args, **kwargs):
    if how == "argument":
        return module(*args, device="meta", **kwargs)
    with torch.device("meta"):
        return module(*args, **kwargs)


@pytest.mark.parametrize("how", ["argument", "context"])
@pytest.mark.parametrize(
    "ours, theirs, kwargs",
    [
        (ekt.Embedding, nn.Embedding, {"padding_idx": 0}),
        (ekt.EmbeddingBag, nn.EmbeddingBag, {"mode": "max"}),
        (ekt.EmbeddingBag, nn.EmbeddingBag, {"mode": "mean", "padding_idx": 2}),
    ],
)
def test_a_table_made_on_meta_gives_shapes_then_materialises(how, ours, theirs, kwargs):
    mine = _made_on_meta(how, ours, 10, 4, **kwargs)
    reference = _made_on_meta(how, theirs, 10, 4, **kwargs)
    assert mine.weight.is_meta
    out = mine(IDS.to("meta"))
    want = reference(IDS.to("meta"))
    assert out.is_meta and out.shape == want.shape and out.dtype == want.dtype
    # Materialised on the CPU and initialised, it serves the kernels like any other.
    mine.to_empty(device="cpu").reset_parameters()
    reference.to_empty(device="cpu")
    reference.load_state_dict(mine.state_dict())
    assert torch.equal(mine(IDS), reference(IDS))
    padding = kwargs.get("padding_idx")
    if padding is not None:
        assert not mine.weight[padding].any()


@pytest.mark.parametrize(
    "convert",
    [
        lambda m: m.double(),
        lambda m: m.half(),
        lambda m: m.to(torch.bfloat16),
        lambda m: m.to(dtype=torch.float64),
    ],
)
@pytest.mark.parametrize("module", [ekt.Embedding, ekt.EmbeddingBag])
def test_a_conversion_the_kernels_cannot_serve_is_refused_before_it_happens(convert, module):
    m = module(10, 4)
    before = m.weight.detach().clone()
    with pytest.raises(ekt.ArgumentError, match="float32 tables"):
        convert(m)
    assert m.weight.dtype == torch.float32 and torch.equal(m.weight, before)


def test_conversions_to_what_the_kernels_serve_pass():
    m = ekt.Embedding(10, 4).float().cpu().to(torch.float32)
    assert m.weight.dtype == torch.float32 and m(IDS).shape == (2, 3, 4)
    assert m.to("meta").weight.is_meta
