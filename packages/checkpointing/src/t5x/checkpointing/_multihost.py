"""Coordination between the processes of one ``jax.distributed`` job.

Uses the distributed runtime's key-value store and barriers rather than device
collectives, so it is safe to call from the background save thread while the
training loop runs computations on the devices.
"""

from __future__ import annotations

import jax

_TIMEOUT_MS = 30 * 60 * 1000


def _client():
    from jax._src import distributed  # the public API exposes no barrier

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError(
            f"jax.process_count() is {jax.process_count()} but jax.distributed is not initialized; "
            "multi-process checkpointing needs jax.distributed.initialize()"
        )
    return client


def barrier(name: str, timeout_ms: int = _TIMEOUT_MS) -> None:
    """Blocks until every process reached the barrier ``name`` (no-op alone)."""
    if jax.process_count() > 1:
        _client().wait_at_barrier(name, timeout_ms)


def broadcast_text(key: str, value: str | None, timeout_ms: int = _TIMEOUT_MS) -> str:
    """Process 0's ``value`` for ``key``, on every process."""
    if jax.process_count() == 1:
        assert value is not None
        return value
    client = _client()
    if jax.process_index() == 0:
        assert value is not None
        client.key_value_set(key, value)
        return value
    return client.blocking_key_value_get(key, timeout_ms)
