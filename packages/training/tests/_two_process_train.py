"""One of two local processes training under jax.distributed; run by test_multiprocess.py.

Usage: python _two_process_train.py PORT PROCESS_ID OUT_NPZ
Each process feeds its half of every global batch of 8; process 0 saves the final params.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax
import numpy as np
from training_doubles import ArrayIterator, TinyModel, make_data

import t5x.partitioning as tp
from t5x.training import Trainer, adafactor, init_train_state, train

STEPS, GLOBAL_BATCH = 6, 8


def shard_rows(data, shard, num_shards):
    """The rows this shard contributes to each consecutive global batch."""
    per = GLOBAL_BATCH // num_shards
    size = len(data["inputs"])
    rows = [i for b in range(0, size, GLOBAL_BATCH) for i in range(b + shard * per, b + (shard + 1) * per)]
    return {k: v[rows] for k, v in data.items()}


def run(partitioner, data):
    model = TinyModel()
    shapes = {"inputs": (GLOBAL_BATCH, 8), "targets": (GLOBAL_BATCH, 8)}
    types = {"inputs": np.int32, "targets": np.int32}
    init = init_train_state(model, adafactor(), partitioner, shapes, types, seed=0)
    trainer = Trainer(model, partitioner, init.state, init.shardings, learning_rate_fn=lambda s: 0.05, seed=3)
    layout = partitioner.get_data_layout(GLOBAL_BATCH)
    local = shard_rows(data, layout.shard_id, layout.num_shards)
    iterator = ArrayIterator(local, layout.per_shard_batch_size, shuffle=False)
    result = train(trainer, iterator, total_steps=STEPS, handle_signals=False)
    params = partitioner.global_to_host_local(trainer.state.params)
    return result, params


def main(port, pid, out):
    tp.initialize_distributed(f"localhost:{port}", num_processes=2, process_id=pid, initialization_timeout=60)
    partitioner = tp.PjitPartitioner(num_partitions=1)
    result, params = run(partitioner, make_data(STEPS * GLOBAL_BATCH, seed=8))
    if pid == 0:
        flat = {
            jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(params)
        }
        np.savez(out, losses=np.asarray([result.losses[s] for s in range(STEPS)]), **flat)
    print("done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
