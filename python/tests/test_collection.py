"""The collection of bag tables in one process (embedding_kernels.torch.distributed),
against torch.nn.EmbeddingBag applied feature by feature."""

import pytest
import torch
from torch import nn

import embedding_kernels.torch as ekt
from embedding_kernels.torch.distributed import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
)
from helpers import assert_bitwise

TABLES = [
    EmbeddingBagConfig(num_embeddings=50, embedding_dim=8, name="user", feature_names=["user_id"]),
    EmbeddingBagConfig(
        num_embeddings=30, embedding_dim=4, name="item", feature_names=["item_id", "seen"],
        pooling="mean",
    ),
    EmbeddingBagConfig(num_embeddings=20, embedding_dim=6, name="tag", pooling="max"),
]
KEYS = ["seen", "tag", "user_id", "item_id"]  # not in table order: the output follows the tables


def features(seed, batch=5, keys=KEYS, rows=None, weighted=False):
    """Random jagged ids for ``keys`` (0 to 4 per example), each below its table's rows."""
    g = torch.Generator().manual_seed(seed)
    rows = rows or {"seen": 30, "tag": 20, "user_id": 50, "item_id": 30}
    lengths = torch.randint(0, 5, (len(keys) * batch,), generator=g)
    values = torch.cat([
        torch.randint(0, rows[key], (int(lengths[k * batch:(k + 1) * batch].sum()),), generator=g)
        for k, key in enumerate(keys)
    ])
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor(keys, values, weights=weights, lengths=lengths)


def reference(collection, kjt, weighted=False):
    """Each feature pooled by torch.nn.EmbeddingBag over the same table, in table order."""
    batch, offsets, values = kjt.stride(), kjt.offsets(), kjt.values()
    outs = {}
    for table in collection.embedding_bag_configs():
        theirs = nn.EmbeddingBag.from_pretrained(
            collection.embedding_bags[table.name].weight.detach().clone(),
            mode=table.pooling, include_last_offset=True,
        )
        for feature in table.feature_names:
            k = kjt.keys().index(feature)
            first = int(offsets[k * batch])
            last = int(offsets[(k + 1) * batch])
            bags = offsets[k * batch:(k + 1) * batch + 1] - first
            weights = kjt.weights_or_none()[first:last] if weighted else None
            outs[feature] = theirs(values[first:last], bags, weights)
    return outs


@pytest.mark.parametrize("seed", range(4))
def test_the_collection_pools_each_feature_as_torch_nn(seed):
    torch.manual_seed(seed)
    collection = EmbeddingBagCollection(TABLES)
    kjt = features(seed)
    out = collection(kjt)
    assert out.keys() == ["user_id", "item_id", "seen", "tag"]
    assert out.length_per_key() == [8, 4, 4, 6]
    assert out.values().shape == (5, 22)
    want = reference(collection, kjt)
    for key, pooled in out.to_dict().items():
        assert_bitwise(pooled, want[key])


def test_weighted_features_pool_with_their_weights():
    tables = [EmbeddingBagConfig(40, 8, "a", ["x", "y"]), EmbeddingBagConfig(40, 3, "b", ["z"])]
    collection = EmbeddingBagCollection(tables, is_weighted=True)
    kjt = features(9, keys=["x", "y", "z"], rows={"x": 40, "y": 40, "z": 40}, weighted=True)
    want = reference(collection, kjt, weighted=True)
    for key, pooled in collection(kjt).to_dict().items():
        assert_bitwise(pooled, want[key])


def test_lengths_and_offsets_give_the_same_batch():
    collection = EmbeddingBagCollection(TABLES)
    kjt = features(3)
    again = KeyedJaggedTensor(kjt.keys(), kjt.values(), offsets=kjt.offsets())
    assert_bitwise(collection(again).values(), collection(kjt).values())
    assert torch.equal(again.lengths(), kjt.lengths())


def test_the_tables_are_torchrecs_state_dict_and_train():
    collection = EmbeddingBagCollection(TABLES)
    assert sorted(collection.state_dict()) == [
        "embedding_bags.item.weight", "embedding_bags.tag.weight", "embedding_bags.user.weight",
    ]
    kjt = features(4)
    collection(kjt).values().square().sum().backward()
    # Every table read by the batch got a gradient; the user table's is its bags' rows.
    for name, bag in collection.embedding_bags.items():
        assert bag.weight.grad is not None and bag.weight.grad.abs().sum() > 0, name
    before = collection.embedding_bags["user"].weight.detach().clone()
    collection.embedding_bags["user"].sgd_in_backward(0.1)
    collection(kjt).values().sum().backward()
    assert not torch.equal(collection.embedding_bags["user"].weight, before)


def test_half_tables_serve_inference():
    tables = [EmbeddingBagConfig(40, 8, "a", ["x"], format="bf16"), EmbeddingBagConfig(40, 4, "b", ["y"])]
    collection = EmbeddingBagCollection(tables)
    out = collection(features(2, keys=["x", "y"], rows={"x": 40, "y": 40}))
    # The output concatenates the tables' pooled rows: the float32 one widens the half one.
    assert out.values().dtype == torch.float32 and out.values().shape == (5, 12)


def test_bad_input_is_refused_with_the_table_named():
    collection = EmbeddingBagCollection(TABLES)
    kjt = features(1)
    values = kjt.values().clone()
    k = kjt.keys().index("tag")
    first = int(kjt.offsets()[k * 5])
    values[first] = 20
    bad = KeyedJaggedTensor(kjt.keys(), values, offsets=kjt.offsets())
    with pytest.raises(IndexError, match="table 'tag'"):
        collection(bad)
    with torch.no_grad(), pytest.raises(IndexError, match="table 'tag'"):  # inference's path
        collection(bad)
    with pytest.raises(ekt.ArgumentError, match="feature 'tag' of table 'tag' is not among"):
        collection(features(1, keys=["seen", "user_id", "item_id"]))
    with pytest.raises(ekt.ArgumentError, match="sum pooling"):
        EmbeddingBagCollection(TABLES, is_weighted=True)
    with pytest.raises(ekt.ArgumentError, match="one table only"):
        EmbeddingBagCollection([TABLES[0], EmbeddingBagConfig(5, 2, "other", ["user_id"])])
    with pytest.raises(ekt.ArgumentError, match="pooling"):
        EmbeddingBagConfig(5, 2, "t", pooling="median")
    with pytest.raises(ekt.ArgumentError, match="lengths or offsets"):
        KeyedJaggedTensor(["a"], torch.tensor([1]))
    with pytest.raises(ekt.ArgumentError, match="do not make"):
        KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1]))


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_bucket_rows_is_a_stable_split_by_owner(world):
    """The extension's bucketing against the split written out: each rank's ids in bag
    order, a bag's in position order, as rows of the rank's block."""
    import numpy as np

    from embedding_kernels import _native

    rng = np.random.default_rng(world)
    rows = 50
    lengths = rng.integers(0, 6, 12)
    ids = rng.integers(0, rows, int(lengths.sum()))
    counts, local, positions = _native.bucket_rows(ids, lengths, rows, world)
    block = -(-rows // world)
    bag_of = np.repeat(np.arange(len(lengths)), lengths)
    want_local, want_positions = [], []
    for r in range(world):
        for b in range(len(lengths)):
            mine = [p for p in range(len(ids)) if bag_of[p] == b and ids[p] // block == r]
            assert counts[r, b] == len(mine)
            want_positions += mine
            want_local += [ids[p] - r * block for p in mine]
    assert local.tolist() == want_local and positions.tolist() == want_positions
    with pytest.raises(IndexError, match="id 50 at position 2"):
        _native.bucket_rows(np.array([1, 2, 50]), np.array([3]), rows, world)
    with pytest.raises(ValueError, match="add up"):
        _native.bucket_rows(np.array([1, 2]), np.array([3]), rows, world)


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad"])
def test_a_checkpoint_carries_the_fused_optimisers_state(tmp_path, optimizer):
    """One process: the tables and their accumulators saved after two steps load into
    a fresh collection with the same optimiser, which then steps as the saved one does;
    into a collection of the other optimiser they are refused before anything is read."""
    pytest.importorskip("safetensors")
    from embedding_kernels.torch.distributed import load, save
    from embedding_kernels.torch import ArgumentError

    def trained(name, steps):
        torch.manual_seed(3)
        collection = EmbeddingBagCollection(TABLES[:2])
        for bag in collection.embedding_bags.values():
            getattr(bag, f"{name}_in_backward")(0.1)
        for step in range(steps):
            collection(features(step, keys=["seen", "user_id", "item_id"])).values().sum().backward()
        return collection

    saved = trained(optimizer, 2)
    save(saved, str(tmp_path))
    loaded = trained(optimizer, 0)
    load(loaded, str(tmp_path))
    for collection in (saved, loaded):
        collection(features(2, keys=["seen", "user_id", "item_id"])).values().sum().backward()
    for name, bag in saved.embedding_bags.items():
        assert_bitwise(loaded.embedding_bags[name].weight, bag.weight)
    other = trained("rowwise_adagrad" if optimizer == "adagrad" else "adagrad", 0)
    before = {name: bag.weight.detach().clone() for name, bag in other.embedding_bags.items()}
    with pytest.raises(ArgumentError, match="not the same optimiser"):
        load(other, str(tmp_path))
    for name, bag in other.embedding_bags.items():
        assert torch.equal(bag.weight, before[name])


def test_the_collection_compiles_whole_and_trains_compiled():
    """``torch.compile(fullgraph=True)`` over the collection's forward, trained by a
    fused Adagrad step: the same pooled rows and tables, bit for bit, as the eager one."""

    def make():
        torch.manual_seed(5)
        collection = EmbeddingBagCollection(TABLES[:2])
        for bag in collection.embedding_bags.values():
            bag.adagrad_in_backward(0.1)
        return collection

    def loss_of(collection, kjt, target):
        pooled = collection(kjt).values()
        return pooled, (pooled * target).sum()

    eager, compiled = make(), make()
    compiled_loss = torch.compile(loss_of, fullgraph=True)
    keys = ["seen", "user_id", "item_id"]
    for s in range(3):
        target = torch.randn(5, 16, generator=torch.Generator().manual_seed(s))
        got, got_loss = compiled_loss(compiled, features(s, keys=keys), target)
        want, want_loss = loss_of(eager, features(s, keys=keys), target)
        assert_bitwise(got.detach(), want.detach())
        # The sum is Inductor's, in its own order; its gradient (target) is exact.
        torch.testing.assert_close(got_loss, want_loss)
        got_loss.backward()
        want_loss.backward()
    for name, bag in eager.embedding_bags.items():
        assert_bitwise(compiled.embedding_bags[name].weight, bag.weight)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_segments_operator_passes_opcheck(weighted):
    """``torch.ops.embedding_kernels.keyed_segments``: schema, fake kernel and
    dispatch, by ``torch.library.opcheck``; and the segments of a two-feature table."""
    kjt = features(4, weighted=weighted)
    batch, weights = kjt.stride(), kjt.weights_or_none()
    args = (kjt.values(), kjt.offsets(), weights, [2, 0], batch)
    torch.library.opcheck(torch.ops.embedding_kernels.keyed_segments.default, args)
    ids, offsets, sample_weights = torch.ops.embedding_kernels.keyed_segments(*args)
    bounds = kjt.offsets()
    first, second = slice(bounds[2 * batch], bounds[3 * batch]), slice(bounds[0], bounds[batch])
    assert torch.equal(ids, torch.cat([kjt.values()[first], kjt.values()[second]]))
    lengths = torch.cat([kjt.lengths()[2 * batch:3 * batch], kjt.lengths()[:batch]])
    assert torch.equal(offsets, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]))
    if weighted:
        assert torch.equal(sample_weights, torch.cat([weights[first], weights[second]]))
    else:
        assert sample_weights.numel() == 0


PACKED_TABLES = [
    EmbeddingBagConfig(num_embeddings=50, embedding_dim=8, name="user", feature_names=["user_id"],
                       format="int8"),
    EmbeddingBagConfig(num_embeddings=30, embedding_dim=4, name="item", feature_names=["item_id", "seen"],
                       format="int4"),
    EmbeddingBagConfig(num_embeddings=20, embedding_dim=8, name="tag", pooling="max", format="int2"),
]


def test_packed_tables_pool_as_pytorchs_quantized_bags():
    """int8 and int4 sums against ``torch.ops.quantized``'s bags over the same bytes, an
    int2 max against PyTorch's max over the rows read back; bit for bit."""
    q = torch.ops.quantized
    quantized = {"int8": q.embedding_bag_byte_rowwise_offsets, "int4": q.embedding_bag_4bit_rowwise_offsets}
    torch.manual_seed(6)
    collection = EmbeddingBagCollection(PACKED_TABLES)
    kjt = features(9)
    out = collection(kjt)
    assert out.values().dtype == torch.float32 and out.values().shape == (5, 24)
    for table in PACKED_TABLES:
        bag = collection.embedding_bags[table.name]
        for feature in table.feature_names:
            k, batch = kjt.keys().index(feature), kjt.stride()
            bounds = kjt.offsets()[k * batch:(k + 1) * batch + 1]
            ids, offsets = kjt.values()[bounds[0]:bounds[-1]], bounds - bounds[0]
            if table.format in quantized:
                want = quantized[table.format](bag.packed, ids, offsets, False, 0, False, None, None, True)
            else:
                want = nn.functional.embedding_bag(ids, bag.dequantize(), offsets[:-1], mode="max")
            assert_bitwise(out[feature], want)


def test_a_float32_checkpoint_loads_into_packed_tables(tmp_path):
    """Trained in float32, served packed: the loaded tables hold PyTorch's packed bytes
    of the float32 rows."""
    pytest.importorskip("safetensors")
    from embedding_kernels.torch.distributed import load, save

    torch.manual_seed(7)
    trained = EmbeddingBagCollection([EmbeddingBagConfig(t.num_embeddings, t.embedding_dim, t.name,
                                                         t.feature_names, t.pooling) for t in PACKED_TABLES])
    save(trained, str(tmp_path))
    packed = EmbeddingBagCollection(PACKED_TABLES)
    load(packed, str(tmp_path))
    q = torch.ops.quantized
    prepack = {"int8": q.embedding_bag_byte_prepack, "int4": q.embedding_bag_4bit_prepack,
               "int2": q.embedding_bag_2bit_prepack}
    for table in PACKED_TABLES:
        weight = trained.embedding_bags[table.name].weight.detach()
        assert torch.equal(packed.embedding_bags[table.name].packed, prepack[table.format](weight))


def test_the_packed_bag_operator_passes_opcheck():
    """``torch.ops.embedding_kernels.packed_embedding_bag``: schema, fake kernel and
    dispatch, with and without per-sample weights."""
    from embedding_kernels.torch.distributed import PackedEmbeddingBag

    torch.manual_seed(8)
    bag = PackedEmbeddingBag(12, 8, "sum", "int4")
    ids, offsets = torch.tensor([3, 0, 11, 11, 5]), torch.tensor([0, 2, 2, 5])
    op = torch.ops.embedding_kernels.packed_embedding_bag.default
    for weights in (None, torch.rand(5)):
        torch.library.opcheck(op, (bag.packed, ids, offsets, weights, "sum", "int4", 8))


def test_torchrecs_own_jagged_tensor_goes_in_and_its_keyed_tensor_comes_out():
    """Where TorchRec is installed (the benchmark's virtualenv; CI has none): its
    ``KeyedJaggedTensor`` pools as ours does, the result is its ``KeyedTensor``, and the
    state dict has its ``EmbeddingBagCollection``'s keys and shapes."""
    torchrec = pytest.importorskip("torchrec")
    ours = features(3)
    theirs = torchrec.KeyedJaggedTensor(keys=ours.keys(), values=ours.values(), lengths=ours.lengths())
    torch.manual_seed(2)
    collection = EmbeddingBagCollection(TABLES)
    got, want = collection(theirs), collection(ours)
    assert isinstance(got, torchrec.KeyedTensor)
    assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
    assert_bitwise(got.values(), want.values())
    reference = torchrec.EmbeddingBagCollection(tables=[
        torchrec.EmbeddingBagConfig(num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                                    name=t.name, feature_names=t.feature_names)
        for t in TABLES
    ], device=torch.device("meta"))
    shapes = {k: tuple(v.shape) for k, v in collection.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in reference.state_dict().items()}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_inference_writes_each_feature_into_its_columns(packed, weighted):
    """Inference (no gradient wanted) writes each feature's bags straight into its
    columns of the output: the bits of the training path, which pools a table's
    features in one call and concatenates; empty batches too."""
    if weighted:
        tables = [EmbeddingBagConfig(t.num_embeddings, t.embedding_dim, t.name, t.feature_names,
                                     format=t.format) for t in (PACKED_TABLES if packed else TABLES)]
    else:
        tables = PACKED_TABLES if packed else TABLES
    torch.manual_seed(4)
    collection = EmbeddingBagCollection(tables, is_weighted=weighted)
    for seed, batch in [(0, 5), (1, 7), (2, 0)]:
        kjt = features(seed, batch=batch, weighted=weighted)
        with torch.no_grad():
            got = collection(kjt)
        # The training path for float32 tables (they require grad); packed ones, which
        # nothing trains, pooled feature by feature and concatenated.
        want = collection(kjt).values() if not packed else _pooled_apart(collection, kjt)
        assert got.keys() == [f for t in tables for f in t.feature_names]
        assert_bitwise(got.values(), want.detach())


def _pooled_apart(collection, kjt):
    """Each feature pooled by its table's module, the pooled rows concatenated."""
    outs, batch = [], kjt.stride()
    weights = kjt.weights_or_none() if collection.is_weighted() else None
    for table in collection.embedding_bag_configs():
        for feature in table.feature_names:
            k = kjt.keys().index(feature)
            bounds = kjt.offsets()[k * batch:(k + 1) * batch + 1]
            first, last = int(bounds[0]), int(bounds[-1])
            w = None if weights is None else weights[first:last]
            outs.append(collection.embedding_bags[table.name](kjt.values()[first:last], bounds - first, w))
    return torch.cat(outs, dim=1)


def test_the_columns_kernel_checks_its_output_first():
    """``_native.table_embedding_bag`` into columns: an output of the wrong shape, dtype
    or layout, or without room for the columns, or none, is refused with nothing
    written."""
    import numpy as np

    from embedding_kernels import _native

    table = np.arange(24, dtype=np.float32).reshape(6, 4)
    ids, offsets = np.array([1, 5, 0]), np.array([0, 2, 3])
    good = np.full((2, 10), -7.0, dtype=np.float32)
    _native.table_embedding_bag(table, ids, offsets, "sum", None, True, out=good, column=6)
    assert np.array_equal(good[:, 6:], np.stack([table[1] + table[5], table[0]]))
    assert (good[:, :6] == -7.0).all()
    for out, column in [
        (np.full((3, 10), -7.0, dtype=np.float32), 0),  # a row too many
        (np.full((2, 10), -7.0, dtype=np.float32), 7),  # no room for 4 columns
        (np.full((2, 10), -7.0, dtype=np.float64), 0),
        (np.full((10, 2), -7.0, dtype=np.float32).T, 0),
        (np.full((20,), -7.0, dtype=np.float32), 0),
    ]:
        with pytest.raises(ValueError):
            _native.table_embedding_bag(table, ids, offsets, "sum", None, True, out=out, column=column)
        assert (out == -7.0).all()
    with pytest.raises(ValueError, match="column needs"):
        _native.table_embedding_bag(table, ids, offsets, "sum", None, True, column=0)
    with pytest.raises(IndexError):
        _native.table_embedding_bag(table, np.array([1, 6, 0]), offsets, "sum", None, True, out=good, column=0)
    assert (good[:, :6] == -7.0).all()


def test_a_collection_made_half_afterwards_pools_as_its_half_tables():
    """``.to(torch.bfloat16)`` after construction: inference rounds each table's bags to
    bfloat16 as the half tables' own path does, not the float32 columns' sums."""
    torch.manual_seed(9)
    collection = EmbeddingBagCollection(TABLES[:2]).to(torch.bfloat16)
    kjt = features(5, keys=["seen", "user_id", "item_id"])
    with torch.no_grad():
        got = collection(kjt).values()
    assert got.dtype == torch.bfloat16
    assert_bitwise(got, _pooled_apart(collection, kjt))
