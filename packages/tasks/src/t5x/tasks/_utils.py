"""Seeds for random preprocessors, keyword plumbing and name suggestions."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from t5x.tasks._lazy_tf import AUTOTUNE, tf

# The seed scope a preprocessor runs in: a base seed tensor ([2] int64) and a
# counter of map_over_dataset calls made so far inside the scope. A stack keeps
# nested scopes (a mixture building its tasks) independent.
_SEED_SCOPES: list[list[Any]] = []


@contextlib.contextmanager
def preprocessor_seed_scope(seed: Any) -> Iterator[None]:
    """Makes random ``map_over_dataset`` calls draw seeds derived from ``seed``.

    Inside the scope the k-th random ``map_over_dataset`` call gives example n
    the seeds ``stateless_split(fold_in(fold_in(seed, k), n))``, so every random
    draw depends only on (seed, call, example position) and never on timing.

    Args:
      seed: an int, an int64 tensor of shape [2], or None (fresh random seed).
    """
    _SEED_SCOPES.append([as_seed_tensor(seed), 0])
    try:
        yield
    finally:
        _SEED_SCOPES.pop()


def as_seed_tensor(seed: Any) -> tf.Tensor:
    """Returns ``seed`` as an int64 tensor of shape [2] (None draws a random one)."""
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1, np.uint32)[0])
    if isinstance(seed, (int, np.integer)):
        return tf.constant([0, int(seed)], dtype=tf.int64)
    seed = tf.cast(seed, tf.int64)
    if seed.shape.rank == 0:
        return tf.stack([tf.constant(0, tf.int64), seed])
    return seed


def fold_seed(seed: tf.Tensor, *data: Any) -> tf.Tensor:
    """Derives a new [2] int64 seed from ``seed`` and integers (tensors or ints)."""
    for value in data:
        seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(value, tf.int64))
    return tf.cast(seed, tf.int64)


def _next_scope_seed() -> tf.Tensor:
    if not _SEED_SCOPES:
        return as_seed_tensor(None)
    scope = _SEED_SCOPES[-1]
    seed = fold_seed(scope[0], scope[1])
    scope[1] += 1
    return seed


def map_over_dataset(
    fn: Callable[..., Any] | None = None, *, num_seeds: int | None = None, num_parallel_calls: int = AUTOTUNE
) -> Any:
    """Turns a per-example function into a dataset transformation (seqio style).

    With ``num_seeds=1`` the function receives ``seed=`` (an int64 [2] tensor);
    with ``num_seeds>1`` it receives ``seeds=`` (an int64 [num_seeds, 2] tensor).
    Seeds come from the enclosing :func:`preprocessor_seed_scope`.

    Args:
      fn: ``fn(example, *args, **kwargs) -> example``.
      num_seeds: how many stateless seeds each example gets, or None for none.
      num_parallel_calls: passed to ``Dataset.map``.

    Returns:
      ``transform(ds, *args, **kwargs) -> ds`` (or a decorator if ``fn`` is None).
    """

    def decorate(inner: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(inner)
        def transform(ds: tf.data.Dataset, *args: Any, **kwargs: Any) -> tf.data.Dataset:
            if num_seeds is None:
                return ds.map(lambda x: inner(x, *args, **kwargs), num_parallel_calls=num_parallel_calls)
            base = _next_scope_seed()

            def with_seeds(index: tf.Tensor, x: Any) -> Any:
                seeds = tf.random.experimental.stateless_split(fold_seed(base, index), num_seeds)
                seeds = tf.cast(seeds, tf.int64)
                if num_seeds == 1:
                    return inner(x, *args, seed=seeds[0], **kwargs)
                return inner(x, *args, seeds=seeds, **kwargs)

            return ds.enumerate().map(with_seeds, num_parallel_calls=num_parallel_calls)

        return transform

    return decorate if fn is None else decorate(fn)


def stateless_shuffle(value: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Permutes the elements of ``value`` at random, given a stateless seed."""
    flat = tf.reshape(value, [-1])
    order = tf.argsort(tf.random.stateless_uniform(tf.shape(flat), seed=seed))
    return tf.reshape(tf.gather(flat, order), tf.shape(value))


def accepted_kwargs(fn: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    """Returns the subset of ``kwargs`` that ``fn`` names as parameters."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in kwargs.items() if k in params}


def function_name(fn: Any) -> str:
    """A readable name for a preprocessor (functions, partials, callables)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__
