"""dtype and device as torch.nn does them: the meta device for deferred
initialisation (a constructor's device="meta", or `with torch.device("meta")`, then
`to_empty` and `reset_parameters`), and a conversion the kernels cannot serve
refused by `.to()` itself, before anything changes."""

import pytest
import torch
from torch import nn

import embedding_kernels.torch as ekt
from helpers import assert_bitwise

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
        lambda m: m.to(dtype=torch.float64),
        lambda m: m.to(torch.complex64),
    ],
)
@pytest.mark.parametrize("module", [ekt.Embedding, ekt.EmbeddingBag])
@pytest.mark.filterwarnings("ignore:Complex modules")
def test_a_conversion_the_kernels_cannot_serve_is_refused_before_it_happens(convert, module):
    m = module(10, 4)
    before = m.weight.detach().clone()
    with pytest.raises(ekt.ArgumentError, match="float32 tables"):
        convert(m)
    assert m.weight.dtype == torch.float32 and torch.equal(m.weight, before)


def test_conversions_to_what_the_kernels_serve_pass_half():
    m = ekt.EmbeddingBag(10, 4, mode="sum").half()
    assert m.weight.dtype == torch.float16 and m(IDS).dtype == torch.float16
    assert m.to(torch.bfloat16)(IDS).dtype == torch.bfloat16
    assert ekt.Embedding(10, 4, dtype=torch.bfloat16).weight.dtype == torch.bfloat16


def test_conversions_to_what_the_kernels_serve_pass():
    m = ekt.Embedding(10, 4).float().cpu().to(torch.float32)
    assert m.weight.dtype == torch.float32 and m(IDS).shape == (2, 3, 4)
    assert m.to("meta").weight.is_meta


HALVES = [torch.float16, torch.bfloat16]


def half_pair(module, dtype, **kwargs):
    """Ours and PyTorch's module over the same table, converted to ``dtype``."""
    weight = torch.randn(60, 20, generator=torch.Generator().manual_seed(3))
    theirs = getattr(torch.nn, module.__name__).from_pretrained(weight.clone(), **kwargs)
    return module.from_pretrained(weight.clone(), **kwargs).to(dtype), theirs.to(dtype)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_half_table_looks_up_pytorchs_values(dtype):
    ours, theirs = half_pair(ekt.Embedding, dtype)
    ids = torch.randint(0, 60, (9, 4))
    out = ours(ids)
    assert out.dtype == dtype
    assert_bitwise(out, theirs(ids))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_a_half_table_pools_as_pytorch_does(dtype, mode, padding_idx):
    """Bags of a half table sum its rows widened to float32 (as PyTorch's CPU bag
    does) and round the result to the table's dtype: max, float16 sums and weighted
    sums give PyTorch's bits; a mean, and a bfloat16 sum without weights or padding,
    are rounded another way by PyTorch (within a unit of the last place)."""
    ours, theirs = half_pair(ekt.EmbeddingBag, dtype, mode=mode, padding_idx=padding_idx)
    g = torch.Generator().manual_seed(5)
    ids, offsets = torch.randint(0, 60, (90,), generator=g), torch.arange(0, 90, 7)
    calls = [(ids, offsets)]
    if mode == "sum":
        calls.append((ids, offsets, torch.randn(90, generator=g).to(dtype)))
    for args in calls:
        got, expected = ours(*args), theirs(*args)
        assert got.dtype == dtype
        exact = mode == "max" or (mode == "sum" and (
            dtype == torch.float16 or len(args) == 3 or padding_idx is not None
        ))
        if exact:
            assert_bitwise(got, expected)
        else:
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("module", [ekt.Embedding, ekt.EmbeddingBag])
def test_a_half_tables_backward_raises_and_leaves_it(dtype, module):
    m = module(30, 8).to(dtype)
    before = m.weight.detach().clone()
    out = m(IDS)  # a forward with autograd on: inference code that did not turn it off
    with pytest.raises(ekt.NotSupportedError, match="inference only"):
        out.float().sum().backward()
    assert m.weight.grad is None and torch.equal(m.weight, before)
    with pytest.raises(ekt.ArgumentError, match="float32"):
        m.float().to(dtype).sgd_in_backward(0.1)(IDS).float().sum().backward()
    assert torch.equal(m.weight, before)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_half_table_compiles_for_inference(dtype):
    ours, _ = half_pair(ekt.EmbeddingBag, dtype, mode="max")
    ids = torch.randint(0, 60, (5, 6))
    torch._dynamo.reset()
    with torch.no_grad():
        assert_bitwise(torch.compile(ours, fullgraph=True)(ids), ours(ids))
