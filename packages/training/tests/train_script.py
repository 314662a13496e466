"""A training job run in a subprocess by the resume / preemption tests.

Usage: train_script.py WORKDIR TOTAL_STEPS [--die-after N] [--slow] [--checkpointer npz|t5x]

With ``--checkpointer t5x`` it uses the real PjitPartitioner and T5X Checkpointer.
Writes WORKDIR/result.json (losses by step, stop reason) and WORKDIR/params.npz.
"""

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax
import jax.numpy as jnp
import numpy as np
from training_doubles import ArrayIterator, LocalPartitioner, NpzCheckpointer, TinyModel, make_data

from t5x.training import Trainer, adafactor, create_learning_rate_scheduler, init_train_state, train


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("total_steps", type=int)
    parser.add_argument("--die-after", type=int, default=None)
    parser.add_argument("--slow", action="store_true")
    parser.add_argument("--checkpointer", default="npz")
    args = parser.parse_args()

    model = TinyModel()
    if args.checkpointer == "t5x":
        from t5x.partitioning import PjitPartitioner

        partitioner = PjitPartitioner(num_partitions=1)
    else:
        partitioner = LocalPartitioner()
    shapes = {"inputs": (8, 8), "targets": (8, 8)}
    types = {"inputs": jnp.int32, "targets": jnp.int32}
    init = init_train_state(model, adafactor(beta1=0.9), partitioner, shapes, types, seed=0)
    trainer = Trainer(
        model,
        partitioner,
        init.state,
        init.shardings,
        learning_rate_fn=create_learning_rate_scheduler("constant * linear_warmup", 0.1, warmup_steps=5),
        num_microbatches=2,
        seed=1,
    )
    if args.checkpointer == "t5x":
        from t5x.checkpointing import Checkpointer

        checkpointer = Checkpointer(os.path.join(args.workdir, "model"))
    else:
        checkpointer = NpzCheckpointer(os.path.join(args.workdir, "model"))
    data = ArrayIterator(make_data(40), batch_size=8, seed=2)  # 5 batches per epoch: crosses epochs

    def on_step(step, metrics):
        print(f"step {step} loss {metrics['loss']:.6f}", flush=True)
        if args.die_after is not None and step == args.die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.slow:
            time.sleep(0.05)

    result = train(
        trainer,
        data,
        total_steps=args.total_steps,
        checkpointer=checkpointer,
        checkpoint_period=5,
        log_period=5,
        on_step=on_step,
    )
    checkpointer.close()
    with open(os.path.join(args.workdir, "result.json"), "w") as f:
        json.dump(
            {
                "losses": {str(k): v for k, v in result.losses.items()},
                "stop_reason": result.stop_reason,
                "signal": result.signal,
                "step": result.step,
                "start_step": result.start_step,
            },
            f,
        )
    flat = {
        jax.tree_util.keystr(p): np.asarray(v)
        for p, v in jax.tree_util.tree_leaves_with_path(trainer.state.params)
    }
    np.savez(os.path.join(args.workdir, "params.npz"), **flat)
    print(f"done {result.stop_reason} at step {result.step}", flush=True)


if __name__ == "__main__":
    main()
