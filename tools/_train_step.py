"""Pieces the train-step benchmarks share: the matmul peak and one compiled optax train step."""

from __future__ import annotations

import collections
import statistics
import string
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.extend import core as jax_core


def matmul_peak(n: int, dtype: Any) -> float:
    """FLOP/s of a jitted ``n``^3 matmul of ``dtype`` operands accumulated in float32 (median of 5)."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    mm = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    return 2 * n**3 / median_seconds(lambda: mm(a, b).block_until_ready(), 5)


def median_seconds(fn: Any, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn``, after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_products(fn: Any, *args: Any) -> list[dict]:
    """Every matrix product ``fn(*args)`` performs, from its jaxpr, grouped by shape.

    Products inside a ``scan`` count once per iteration. Each entry has ``lhs``, ``rhs``
    (shapes), ``dtype``, ``rhs_dtype``, ``dims`` (``lax.dot_general`` dimension numbers),
    ``einsum`` (the same product as an einsum, for other frameworks), ``flops`` (per
    product) and ``count``.
    """
    counts: collections.Counter = collections.Counter()

    def walk(jaxpr: Any, times: int) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                lhs, rhs = (v.aval for v in eqn.invars)
                key = (lhs.shape, rhs.shape, str(lhs.dtype), str(rhs.dtype), eqn.params["dimension_numbers"])
                counts[key] += times
            inner = times * eqn.params.get("length", 1) if eqn.primitive.name == "scan" else times
            for param in eqn.params.values():
                for sub in param if isinstance(param, (list, tuple)) else [param]:
                    if isinstance(sub, jax_core.ClosedJaxpr):
                        walk(sub.jaxpr, inner)
                    elif isinstance(sub, jax_core.Jaxpr):
                        walk(sub, inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr, 1)
    products = []
    for (lhs, rhs, lhs_dtype, rhs_dtype, dims), count in counts.items():
        (_, rhs_contract), (_, rhs_batch) = dims
        rhs_free = [size for j, size in enumerate(rhs) if j not in rhs_contract and j not in rhs_batch]
        products.append({"lhs": list(lhs), "rhs": list(rhs), "dtype": lhs_dtype, "rhs_dtype": rhs_dtype,
                         "dims": dims, "einsum": _einsum_spec(len(lhs), len(rhs), dims),
                         "flops": 2 * int(np.prod(lhs)) * int(np.prod(rhs_free)), "count": count})  # fmt: skip
    return sorted(products, key=lambda p: -p["flops"] * p["count"])


def _einsum_spec(lhs_ndim: int, rhs_ndim: int, dims: Any) -> str:
    """``lax.dot_general`` dimension numbers as an einsum (batch, lhs free, rhs free order)."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dims
    letters = iter(string.ascii_letters)
    lhs = [""] * lhs_ndim
    rhs = [""] * rhs_ndim
    for i, j in zip(lhs_batch, rhs_batch, strict=True):
        lhs[i] = rhs[j] = next(letters)
    for i, j in zip(lhs_contract, rhs_contract, strict=True):
        lhs[i] = rhs[j] = next(letters)
    for axes in (lhs, rhs):
        for i, name in enumerate(axes):
            if not name:
                axes[i] = next(letters)
    out = [lhs[i] for i in lhs_batch]
    out += [lhs[i] for i in range(lhs_ndim) if i not in lhs_batch and i not in lhs_contract]
    out += [rhs[j] for j in range(rhs_ndim) if j not in rhs_batch and j not in rhs_contract]
    return f"{''.join(lhs)},{''.join(rhs)}->{''.join(out)}"


def time_product(product: dict, repeats: int = 3) -> float:
    """Seconds XLA takes for one ``product`` (from :func:`step_products`) jitted alone, median."""
    lhs = jax.random.normal(jax.random.PRNGKey(0), product["lhs"], product["dtype"])
    rhs = jax.random.normal(jax.random.PRNGKey(1), product["rhs"], product["rhs_dtype"])
    product_fn = jax.jit(
        lambda a, b: jax.lax.dot_general(a, b, product["dims"], preferred_element_type=jnp.float32)
    )
    return median_seconds(lambda: product_fn(lhs, rhs).block_until_ready(), repeats)


def _train_step_fn(model: Any, opt: Any) -> Any:
    def train_step(params, opt_state, batch):
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, None)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def _initial_state(model: Any, batch: dict) -> tuple[Any, Any, Any]:
    params = model.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in batch.items()})[
        "params"
    ]
    opt = optax.adafactor(learning_rate=1e-3)
    return params, opt, opt.init(params)


def compile_train_step(model: Any, batch: dict) -> tuple[Any, Any, Any, dict, float]:
    """One step (forward, backward, optax Adafactor at 1e-3) under one ``jax.jit``, compiled.

    Returns:
      ``(compiled, params, opt_state, device batch, compile seconds)``; ``compiled(params,
      opt_state, batch)`` returns ``(params, opt_state, loss)`` and donates the first two.
    """
    params, opt, opt_state = _initial_state(model, batch)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    start = time.perf_counter()
    compiled = (
        jax.jit(_train_step_fn(model, opt), donate_argnums=(0, 1)).lower(params, opt_state, batch).compile()
    )
    return compiled, params, opt_state, batch, time.perf_counter() - start


def train_step_products(model: Any, batch: dict) -> list[dict]:
    """:func:`step_products` of the step :func:`compile_train_step` compiles."""
    params, opt, opt_state = _initial_state(model, batch)
    return step_products(_train_step_fn(model, opt), params, opt_state, batch)
