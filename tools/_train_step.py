"""Pieces the train-step benchmarks share: the matmul peak and one compiled optax train step."""

from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax


def matmul_peak(n: int, dtype: Any) -> float:
    """FLOP/s of a jitted ``n``^3 matmul of ``dtype`` operands accumulated in float32 (median of 5)."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    mm = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    mm(a, b).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        mm(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def compile_train_step(model: Any, batch: dict) -> tuple[Any, Any, Any, dict, float]:
    """One step (forward, backward, optax Adafactor at 1e-3) under one ``jax.jit``, compiled.

    Returns:
      ``(compiled, params, opt_state, device batch, compile seconds)``; ``compiled(params,
      opt_state, batch)`` returns ``(params, opt_state, loss)`` and donates the first two.
    """
    params = model.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in batch.items()})[
        "params"
    ]
    opt = optax.adafactor(learning_rate=1e-3)
    opt_state = opt.init(params)

    def train_step(params, opt_state, batch):
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, None)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    start = time.perf_counter()
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, opt_state, batch).compile()
    return compiled, params, opt_state, batch, time.perf_counter() - start
