"""Multi-process start-up and small cross-process helpers over ``jax.distributed``."""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
    *,
    cluster_detection_method: str | None = None,
    initialization_timeout: int = 300,
) -> None:
    """Starts JAX's multi-controller runtime; call once per process before using devices.

    With an explicit coordinator, pass ``coordinator_address`` ("host:port" of
    process 0), ``num_processes`` and ``process_id``. With no arguments JAX
    detects the cluster itself (Cloud TPU, SLURM, Open MPI, Kubernetes, ...).
    Calling it again after a successful start does nothing.

    Args:
      coordinator_address: ``host:port`` where process 0 serves coordination.
      num_processes: the number of processes in the job.
      process_id: this process's index in ``[0, num_processes)``.
      local_device_ids: the local devices this process may use (e.g. one GPU
        per process); all by default.
      cluster_detection_method: force one of JAX's cluster detectors (e.g.
        ``"slurm"``); JAX tries them all by default.
      initialization_timeout: seconds to wait for all processes to connect.

    Raises:
      ValueError: an explicit configuration that is incomplete or inconsistent.
      RuntimeError: no arguments were given and no cluster was detected.
    """
    if jax.distributed.is_initialized():
        return
    explicit = (coordinator_address, num_processes, process_id)
    if coordinator_address is not None and None in explicit and cluster_detection_method is None:
        raise ValueError(
            "with an explicit coordinator_address also give num_processes and process_id "
            f"(got num_processes={num_processes!r}, process_id={process_id!r})"
        )
    if num_processes is not None and process_id is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, num_processes={num_processes}), got {process_id}")
    kwargs: dict[str, Any] = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
        "local_device_ids": None if local_device_ids is None else list(local_device_ids),
        "initialization_timeout": initialization_timeout,
    }
    if cluster_detection_method is not None:
        kwargs["cluster_detection_method"] = cluster_detection_method
    if all(v is None for v in explicit) and cluster_detection_method is None:
        try:
            jax.distributed.initialize(**kwargs)
        except ValueError as error:
            raise RuntimeError(
                "initialize_distributed() found no cluster to join (no TPU pod, SLURM, MPI or Kubernetes "
                "job detected); pass coordinator_address, num_processes and process_id explicitly, or "
                f"skip this call for a single process. JAX said: {error}"
            ) from error
        return
    jax.distributed.initialize(**kwargs)


def is_process_zero() -> bool:
    """True on the process that writes logs, summaries and outputs (process 0)."""
    return jax.process_index() == 0


def on_process_zero[T](fn: Callable[..., T]) -> Callable[..., T | None]:
    """Decorates ``fn`` so that it runs only on process 0 (returning None elsewhere).

    The wrapped function must not run collectives: other processes never call it.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        return fn(*args, **kwargs) if is_process_zero() else None

    return wrapper


def barrier(name: str) -> None:
    """Blocks until every process has reached the barrier called ``name``.

    All processes must call barriers in the same order with the same names.
    """
    multihost_utils.sync_global_devices(name)


def broadcast_seed(seed: int | None = None) -> int:
    """Returns process 0's seed on every process.

    Args:
      seed: this process's candidate seed, a non-negative int below 2**63;
        only process 0's counts. None on process 0 draws a fresh one.

    Returns:
      Process 0's seed.

    Raises:
      ValueError: the seed on process 0 is out of range.
    """
    if is_process_zero():
        if seed is None:
            seed = secrets.randbits(63)
        if not 0 <= int(seed) < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    value = int(seed or 0) if is_process_zero() else 0
    # Two 32-bit halves because JAX works without 64-bit integers by default.
    halves = np.array([value >> 32, value & 0xFFFFFFFF], dtype=np.uint32)
    if jax.process_count() > 1:
        halves = np.asarray(multihost_utils.broadcast_one_to_all(halves))
    return (int(halves[0]) << 32) | int(halves[1])


def _fingerprint(value: Any) -> np.ndarray:
    digest = hashlib.sha256()
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        array = np.asarray(value)
        digest.update(f"array:{array.dtype.str}:{array.shape}:".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    else:
        digest.update(repr(value).encode())
    return np.frombuffer(digest.digest(), dtype=np.uint8).copy()


def assert_same_across_processes(value: Any, name: str = "value") -> None:
    """Checks that every process holds the same ``value``.

    Arrays compare by dtype, shape and contents; other values by ``repr``.

    Args:
      value: an array, or any value with a deterministic ``repr`` (a seed, a
        config dict, a list of file names).
      name: what the value is, for the error message.

    Raises:
      AssertionError: naming the processes whose value differs from process 0's.
    """
    mine = _fingerprint(value)
    if jax.process_count() == 1:
        return
    everyone = np.asarray(multihost_utils.process_allgather(mine))
    differing = [p for p in range(everyone.shape[0]) if not np.array_equal(everyone[p], everyone[0])]
    if differing:
        raise AssertionError(
            f"{name} differs between processes: processes {differing} disagree with process 0 "
            f"(this is process {jax.process_index()}, holding {value!r:.200})"
        )
