"""Trains on 8 virtual CPU devices (data 4 x model 2) and on 1; run by test_sharding.py.

Prints one line ``RESULT {json}``.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax
import numpy as np
from training_doubles import ArrayIterator, TinyModel, make_data

import t5x.partitioning as tp
from t5x.training import Trainer, adafactor, init_train_state, train

SHAPES = {"inputs": (8, 8), "targets": (8, 8)}
TYPES = {"inputs": np.int32, "targets": np.int32}


def run(partitioner):
    model = TinyModel()
    init = init_train_state(model, adafactor(beta1=0.9), partitioner, SHAPES, TYPES, seed=0)
    trainer = Trainer(
        model, partitioner, init.state, init.shardings, learning_rate_fn=lambda s: 0.05, num_microbatches=2
    )
    result = train(
        trainer, ArrayIterator(make_data(64), 8, shuffle=False), total_steps=4, handle_signals=False
    )
    return trainer, result


def spec(array):
    return [None if a is None else str(a) for a in array.sharding.spec]


def main():
    assert jax.device_count() == 8
    sharded, sharded_result = run(tp.PjitPartitioner(num_partitions=2))
    single, single_result = run(tp.PjitPartitioner(num_partitions=1, devices=jax.devices()[:1]))
    state = sharded.state
    slots = state.opt_state.param_states["out"]["kernel"]
    out = {
        "kernel": spec(state.params["out"]["kernel"]),
        "bias": spec(state.params["out"]["bias"]),
        "kernel_m": spec(slots.m),
        "kernel_v": spec(slots.v),
        "kernel_v_row": spec(slots.v_row),
        "count": spec(state.opt_state.count),
        "losses": [sharded_result.losses[s] for s in range(4)],
        "single_losses": [single_result.losses[s] for s in range(4)],
        "max_param_diff": max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(single.state.params), strict=True)
        ),
    }
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
