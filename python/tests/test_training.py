"""Swapping the modules into a model: training curves and state_dict, both ways."""

import io

import pytest
import torch
from torch import nn

import embedding_kernels.torch as ekt
from helpers import huge_bytes_in, huge_pages_on_advice, kernel_collapses, whole_huge_pages

VOCAB, DIM, CLASSES, BATCH, SEQ, STEPS = 60, 16, 5, 32, 8, 300


class Model(nn.Module):
    """Embedding (or bag), mean over the sequence, linear, cross-entropy."""

    def __init__(self, table: nn.Module, bag: bool):
        super().__init__()
        self.table, self.bag = table, bag
        self.linear = nn.Linear(DIM, CLASSES)

    def forward(self, ids):
        x = self.table(ids) if self.bag else self.table(ids).mean(1)
        return self.linear(x)


def make(kind: str, ours: bool, sparse: bool) -> Model:
    torch.manual_seed(0)
    module = ekt if ours else nn
    if kind == "embedding":
        table = module.Embedding(VOCAB, DIM, padding_idx=0, sparse=sparse)
    else:
        table = module.EmbeddingBag(VOCAB, DIM, mode="mean", sparse=sparse)
    return Model(table, kind == "bag")


def sgd(params):
    return torch.optim.SGD(params, lr=0.5)


def train(model: Model, sparse: bool, optimizer=sgd, table_in_backward: bool = False):
    """STEPS steps on a fixed stream of batches; the loss after each. ``optimizer`` makes
    each optimiser from its parameters (SGD, lr 0.5, by default); with
    ``table_in_backward`` the table steps itself in its backward and only the linear
    layer gets one."""
    g = torch.Generator().manual_seed(1)
    # Sparse gradients go to the table, dense ones to the linear layer: two optimisers, as usual.
    opts = [optimizer(model.linear.parameters())]
    if not table_in_backward:
        opts.insert(0, optimizer(model.table.parameters()))
    losses = []
    for _ in range(STEPS):
        # Every id of a sequence is of its label's class (id % CLASSES): learnable from the mean.
        labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
        ids = labels[:, None] + CLASSES * torch.randint(0, VOCAB // CLASSES, (BATCH, SEQ), generator=g)
        loss = nn.functional.cross_entropy(model(ids), labels)
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


# The largest difference of the loss curves measured over 300 steps (PyTorch 2.15, one
# thread): embedding dense 0 (the same forward and gradient bits), embedding sparse
# 2.4e-7 (PyTorch's SGD adds an uncoalesced gradient row by row), bag dense and sparse
# 1.2e-7 (the bag backward sums in another order). The tolerance is 1e-5, 40x above that.
TOLERANCE = {("embedding", False): 0.0, ("embedding", True): 1e-5, ("bag", False): 1e-5, ("bag", True): 1e-5}


@pytest.mark.parametrize("kind", ["embedding", "bag"])
@pytest.mark.parametrize("sparse", [False, True])
def test_training_curves_agree(kind, sparse):
    theirs = train(make(kind, False, sparse), sparse)
    ours = train(make(kind, True, sparse), sparse)
    assert theirs[-1] < 0.5 * theirs[0]  # the model did learn
    diff = (ours - theirs).abs().max().item()
    print(f"{kind} sparse={sparse}: max |loss difference| {diff:.3g}")
    assert diff <= TOLERANCE[(kind, sparse)]


@pytest.mark.parametrize("kind", ["Embedding", "EmbeddingBag"])
def test_state_dict_both_ways(kind):
    theirs = getattr(nn, kind)(40, 7)
    ours = getattr(ekt, kind)(40, 7)
    assert set(ours.state_dict()) == set(theirs.state_dict()) == {"weight"}
    # Ours saved (through torch.save), loaded into PyTorch's ...
    buffer = io.BytesIO()
    torch.save(ours.state_dict(), buffer)
    buffer.seek(0)
    theirs.load_state_dict(torch.load(buffer))
    assert torch.equal(theirs.weight, ours.weight)
    # ... and PyTorch's, loaded into ours.
    fresh = getattr(nn, kind)(40, 7)
    ours.load_state_dict(fresh.state_dict())
    assert torch.equal(ours.weight, fresh.weight)
    ids = torch.randint(0, 40, (3, 4))
    assert torch.equal(ours(ids), fresh(ids))


def test_from_pretrained_and_repr():
    table = torch.randn(6, 3)
    ours = ekt.Embedding.from_pretrained(table, padding_idx=1, sparse=True)
    assert repr(ours) == repr(nn.Embedding.from_pretrained(table, padding_idx=1, sparse=True))
    assert not ours.weight.requires_grad and torch.equal(ours.weight, table)
    bag = ekt.EmbeddingBag.from_pretrained(table, freeze=False, mode="max")
    assert repr(bag) == repr(nn.EmbeddingBag.from_pretrained(table, freeze=False, mode="max"))
    assert bag.weight.requires_grad


def test_module_tables_are_in_huge_pages():
    """A fresh table from its first write; a pretrained one moved in place, still shared
    with the caller's tensor and holding the same values."""
    if not (kernel_collapses() and huge_pages_on_advice()):
        pytest.skip("needs huge pages where advised and only there (THP madvise), Linux 6.1 on")
    rows, dim = 10_000, 1024  # 40 MB: fresh memory from the allocator, whatever came before
    fresh = ekt.EmbeddingBag(rows, dim, padding_idx=3)
    address, nbytes = fresh.weight.data_ptr(), rows * dim * 4
    assert huge_bytes_in(address, nbytes) >= whole_huge_pages(address, nbytes)
    assert torch.all(fresh.weight[3] == 0) and fresh.weight.std() > 0.9

    table = torch.randn(rows, dim)
    values = table.clone()
    pretrained = ekt.Embedding.from_pretrained(table)
    address = table.data_ptr()
    assert huge_bytes_in(address, nbytes) >= whole_huge_pages(address, nbytes) > 0
    assert pretrained.weight.data_ptr() == table.data_ptr()
    assert torch.equal(pretrained.weight, values)


def test_a_table_without_a_numpy_view_is_left_as_it_is():
    with torch.device("meta"):
        meta = ekt.EmbeddingBag(1000, 1024)
    assert meta.weight.is_meta
    negated = torch.randn(1000, 1024)._neg_view()
    pretrained = ekt.Embedding.from_pretrained(negated)
    assert pretrained.weight.is_neg()


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adagrad, torch.optim.SparseAdam])
def test_sparse_gradient_accepted_by_optimisers(optimizer):
    """The sparse gradient steps PyTorch's sparse-capable optimisers as PyTorch's own does."""
    results = []
    for module in (nn, ekt):
        torch.manual_seed(3)
        emb = module.Embedding(20, 4, sparse=True)
        start = emb.weight.detach().clone()
        opt = optimizer(emb.parameters(), lr=0.1)
        for step in range(3):
            ids = torch.tensor([[1, 5, 5], [7, 1, step]])
            opt.zero_grad()
            emb(ids).square().sum().backward()
            opt.step()
        assert not torch.equal(emb.weight[1], start[1]) and torch.equal(emb.weight[9], start[9])
        results.append(emb.weight.detach())
    assert torch.allclose(results[0], results[1], rtol=1e-6, atol=1e-6)
