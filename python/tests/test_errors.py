"""Bad input raises clearly (IndexError for an id, ValueError for the rest) and changes nothing."""

import numpy as np
import pytest
import torch

import embedding_kernels as ek
import embedding_kernels.torch as ekt

OUT_OF_RANGE = "id {value} at position {position} is out of range for a table of {rows} rows"


def table(rows=10, dim=4):
    return np.arange(rows * dim, dtype=np.float32).reshape(rows, dim)


def canary(shape):
    """An output filled with NaN, to show it was not written."""
    return np.full(shape, np.nan, dtype=np.float32)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("value,position", [(10, 3), (-1, 0), (2**31 - 1, 5)])
def test_numpy_out_of_range_id_names_position_and_value(dtype, value, position):
    ids = np.zeros((2, 3), dtype=dtype)
    ids.flat[position] = value
    out = canary((2, 3, 4))
    with pytest.raises(IndexError, match=OUT_OF_RANGE.format(value=value, position=position, rows=10)):
        ek.embedding(table(), ids, out=out)
    assert np.isnan(out).all()


def test_numpy_bad_arrays():
    w, ids = table(), np.array([1, 2])
    cases = [
        (lambda: ek.embedding(w.astype(np.float64), ids), "weight must be a float32 array, got float64"),
        (lambda: ek.embedding(w, ids.astype(np.float32)), "ids must be an int32 or int64 array, got float32"),
        (lambda: ek.embedding(w, [1, 2]), "ids must be a numpy array, got list"),
        (lambda: ek.embedding(w[:, ::2], ids), "weight must be C-contiguous"),
        (lambda: ek.embedding(w, np.zeros((4, 2), np.int64)[:, 0]), "ids must be C-contiguous"),
        (lambda: ek.embedding(w.reshape(-1), ids), r"weight must be 2-D \[num_embeddings, embedding_dim\]"),
        (lambda: ek.embedding(np.zeros((3, 0), np.float32), ids), "embedding_dim 0 is not supported"),
        (lambda: ek.embedding(w, ids, padding_idx=10), r"padding_idx 10 must be within \[-10, 10\)"),
        (lambda: ek.embedding(w, ids, out=np.zeros((3, 4), np.float32)), r"out has shape \[3, 4\], expected \[2, 4\]"),
        (lambda: ek.embedding(w, ids, out=w[:2]), "out cannot be written"),
        (lambda: ek.embedding_dense_backward(np.zeros((3, 4), np.float32), ids, 10), "grad_out has shape"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_numpy_read_only_out_is_refused():
    out = np.zeros((2, 4), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out cannot be written"):
        ek.embedding(table(), np.array([1, 2]), out=out)


@pytest.mark.parametrize(
    "offsets,message",
    [
        ([1, 2], "offsets must start at 0, but the first is 1"),
        ([0, 3, 2], "offset 2 at position 2 is below the offset 3 before it"),
        ([0, 9], r"offset 9 at position 1 is outside 0..=5 \(the ids' length\)"),
        ([0, -1], "offset -1 at position 1 is outside"),
    ],
)
def test_numpy_bad_offsets(offsets, message):
    out = canary((len(offsets), 4))
    with pytest.raises(ValueError, match=message):
        ek.embedding_bag(table(), np.arange(5), np.array(offsets), mode="sum", out=out)
    assert np.isnan(out).all()


def test_numpy_bag_arguments():
    w, ids = table(), np.arange(4)
    with pytest.raises(ValueError, match="1-D ids need offsets"):
        ek.embedding_bag(w, ids)
    with pytest.raises(ValueError, match="2-D ids take no offsets"):
        ek.embedding_bag(w, ids.reshape(2, 2), np.array([0]))
    with pytest.raises(ValueError, match='mode must be "sum", "mean" or "max"'):
        ek.embedding_bag(w, ids.reshape(2, 2), mode="min")
    with pytest.raises(ValueError, match="per_sample_weights"):
        ek.embedding_bag(w, ids.reshape(2, 2), mode="mean", per_sample_weights=np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="per_sample_weights has shape"):
        ek.embedding_bag(w, ids.reshape(2, 2), mode="sum", per_sample_weights=np.ones(4, np.float32))
    with pytest.raises(ValueError, match="max_indices"):
        ek.embedding_bag_backward(np.ones((2, 4), np.float32), ids.reshape(2, 2), 10, mode="max")
    with pytest.raises(IndexError, match=OUT_OF_RANGE.format(value=10, position=3, rows=10)):
        ek.embedding_bag(w, np.array([[0, 1], [2, 10]]), mode="max")


def test_numpy_failed_backward_leaves_out_unchanged():
    out = canary((10, 4))
    with pytest.raises(IndexError):
        ek.embedding_dense_backward(np.ones((3, 4), np.float32), np.array([1, 2, 11]), 10, out=out)
    assert np.isnan(out).all()


@pytest.mark.parametrize("max_norm", [None, 1.0])
def test_torch_bad_ids_leave_the_weight_unchanged(max_norm):
    emb = ekt.Embedding(10, 4, max_norm=max_norm)
    before = emb.weight.detach().clone()
    for ids, value, position in [(torch.tensor([[1, 2], [3, 10]]), 10, 3), (torch.tensor([4, -1]), -1, 1)]:
        with pytest.raises(IndexError, match=OUT_OF_RANGE.format(value=value, position=position, rows=10)):
            emb(ids)
        assert torch.equal(emb.weight, before)
    bag = ekt.EmbeddingBag(10, 4, max_norm=max_norm)
    before = bag.weight.detach().clone()
    with pytest.raises(IndexError):
        bag(torch.tensor([1, 2, 12]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="offset 1 at position 2 is below the offset 2 before it"):
        bag(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1]))
    assert torch.equal(bag.weight, before)


def test_torch_bad_dtypes_and_devices():
    emb = ekt.Embedding(10, 4)
    with pytest.raises(ValueError, match="input must hold int32 or int64 ids, got torch.float32"):
        emb(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="got dtype=torch.float64"):
        emb.double()
    with pytest.raises(ValueError, match="CPU only"):
        ekt.Embedding(10, 4, device="cuda")
    with pytest.raises(ValueError, match="float32 tables"):
        ekt.EmbeddingBag(10, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="CPU only"):
        ekt.Embedding(10, 4)(torch.tensor([1], device="meta"))
    with pytest.raises(ValueError, match="per_sample_weights, got torch.float64"):
        ekt.EmbeddingBag(10, 4, mode="sum")(torch.tensor([[1, 2]]), per_sample_weights=torch.ones(1, 2, dtype=torch.float64))


def test_torch_bad_arguments():
    with pytest.raises(ValueError, match="padding_idx 10 must be within"):
        ekt.Embedding(10, 4, padding_idx=10)
    with pytest.raises(ValueError, match='not supported with mode="max"'):
        ekt.EmbeddingBag(10, 4, mode="max", sparse=True)
    with pytest.raises(ValueError, match="mode must be"):
        ekt.EmbeddingBag(10, 4, mode="median")
    with pytest.raises(ValueError, match="_weight has shape"):
        ekt.Embedding(10, 4, _weight=torch.zeros(4, 10))
    with pytest.raises(ValueError, match="1-D ids need offsets"):
        ekt.EmbeddingBag(10, 4)(torch.tensor([1, 2]))


def test_torch_bad_ids_without_autograd():
    """The forward without autograd (no_grad) checks every id as the recorded one does."""
    emb, bag = ekt.Embedding(10, 4), ekt.EmbeddingBag(10, 4, mode="max")
    before, bag_before = emb.weight.detach().clone(), bag.weight.detach().clone()
    with torch.no_grad():
        with pytest.raises(IndexError, match=OUT_OF_RANGE.format(value=10, position=3, rows=10)):
            emb(torch.tensor([[1, 2], [3, 10]]))
        with pytest.raises(IndexError, match=OUT_OF_RANGE.format(value=-1, position=1, rows=10)):
            bag(torch.tensor([4, -1]), torch.tensor([0]))
        with pytest.raises(ValueError, match="input must hold int32 or int64 ids"):
            emb(torch.tensor([1.0]))
    assert torch.equal(emb.weight, before) and torch.equal(bag.weight, bag_before)


def test_torch_inference_path_raises_the_checked_paths_errors():
    """Without a graph (no_grad, or a frozen table) the modules call the kernel first and
    fall back on the checked path when it refuses: the same errors as with autograd, and
    strided ids still work."""
    w = torch.randn(10, 4)
    frozen = ekt.Embedding.from_pretrained(w), ekt.EmbeddingBag.from_pretrained(w, mode="sum")
    trained = ekt.Embedding(10, 4), ekt.EmbeddingBag(10, 4, mode="sum")
    for emb, bag in (frozen, trained):
        with torch.no_grad():
            with pytest.raises(ValueError, match="input must hold int32 or int64 ids, got torch.float32"):
                emb(torch.tensor([1.0, 2.0]))
            with pytest.raises(ValueError, match="input must be a tensor of int32 or int64 ids, got list"):
                bag([1, 2], torch.tensor([0]))
            with pytest.raises(ValueError, match="offsets must hold int32 or int64 ids"):
                bag(torch.tensor([1, 2]), torch.tensor([0.0]))
            with pytest.raises(ValueError, match="CPU only"):
                emb(torch.tensor([1], device="meta"))
            with pytest.raises(ValueError, match="per_sample_weights, got torch.float64"):
                bag(torch.tensor([[1, 2]]), per_sample_weights=torch.ones(1, 2, dtype=torch.float64))
            with pytest.raises(IndexError, match=OUT_OF_RANGE.format(value=10, position=1, rows=10)):
                bag(torch.tensor([[1, 10]]))
            ids = torch.tensor([[1, 2, 3], [4, 5, 6]]).t()  # strided
            assert torch.equal(emb(ids), w[ids] if emb is frozen[0] else emb.weight[ids])
            assert torch.equal(bag(ids), (w if bag is frozen[1] else bag.weight)[ids].sum(1))
    emb, bag = frozen
    # `.double()` is refused itself; a float64 table set by hand reaches the forward.
    for m in frozen:
        m.weight.data = m.weight.data.double()
    with pytest.raises(ValueError, match="bfloat16 weight, got torch.float64"):
        emb(torch.tensor([1]))
    with pytest.raises(ValueError, match="bfloat16 weight, got torch.float64"):
        bag(torch.tensor([[1]]))
