"""The modules under PyTorch 2's compilers and tracers: ``torch.compile`` with
``fullgraph=True`` (inference and training steps), ``torch.export`` (and AOTInductor),
``torch.jit.trace``, ``torch.jit.script``'s refusal, and ``torch.library.opcheck`` on
every operator.

Our operators' outputs are compared bit for bit with the eager modules' (a compiled
graph runs the same kernels); only what the compiler generates itself (the loss)
may differ in its last bits.
"""

import copy
import warnings

import pytest
import torch
from torch import nn

import embedding_kernels.torch as ekt
from helpers import assert_bitwise

ROWS, DIM = 40, 8


class Model(nn.Module):
    """One of each module and option family; returns every module's output."""

    def __init__(self, sparse=False):
        super().__init__()
        torch.manual_seed(0)
        self.lookup = ekt.Embedding(ROWS, DIM, padding_idx=1, sparse=sparse)
        self.scaled = ekt.Embedding(ROWS, DIM, scale_grad_by_freq=True, sparse=sparse)
        self.weighted = ekt.EmbeddingBag(ROWS, DIM, mode="sum", sparse=sparse)
        self.mean = ekt.EmbeddingBag(ROWS, DIM, mode="mean", include_last_offset=True, sparse=sparse)
        self.max = ekt.EmbeddingBag(ROWS, DIM, mode="max", padding_idx=0)
        self.fixed = ekt.EmbeddingBag(ROWS, DIM, mode="sum", sparse=sparse)

    def forward(self, ids, bag_ids, offsets, weights):
        return (
            self.lookup(ids),
            self.scaled(ids[:, :2]),
            self.weighted(bag_ids, offsets, weights),
            self.mean(bag_ids, torch.cat([offsets, offsets.new_tensor([bag_ids.numel()])])),
            self.max(bag_ids, offsets),
            self.fixed(ids),
        )


def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, ROWS, (6, 5), generator=g)
    bag_ids = torch.randint(0, ROWS, (20,), generator=g)
    offsets = torch.tensor([0, 3, 3, 9, 15])
    weights = torch.rand(20, generator=g)
    return ids, bag_ids, offsets, weights


def twins(make):
    """A model and a deep copy of it (its own tables), the copy compiled fullgraph."""
    eager = make()
    compiled = copy.deepcopy(eager)
    return eager, compiled, torch.compile(compiled, fullgraph=True)


def assert_outputs_equal(ours, theirs):
    for a, b in zip(ours, theirs, strict=True):
        assert_bitwise(a, b)


@pytest.fixture(autouse=True)
def fresh_compiler():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_inference_has_no_graph_break_and_the_eager_bits():
    eager, _, compiled = twins(Model)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(3):
            assert_outputs_equal(compiled(*inputs(seed)), eager(*inputs(seed)))
    # Neither a graph-break warning nor another one, per compile or per call.
    assert [str(w.message) for w in caught] == []
    explain = torch._dynamo.explain(eager)(*inputs(0))
    assert explain.graph_break_count == 0
    assert explain.graph_count == 1


def test_the_compiled_graph_holds_the_operators():
    explain = torch._dynamo.explain(Model())(*inputs(0))
    code = "\n".join(str(g.graph) for g in explain.graphs)
    # Dynamo's graph calls the module forwards' operators.
    assert "embedding_kernels.embedding" in code
    assert "embedding_kernels.embedding_bag" in code


@pytest.mark.parametrize("sparse", [False, True])
def test_compiled_training_step_gives_the_eager_gradients(sparse):
    eager, plain, compiled = twins(lambda: Model(sparse=sparse))
    for seed in range(2):
        for model, run in ((eager, eager), (plain, compiled)):
            model.zero_grad(set_to_none=True)
            outputs = run(*inputs(seed))
            sum(o.square().sum() for o in outputs).backward()
        for (name, a), (_, b) in zip(eager.named_parameters(), plain.named_parameters()):
            assert a.grad.is_sparse == b.grad.is_sparse, name
            assert_bitwise(b.grad.to_dense(), a.grad.to_dense())


@pytest.mark.parametrize("step", ["sgd", "adagrad"])
def test_compiled_fused_steps_give_the_eager_tables(step):
    def make():
        model = Model()
        for module in (model.lookup, model.scaled, model.weighted, model.mean, model.fixed):
            if step == "sgd":
                module.sgd_in_backward(lr=0.1, weight_decay=0.01)
            else:
                module.adagrad_in_backward(lr=0.1, lr_decay=0.01)
        return model

    eager, plain, compiled = twins(make)
    for seed in range(3):
        for run in (eager, compiled):
            sum(o.sum() for o in run(*inputs(seed))).backward()
    for (name, a), (_, b) in zip(eager.named_parameters(), plain.named_parameters()):
        assert_bitwise(b, a)
        # The max bag is not fused: it got gradients, the fused ones none.
        assert (a.grad is None) == (name != "max.weight")
    if step == "adagrad":
        for name in ("lookup", "scaled", "weighted", "mean", "fixed"):
            ours, theirs = getattr(plain, name).adagrad_state(), getattr(eager, name).adagrad_state()
            assert ours["step"].item() == theirs["step"].item() == 3
            assert_bitwise(ours["sum"], theirs["sum"])


def test_compiled_training_with_a_linear_layer_follows_eager():
    class Ranker(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.bag = ekt.EmbeddingBag(ROWS, DIM, mode="mean")
            self.out = nn.Linear(DIM, 1)

        def forward(self, ids, offsets):
            return self.out(self.bag(ids, offsets)).squeeze(1)

    eager, plain, compiled = twins(Ranker)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, plain)]
    for seed in range(5):
        _, bag_ids, offsets, _ = inputs(seed)
        for run, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            run(bag_ids, offsets).square().mean().backward()
            opt.step()
    # Inductor's Linear may round differently from eager's: close, not equal.
    for a, b in zip(eager.parameters(), plain.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_compiled_calls_refuse_bad_ids_with_the_eager_error():
    eager, _, compiled = twins(Model)
    ids, bag_ids, offsets, weights = inputs(0)
    ids[2, 3] = ROWS
    with torch.no_grad():
        compiled(*inputs(1))
        with pytest.raises(IndexError, match=str(ROWS)):
            compiled(ids, bag_ids, offsets, weights)
    offsets[1] = 30
    with pytest.raises(ekt.ArgumentError):
        compiled(*inputs(1)[:2], offsets, weights)


def test_exported_program_runs_with_the_eager_bits():
    model = Model().eval()
    program = torch.export.export(model, inputs(0))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "embedding_kernels.embedding.default" in targets
    assert "embedding_kernels.embedding_bag.default" in targets
    runnable = program.module()
    with torch.no_grad():
        for seed in (1, 2):
            assert_outputs_equal(runnable(*inputs(seed)), model(*inputs(seed)))


def test_aot_inductor_package_runs_with_the_eager_bits(tmp_path):
    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.lookup = ekt.Embedding(ROWS, DIM)
            self.bag = ekt.EmbeddingBag(ROWS, DIM, mode="max")

        def forward(self, ids, bag_ids, offsets):
            return self.lookup(ids), self.bag(bag_ids, offsets)

    model = Small().eval()
    ids, bag_ids, offsets, _ = inputs(0)
    program = torch.export.export(model, (ids, bag_ids, offsets))
    try:
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp_path / "small.pt2")
        )
    except Exception as e:  # no C++ compiler on this machine
        pytest.skip(f"AOTInductor cannot compile here: {type(e).__name__}: {e}")
    loaded = torch._inductor.aoti_load_package(path)
    ids, bag_ids, offsets, _ = inputs(3)
    with torch.no_grad():
        assert_outputs_equal(loaded(ids, bag_ids, offsets), model(ids, bag_ids, offsets))


@pytest.mark.parametrize("frozen", [False, True])
def test_a_trace_is_correct_for_new_inputs(frozen):
    """A trace records the operators: under ``no_grad``, and of a frozen
    (``from_pretrained``) table, the output follows new ids."""
    model = Model()
    if frozen:
        model.lookup = ekt.Embedding.from_pretrained(torch.randn(ROWS, DIM))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace's own deprecation notice
        with torch.no_grad():
            traced = torch.jit.trace(model, inputs(0))
    assert "embedding_kernels::embedding" in str(traced.inlined_graph)
    with torch.no_grad():
        for seed in (1, 2):
            assert_outputs_equal(traced(*inputs(seed)), model(*inputs(seed)))


def test_jit_script_is_refused_with_a_message():
    warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script's deprecation notice
    with pytest.raises(ekt.NotSupportedError, match="torch.compile"):
        torch.jit.script(nn.Sequential(ekt.Embedding(ROWS, DIM)))


def operator_cases():
    """Each operator with arguments for `torch.library.opcheck`, tables requiring grad
    where the operator has a backward."""
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(ROWS, DIM, generator=g)
    ids = torch.randint(0, ROWS, (4, 3), generator=g)
    bag_ids = ids.reshape(-1)
    offsets = torch.tensor([0, 2, 2, 7])
    weights = torch.rand(12, generator=g)
    grad = torch.randn(4, 3, DIM, generator=g)
    bag_grad = torch.randn(4, DIM, generator=g)
    table = weight.clone().requires_grad_()
    ops = torch.ops.embedding_kernels
    _, max_indices = ops.embedding_bag(weight, bag_ids, offsets, None, "max")
    state = (torch.zeros(ROWS, DIM), torch.tensor(0.0))
    sgd = ("sgd", 0.1, 0.0, 0.01, 0.0)
    adagrad = ("adagrad", 0.1, 0.01, 0.0, 1e-10, *state)
    return {
        "embedding": (ops.embedding, (table, ids, 1, True, False)),
        "embedding_sparse": (ops.embedding, (table, ids, None, False, True)),
        "embedding_dense_backward": (ops.embedding_dense_backward, (grad, ids, ROWS, 1, True)),
        "embedding_sparse_backward": (ops.embedding_sparse_backward, (grad, ids, ROWS, None, True)),
        "embedding_bag": (
            ops.embedding_bag,
            (table, bag_ids, offsets, weights.clone().requires_grad_(), "sum", False, 2),
        ),
        "embedding_bag_max": (ops.embedding_bag, (table, ids, None, None, "max")),
        "embedding_bag_backward": (
            ops.embedding_bag_backward,
            (bag_grad, bag_ids, offsets, None, max_indices, ROWS, "max"),
        ),
        "embedding_bag_sparse_backward": (
            ops.embedding_bag_sparse_backward,
            (bag_grad, bag_ids, offsets, weights, ROWS, "sum", False, 2, True),
        ),
        "embedding_with_step_sgd": (ops.embedding_with_step, (table, ids, None, False, *sgd)),
        "embedding_with_step_adagrad": (ops.embedding_with_step, (table, ids, 1, True, *adagrad)),
        "embedding_bag_with_step": (
            ops.embedding_bag_with_step,
            (table, bag_ids, offsets, weights, "sum", False, None, False, *sgd),
        ),
        "sgd_step_": (
            ops.sgd_step_,
            (weight.clone(), bag_ids, offsets, None, bag_grad, "sum", False, None, False, 0.1),
        ),
        "adagrad_step_": (
            ops.adagrad_step_,
            (weight.clone(), *state, ids, None, None, grad, None, False, 1, False, 0.1),
        ),
        "rowwise_adagrad_step_": (
            ops.rowwise_adagrad_step_,
            (weight.clone(), torch.zeros(ROWS), bag_ids, offsets, weights, bag_grad, "sum", False,
             None, False, 0.1),
        ),
        "embedding_with_step_rowwise": (
            ops.embedding_with_step,
            (table, ids, None, False, "rowwise_adagrad", 0.1, 0.0, 0.0, 1e-8, torch.zeros(ROWS)),
        ),
        "embedding_renorm_": (ops.embedding_renorm_, (weight.clone(), ids, 1.0, 2.0)),
    }


@pytest.mark.parametrize("name", sorted(operator_cases()))
def test_opcheck(name):
    """PyTorch's own checks of a custom operator: its schema (what it mutates), its
    fake kernel against the real one, its autograd registration, and its use under
    AOTAutograd with dynamic shapes."""
    op, args = operator_cases()[name]
    torch.library.opcheck(op, args)
