"""Argument checks shared by the decoders."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t5x.decoding._state import PyTree


def concrete(value: Any) -> np.ndarray | None:
    """Returns ``value`` as a numpy array, or None when it is only known under tracing."""
    if value is None:
        return None
    if isinstance(value, jax.core.Tracer):
        return None
    try:
        return np.asarray(value)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError, TypeError):
        return None


def check_num_decodes(num_decodes: Any, name: str = "num_decodes") -> int:
    if isinstance(num_decodes, bool) or not isinstance(num_decodes, int | np.integer):
        raise TypeError(f"{name} must be a Python int, got {num_decodes!r} ({type(num_decodes).__name__})")
    if num_decodes < 1:
        raise ValueError(f"{name} must be >= 1, got {name}={num_decodes}")
    return int(num_decodes)


def check_inputs(inputs: Any) -> jax.Array:
    """Checks ``[batch, length]`` token ids and returns them as int32.

    Float arrays are accepted when every value is a whole number (``np.zeros`` makes floats,
    and upstream t5x takes them); a fractional value is a mistake and is refused.
    """
    if np.ndim(inputs) != 2:
        raise ValueError(f"inputs must be [batch, length] token ids, got shape {tuple(np.shape(inputs))}")
    dtype = inputs.dtype if hasattr(inputs, "dtype") else np.asarray(inputs).dtype
    if np.issubdtype(dtype, np.floating):
        values = concrete(inputs)
        if values is not None:
            fractional = values != np.round(values)
            if fractional.any():
                row, col = (int(i) for i in np.argwhere(fractional)[0])
                raise TypeError(
                    f"inputs must hold integer token ids, got {float(values[row, col])} at inputs[{row}, {col}]"
                    f" (dtype {dtype})"
                )
    elif not np.issubdtype(dtype, np.integer):
        raise TypeError(f"inputs must hold integer token ids, got dtype {dtype}")
    return jnp.asarray(inputs, jnp.int32)


def check_per_example(name: str, value: Any, batch: int) -> None:
    """A parameter may be a scalar or one value per example."""
    shape = tuple(np.shape(value))
    if shape not in ((), (batch,)):
        raise ValueError(f"{name} must be a scalar or [batch]=({batch},), got shape {shape}")


def check_initial_index(initial_index: Any, batch: int, length: int) -> None:
    shape = tuple(np.shape(initial_index))
    if shape != (batch,):
        raise ValueError(f"initial_index must have shape [batch]=({batch},), got {shape}")
    values = concrete(initial_index)
    if values is None:
        return
    bad = (values < 0) | (values >= length)
    if bad.any():
        example = int(np.argmax(bad))
        raise ValueError(
            f"initial_index[{example}]={int(values[example])} leaves no room to decode: the prompt is"
            f" longer than the decode length; it must be in [0, {length - 1}] for decode length {length}"
        )


def check_logits(logits: Any, rows: int, who: str) -> None:
    if np.ndim(logits) != 2 or np.shape(logits)[0] != rows:
        raise ValueError(
            f"tokens_to_logits must return logits of shape [rows, vocab] with rows={rows} in {who},"
            f" got shape {tuple(np.shape(logits))}"
        )


def same_structure(new_cache: PyTree, old_cache: PyTree) -> PyTree:
    """Gives the cache returned by the model the container types of the loop's cache.

    Models often hand back a plain dict for a cache that went in as a flax ``FrozenDict``;
    a while loop needs identical structures on both sides.
    """
    old_def: Any = jax.tree_util.tree_structure(old_cache)
    new_leaves, new_def = jax.tree_util.tree_flatten(new_cache)
    if new_def == old_def:
        return new_cache
    if len(new_leaves) == old_def.num_leaves:
        rebuilt = jax.tree_util.tree_unflatten(old_def, new_leaves)
        # Only accept the rebuild when it is the same tree up to container types.
        if [p for p, _ in jax.tree_util.tree_leaves_with_path(rebuilt)] == [
            p for p, _ in jax.tree_util.tree_leaves_with_path(new_cache)
        ]:
            return rebuilt
    raise ValueError(
        "tokens_to_logits returned a cache whose structure differs from the one it was given:"
        f" expected {old_def}, got {new_def}"
    )
