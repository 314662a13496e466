"""Joining a multi-process job before JAX starts its backend."""

from __future__ import annotations

import os

from t5x.launch._local import COORDINATOR_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV


def maybe_initialize_distributed() -> None:
    """Calls ``jax.distributed.initialize`` when this process is part of a multi-process job.

    ``t5x-launch local`` sets the coordinator address, process count and id in
    the environment; on TPU pods and SLURM clusters JAX detects them itself
    when ``T5X_AUTO_DISTRIBUTED=1``.
    """
    from t5x.partitioning import initialize_distributed

    if COORDINATOR_ENV in os.environ:
        initialize_distributed(
            coordinator_address=os.environ[COORDINATOR_ENV],
            num_processes=int(os.environ[NUM_PROCESSES_ENV]),
            process_id=int(os.environ[PROCESS_ID_ENV]),
        )
    elif os.environ.get("T5X_AUTO_DISTRIBUTED") == "1":
        initialize_distributed()
