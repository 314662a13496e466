"""Runs both decoders on 8 fake CPU devices with a batch-sharded cache; prints a JSON report.

Run as a script (the device count must be set before JAX starts), from test_sharding.py.
"""

from __future__ import annotations

import json
import os
import re
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from t5x.decoding import beam_search, temperature_sample

# A vocabulary large enough that beam search takes its argmax-pass top-k (not a sort).
BATCH, LENGTH, VOCAB, WIDTH = 8, 6, 2048, 32


def model(state):
    """Attention-like toy: the cache holds past token embeddings; logits mix them."""
    cache = state.cache
    embed = jax.nn.one_hot(state.cur_token[:, 0], WIDTH) + cache["bias"]
    slot = jax.nn.one_hot(cache["cache_index"] if cache["cache_index"].ndim else state.cur_index, LENGTH + 2)
    keys = cache["keys"] + slot[:, :, None] * embed[:, None, :]
    weights = jax.nn.softmax(jnp.einsum("bd,bld->bl", embed, keys), axis=-1)
    mixed = jnp.einsum("bl,bld->bd", weights, keys)
    logits = jnp.tile(mixed, VOCAB // WIDTH) * 3.0 + jnp.arange(VOCAB) * 1e-3
    return logits, {**cache, "keys": keys}


def main() -> None:
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    cache = {
        "keys": jnp.zeros((BATCH, LENGTH + 2, WIDTH), jnp.float32),
        "bias": jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32),
        "cache_index": jnp.zeros((), jnp.int32),
    }
    inputs = jnp.zeros((BATCH, LENGTH), jnp.int32).at[:, 1].set(jnp.arange(BATCH) % 5 + 2)
    shard = {"keys": rows, "bias": rows, "cache_index": replicated}

    def sample(i, c, r):
        return temperature_sample(i, c, model, 1, r, num_decodes=2, topk=4)

    def nucleus(i, c, r, t):
        return temperature_sample(i, c, model, 1, r, num_decodes=2, topp=0.8, temperature=t)

    def beams(i, c):
        return beam_search(i, c, model, 1, num_decodes=3)

    report = {}
    for name, fn, args, in_shardings in (
        ("sample", sample, (inputs, cache, jax.random.PRNGKey(0)), (rows, shard, replicated)),
        (
            "nucleus",
            nucleus,
            (inputs, cache, jax.random.PRNGKey(1), jnp.linspace(0, 1, BATCH)),
            (rows, shard, replicated, rows),
        ),
        ("beam", beams, (inputs, cache), (rows, shard)),
    ):
        expected = jax.jit(fn)(*args)
        placed = jax.device_put(args, in_shardings)
        compiled = jax.jit(fn, in_shardings=in_shardings).lower(*placed).compile()
        got = compiled(*placed)
        hlo = compiled.as_text()
        gathers = re.findall(r"= (\S+) all-gather", hlo)
        reduces = re.findall(r"= (\S+) all-reduce", hlo)
        report[name] = {
            "equal": all(bool(np.allclose(a, b, atol=1e-5)) for a, b in zip(got, expected)),
            "all_gathers": gathers,
            "all_reduces": reduces,
            "all_to_all": hlo.count("all-to-all"),
            "output_sharded": [not x.sharding.is_fully_replicated for x in got],
        }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
