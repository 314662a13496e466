import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import t5x.partitioning as tp
from t5x.interfaces import DataLayout, Partitioner
from t5x.interfaces.testing import check_partitioner

VOCAB, EMBED, MLP, BATCH, LENGTH = 24, 16, 32, 8, 4

PARAM_AXES = {"emb": ("vocab", "embed"), "wi": ("embed", "mlp"), "wo": ("mlp", "embed")}
BATCH_AXES = {"inputs": ("batch", "length"), "targets": ("batch", "length")}


def make_params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "emb": rng.normal(size=(VOCAB, EMBED)).astype(np.float32),
        "wi": rng.normal(size=(EMBED, MLP)).astype(np.float32) / 4,
        "wo": rng.normal(size=(MLP, EMBED)).astype(np.float32) / 6,
    }


def make_batch(seed=1):
    rng = np.random.default_rng(seed)
    return {
        "inputs": rng.integers(0, VOCAB, size=(BATCH, LENGTH)).astype(np.int32),
        "targets": rng.integers(0, VOCAB, size=(BATCH, LENGTH)).astype(np.int32),
    }


def loss_fn(params, batch):
    hidden = params["emb"][batch["inputs"]]  # [batch, length, embed]
    hidden = tp.with_sharding_constraint(hidden, ("batch", "length", "embed"))
    hidden = hidden + jax.nn.relu(hidden @ params["wi"]) @ params["wo"]
    logits = hidden @ params["emb"].T  # [batch, length, vocab]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1))


def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


CONFIGS = [
    # (num_partitions, activation dims, parameter dims, expected param specs, expected hidden spec)
    # With num_partitions=1 the 'model' axis has size 1: named, but every device holds it all.
    (1, 1, 1, {"emb": P("model", None), "wi": P(None, "model"), "wo": P("model", None)}),
    (2, 1, 1, {"emb": P("model", None), "wi": P(None, "model"), "wo": P("model", None)}),
    (4, 2, 1, {"emb": P("model", None), "wi": P(None, "model"), "wo": P("model", None)}),
    (2, 1, 2, {"emb": P("model", "data"), "wi": P("data", "model"), "wo": P("model", "data")}),
    (2, 2, 2, {"emb": P("model", "data"), "wi": P("data", "model"), "wo": P("model", "data")}),
]


def _mesh_size(mesh, entry):
    if entry is None:
        return 1
    return int(np.prod([mesh.shape[a] for a in ((entry,) if isinstance(entry, str) else entry)]))


def _check_placed(array, mesh, spec):
    assert isinstance(array.sharding, NamedSharding)
    assert array.sharding.mesh == mesh
    assert array.sharding.spec == spec, (array.sharding.spec, spec)
    shard_shape = tuple(n // _mesh_size(mesh, e) for n, e in zip(array.shape, tuple(spec) + (None,) * 8))
    assert array.addressable_shards[0].data.shape == shard_shape


@pytest.mark.parametrize(("partitions", "act", "par", "param_specs"), CONFIGS)
def test_sharded_step_matches_unsharded(devices, partitions, act, par, param_specs):
    rules = tp.standard_logical_axis_rules(act, par)
    partitioner = tp.PjitPartitioner(num_partitions=partitions, logical_axis_rules=rules, devices=devices)
    mesh = partitioner.mesh
    assert dict(mesh.shape) == {"data": 8 // partitions, "model": partitions}

    params = partitioner.initialize(lambda: jax.tree.map(jnp.asarray, make_params()), logical_axes=PARAM_AXES)
    for name, spec in param_specs.items():
        _check_placed(params[name], mesh, spec)
    batch = partitioner.host_local_to_global(make_batch(), BATCH_AXES)
    for array in batch.values():
        _check_placed(array, mesh, P("data", None))

    step = partitioner.partition(
        train_step, in_shardings=(PARAM_AXES, BATCH_AXES), out_shardings=(PARAM_AXES, None), donate_argnums=0
    )
    new_params, loss = step(params, batch)
    for name, spec in param_specs.items():
        _check_placed(new_params[name], mesh, spec)
    _check_placed(loss, mesh, P())

    want_params, want_loss = jax.jit(train_step, device=None)(make_params(), make_batch())
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    got = partitioner.global_to_host_local(new_params)
    for name in want_params:
        assert isinstance(got[name], np.ndarray)
        np.testing.assert_allclose(got[name], np.asarray(want_params[name]), rtol=1e-4, atol=1e-6)


def test_activation_constraint_follows_the_rules(devices):
    for act, want in [(1, '[{"data"}, {}, {}]'), (2, '[{"data"}, {}, {"model"}]')]:
        partitioner = tp.PjitPartitioner(
            2, logical_axis_rules=tp.standard_logical_axis_rules(act, 1), devices=devices
        )
        step = partitioner.partition(loss_fn, in_shardings=(PARAM_AXES, BATCH_AXES), out_shardings=None)
        text = step.lower(make_params(), make_batch()).as_text()
        # The constraint on `hidden` [batch, length, embed]: batch over data (4), embed over model (2) only in 2-D.
        constraints = re.findall(r"sharding_constraint %\w+ <@mesh, (\[.*?\])>", text)
        assert constraints == [want], constraints


def test_with_sharding_constraint_is_identity_outside(devices):
    x = jnp.ones((4, 2))
    assert tp.with_sharding_constraint(x, ("batch", "unknown_name")) is x


def test_conformance(devices):
    for partitions in (1, 2, 8):
        partitioner = tp.PjitPartitioner(num_partitions=partitions, devices=devices)
        assert isinstance(partitioner, Partitioner)
        check_partitioner(partitioner, batch_size=16)
    check_partitioner(tp.PjitPartitioner(devices=devices[:1]), batch_size=3)


def test_data_layout(devices):
    partitioner = tp.PjitPartitioner(num_partitions=2, devices=devices)
    assert partitioner.get_data_layout(12) == DataLayout(12, 0, 1, True)
    assert partitioner.get_data_layout().batch_size == 4
    assert partitioner.data_mesh_size == 4 and partitioner.data_axes == ("data",)
    with pytest.raises(ValueError, match=r"batch size 10 is not divisible by the data-parallel size 4"):
        partitioner.get_data_layout(10)
    with pytest.raises(ValueError, match=r"global batch size 6 .* not divisible by the data-parallel size 4"):
        partitioner.host_local_to_global({"x": np.zeros((6, 2), np.float32)})


def test_batch_replicated_when_rules_say_so(devices):
    rules = [(n, None) if n == "batch" else (n, a) for n, a in tp.standard_logical_axis_rules()]
    partitioner = tp.PjitPartitioner(num_partitions=2, logical_axis_rules=rules, devices=devices)
    assert partitioner.data_axes == () and partitioner.data_mesh_size == 1
    assert partitioner.get_data_layout(5) == DataLayout(5, 0, 1, True)
    batch = partitioner.host_local_to_global({"x": np.arange(10.0).reshape(5, 2)})
    assert batch["x"].sharding.spec == P(None, None)


def test_host_local_to_global_feature_axes(devices):
    rules = tp.standard_logical_axis_rules(additional_rules=[("vocab_out", "model")])
    partitioner = tp.PjitPartitioner(num_partitions=2, logical_axis_rules=rules, devices=devices)
    local = {"ids": np.arange(32).reshape(8, 4), "logits": np.arange(64.0).reshape(8, 8), "w": np.ones((8,))}
    out = partitioner.host_local_to_global(local, {"logits": ("batch", "vocab_out"), "w": P("batch")})
    assert out["ids"].sharding.spec == P("data", None)
    assert out["logits"].sharding.spec == P("data", "model")
    assert out["logits"].addressable_shards[0].data.shape == (2, 4)
    for key, value in local.items():
        np.testing.assert_array_equal(np.asarray(out[key]), value)
    scalar = partitioner.host_local_to_global({"n": np.float32(3.0)})["n"]
    assert scalar.shape == () and scalar.sharding.spec == P() and float(scalar) == 3.0
    assert partitioner.get_mesh_axes({"logits": ("batch", "vocab_out"), "r": None}) == {
        "logits": P("data", "model"),
        "r": P(),
    }
    with pytest.raises(ValueError, match="lacks"):
        partitioner.host_local_to_global(local, {"nope": ("batch",)})


def test_compile_ahead_of_time_and_static_args(devices):
    partitioner = tp.PjitPartitioner(num_partitions=2, devices=devices)

    def scaled_sum(x, power):
        return jnp.sum(x**power, axis=1)

    fn = partitioner.partition(
        scaled_sum, in_shardings=(("batch", "mlp"),), out_shardings=("batch",), static_argnums=1
    )
    x = partitioner.host_local_to_global({"x": np.arange(16.0).reshape(8, 2)}, {"x": ("batch", "mlp")})["x"]
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    compiled = partitioner.compile(fn, spec, 3)
    np.testing.assert_allclose(np.asarray(compiled(x)), np.sum(np.arange(16.0).reshape(8, 2) ** 3, axis=1))
    np.testing.assert_allclose(np.asarray(fn(x, 2)), np.sum(np.arange(16.0).reshape(8, 2) ** 2, axis=1))
    with pytest.raises(TypeError, match="partition"):
        partitioner.compile(scaled_sum, x, 2)


def test_initialize_does_not_materialise_on_one_device(devices):
    partitioner = tp.PjitPartitioner(
        num_partitions=2, logical_axis_rules=tp.standard_logical_axis_rules(1, 2), devices=devices
    )

    def init(key):
        return {"wi": jax.random.normal(key, (EMBED, MLP)), "step": jnp.zeros((), jnp.int32)}

    key = jax.random.key(3)
    state = partitioner.initialize(init, key, logical_axes={"wi": ("embed", "mlp"), "step": None})
    _check_placed(state["wi"], partitioner.mesh, P("data", "model"))
    _check_placed(state["step"], partitioner.mesh, P())
    # Every device holds only its 1/8 block of wi.
    assert {s.data.shape for s in state["wi"].addressable_shards} == {(EMBED // 4, MLP // 2)}
    np.testing.assert_allclose(np.asarray(state["wi"]), np.asarray(init(key)["wi"]), rtol=1e-6)


def test_constructor_errors(devices):
    with pytest.raises(ValueError, match="not both"):
        tp.PjitPartitioner(num_partitions=2, model_parallel_submesh=(1, 2))
    with pytest.raises(ValueError, match=r"num_partitions=16 does not divide the device count 8"):
        tp.PjitPartitioner(num_partitions=16, devices=devices)
    with pytest.raises(ValueError, match="unknown logical axis name 'tokens'"):
        tp.PjitPartitioner(2, devices=devices).get_sharding({"x": ("tokens", "embed")})


def test_multi_slice_partitioner_shards_batch_over_replica_and_data(devices):
    mesh = tp.make_mesh(np.array(devices).reshape(2, 2, 2), ("replica", "data", "model"))
    partitioner = tp.PjitPartitioner(mesh=mesh)
    assert partitioner.data_axes == ("replica", "data")
    assert partitioner.data_mesh_size == 4
    batch = partitioner.host_local_to_global({"x": np.arange(8.0)})
    assert batch["x"].sharding.spec == P(("replica", "data"))
