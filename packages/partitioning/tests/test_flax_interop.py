"""Flax models annotated with logical names work with the partitioner unchanged.

t5x.partitioning never imports Flax; it reads Flax's boxes by their `.names`
and, when Flax is loaded, puts its rules into Flax's rules context.
"""

import re

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import t5x.partitioning as tp


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):  # x: [batch, length, embed]
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        h = nn.Dense(
            32,
            use_bias=False,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
        )(x)
        h = nn.with_logical_constraint(nn.relu(h), ("batch", "length", "mlp"))
        return nn.Dense(
            16,
            use_bias=False,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "embed")),
        )(h)


def test_flax_boxes_give_the_shardings_and_numbers_match(devices):
    model = Mlp()
    x = np.random.default_rng(0).normal(size=(8, 4, 16)).astype(np.float32)
    key = jax.random.key(0)
    partitioner = tp.PjitPartitioner(
        2, logical_axis_rules=tp.standard_logical_axis_rules(2, 2), devices=devices
    )

    variables = partitioner.initialize(model.init, key, x)
    kernels = variables["params"]
    assert kernels["Dense_0"]["kernel"].names == ("embed", "mlp")
    assert kernels["Dense_0"]["kernel"].value.sharding.spec == P("data", "model")
    assert kernels["Dense_1"]["kernel"].value.sharding.spec == P("model", "data")

    axes = tp.get_logical_axes(variables)
    apply = partitioner.partition(
        model.apply,
        in_shardings=(axes, ("batch", "length", "embed")),
        out_shardings=("batch", "length", "embed"),
    )
    batch = partitioner.host_local_to_global({"x": x}, {"x": ("batch", "length", "embed")})["x"]
    out = apply(variables, batch)
    assert out.sharding.spec == P("data", None, "model")
    text = apply.lower(variables, batch).as_text()
    # Flax's own constraints were resolved with our rules (embed -> model in 2-D activations).
    constraints = re.findall(r"sharding_constraint %\w+ <@mesh, (\[.*?\])>", text)
    # x, kernel 0 (unboxed by Flax), h, kernel 1.
    assert constraints == [
        '[{"data"}, {}, {"model"}]',
        '[{"data"}, {"model"}]',
        '[{"data"}, {}, {"model"}]',
        '[{"model"}, {"data"}]',
    ], constraints

    want = jax.jit(model.apply)(jax.jit(model.init)(key, x), x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-6)
