"""Expert parallelism on 8 CPU devices: same loss and gradients as one device, all-to-all, re-sharding."""

import jax
import numpy as np
import pytest
from flax import traverse_util

from t5x.moe import MoeEncoderDecoderModel, MoePjitPartitioner
from t5x.partitioning import PjitPartitioner

SHAPES = {"encoder_input_tokens": (8, 8), "decoder_input_tokens": (8, 6)}


@pytest.fixture(scope="module")
def setup(tiny_config, devices):
    model = MoeEncoderDecoderModel(tiny_config, router_z_loss_factor=1e-3)
    variables = model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)
    return model, variables["params"], variables["params_axes"]


def _loss_and_grads(partitioner, model, params, axes, batch):
    shardings = partitioner.get_sharding(_strip(axes))
    placed = jax.device_put(params, shardings)
    batch_shardings = partitioner.get_sharding({k: ("batch", None) for k in batch})
    fn = partitioner.partition(
        jax.value_and_grad(lambda p, b: model.loss_fn(p, b, None)[0]),
        in_shardings=(shardings, batch_shardings),
        out_shardings=(partitioner.get_sharding(()), shardings),
    )
    batch = jax.device_put(batch, batch_shardings)
    return fn, placed, batch


def _strip(axes):
    """``params_axes`` (``<name>_axes`` boxes) as a tree of name tuples shaped like the params."""
    return traverse_util.unflatten_dict(
        {
            (*k[:-1], k[-1].removesuffix("_axes")): tuple(v.names)
            for k, v in traverse_util.flatten_dict(axes, is_leaf=lambda _, x: hasattr(x, "names")).items()
        }
    )


def test_expert_parallel_loss_and_grads_match_one_device(setup, random_batch, devices):
    model, params, axes = setup
    batch = random_batch(7)
    one = MoePjitPartitioner(num_expert_partitions=1, devices=devices[:1])
    fn1, p1, b1 = _loss_and_grads(one, model, params, axes, batch)
    loss1, grads1 = fn1(p1, b1)
    # 8 devices: 4 expert shards (one expert each) x 2 data-parallel.
    eight = MoePjitPartitioner(num_expert_partitions=4, devices=devices)
    assert dict(eight.mesh.shape) == {"expert": 4, "data": 2, "model": 1}
    fn8, p8, b8 = _loss_and_grads(eight, model, params, axes, batch)
    wi = p8["encoder"]["layers_1"]["mlp"]["expert"]["wi"]["kernel"]
    assert wi.sharding.spec[0] == "expert"
    assert len({s.index for s in wi.addressable_shards}) == 4
    loss8, grads8 = fn8(p8, b8)
    np.testing.assert_allclose(float(loss8), float(loss1), rtol=1e-5)
    flat1, flat8 = traverse_util.flatten_dict(grads1), traverse_util.flatten_dict(grads8)
    for key, g in flat1.items():
        np.testing.assert_allclose(
            np.asarray(flat8[key]), np.asarray(g), rtol=2e-4, atol=1e-6, err_msg="/".join(key)
        )
    hlo = fn8.lower(p8, b8).compile().as_text()
    assert "all-to-all" in hlo


def test_experts_not_divisible_by_the_expert_axis_is_named(setup, random_batch, devices, tiny_config):
    import dataclasses

    with pytest.raises(ValueError, match="num_experts=4 is not divisible by num_expert_partitions=8"):
        MoePjitPartitioner(num_expert_partitions=8, devices=devices, num_experts=4)
    with pytest.raises(ValueError, match="does not divide the 8 data-parallel devices"):
        MoePjitPartitioner(num_expert_partitions=3, devices=devices)
    cfg = dataclasses.replace(tiny_config, num_experts=6)
    model = MoeEncoderDecoderModel(cfg)
    partitioner = MoePjitPartitioner(num_expert_partitions=4, devices=devices)
    replicated = partitioner.get_sharding(())
    init = partitioner.partition(
        lambda rng: model.get_initial_variables(rng, SHAPES)["params"],
        in_shardings=(replicated,),
        out_shardings=replicated,
    )
    with pytest.raises(
        ValueError, match="num_experts=6 is not divisible by the 'expert' mesh axis of size 4"
    ):
        init(jax.random.PRNGKey(0))


def test_checkpoint_save_restore_reshard(setup, tmp_path, devices):
    from t5x.checkpointing import load_t5x_checkpoint, save_t5x_checkpoint

    _, params, axes = setup
    sharded = MoePjitPartitioner(num_expert_partitions=4, devices=devices)
    placed = jax.device_put(params, sharded.get_sharding(_strip(axes)))
    save_t5x_checkpoint(tmp_path, 3, {"target": placed, "state": {"step": np.int32(3)}})
    restored = load_t5x_checkpoint(tmp_path)["target"]
    # Re-shard onto a different layout: experts over 2 shards and model parallelism 2.
    other = MoePjitPartitioner(num_expert_partitions=2, num_partitions=2, devices=devices)
    replaced = jax.device_put(restored, other.get_sharding(_strip(axes)))
    flat_a, flat_b = traverse_util.flatten_dict(params), traverse_util.flatten_dict(replaced)
    assert flat_a.keys() == flat_b.keys()
    for key, value in flat_a.items():
        np.testing.assert_array_equal(np.asarray(flat_b[key]), np.asarray(value))
    wi = flat_b[("encoder", "layers_1", "mlp", "expert", "wi", "kernel")]
    assert tuple(wi.sharding.spec)[:3] == ("expert", None, "model")
    assert isinstance(other, PjitPartitioner)


def test_t5x_training_trains_the_moe_model_expert_parallel(setup, random_batch, devices):
    import optax

    from t5x.training import Trainer, init_train_state

    model = setup[0]
    partitioner = MoePjitPartitioner(num_expert_partitions=4, devices=devices)
    init = init_train_state(model, optax.adam(1e-2), partitioner, SHAPES)
    trainer = Trainer(model, partitioner, init.state, init.shardings)
    batch = random_batch(9)
    losses = [float(trainer.train_step(batch)["loss"]) for _ in range(4)]
    metrics = trainer.train_step(batch)
    assert float(metrics["loss"]) < losses[0]
    assert "experts/auxiliary_loss" in metrics and "experts/fraction_tokens_left_behind" in metrics
