"""One of two local processes under jax.distributed; only process 1 gets SIGTERM, after step 3.

Run by test_multiprocess.py. Usage: python _two_process_signal.py PORT PROCESS_ID MODEL_DIR
Prints ``stopped <stop_reason> <signal> <step>``.
"""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np
from _two_process_train import GLOBAL_BATCH, shard_rows
from training_doubles import ArrayIterator, TinyModel, make_data

import t5x.partitioning as tp
from t5x.checkpointing import Checkpointer
from t5x.training import Trainer, adafactor, init_train_state, train

SIGNALLED_STEP, TOTAL_STEPS = 3, 40


def main(port: int, pid: int, model_dir: str) -> None:
    tp.initialize_distributed(f"localhost:{port}", num_processes=2, process_id=pid, initialization_timeout=60)
    partitioner = tp.PjitPartitioner(num_partitions=1)
    model = TinyModel()
    shapes = {"inputs": (GLOBAL_BATCH, 8), "targets": (GLOBAL_BATCH, 8)}
    types = {"inputs": np.int32, "targets": np.int32}
    init = init_train_state(model, adafactor(), partitioner, shapes, types, seed=0)
    trainer = Trainer(model, partitioner, init.state, init.shardings, learning_rate_fn=lambda s: 0.05, seed=3)
    layout = partitioner.get_data_layout(GLOBAL_BATCH)
    data = shard_rows(make_data(TOTAL_STEPS * GLOBAL_BATCH, seed=8), layout.shard_id, layout.num_shards)
    iterator = ArrayIterator(data, layout.per_shard_batch_size, shuffle=False)

    def on_step(step, metrics):
        del metrics
        if pid == 1 and step == SIGNALLED_STEP:
            os.kill(os.getpid(), signal.SIGTERM)

    checkpointer = Checkpointer(model_dir)
    result = train(trainer, iterator, total_steps=TOTAL_STEPS, checkpointer=checkpointer, on_step=on_step)
    checkpointer.close()
    print(f"stopped {result.stop_reason} {result.signal} {result.step}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
