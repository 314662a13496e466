"""Turning a step folder's leaves into a state dict: renames, checks, casts, placement."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t5x.checkpointing import _reader, _tree
from t5x.checkpointing._errors import CheckpointIntegrityError

AssignmentMap = Sequence[tuple[str, str | None]]


def as_state_dict(tree: Any, what: str) -> Any:
    """``tree`` as a T5X state dict: a mapping as it is, a train state object by its ``state_dict()``.

    A train state object (``t5x.training.TrainState``, its abstract shapes from
    ``jax.eval_shape`` or its tree of shardings) is not a mapping, so flattening
    it would give one leaf with an empty name; its ``state_dict()`` gives the
    layout the checkpoint is stored in.

    Raises:
      TypeError: neither a mapping nor an object with ``state_dict()`` (names the type).
    """
    if tree is None or isinstance(tree, Mapping):
        return tree
    method = getattr(tree, "state_dict", None)
    state_dict = method() if callable(method) else None
    if isinstance(state_dict, Mapping):
        return state_dict
    raise TypeError(
        f"{what} must be a T5X state dict ({{'target': params, 'state': {{'step', 'param_states'}}}}) or a "
        f"train state with a state_dict() method (e.g. init_train_state(...).state, .shapes or "
        f".shardings), got {type(tree).__name__}"
    )


def _concrete(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(*s.indices(n)) for s, n in zip(index, shape))


def _mapped_name(name: str, assignment_map: AssignmentMap) -> str | None:
    """The checkpoint key for a model key: the first matching rule wins."""
    for pattern, replacement in assignment_map:
        if re.fullmatch(pattern, name):
            return None if replacement is None else re.sub(pattern, replacement, name)
    return name


def _dtype_of(value: Any) -> np.dtype | None:
    dtype = getattr(value, "dtype", None)
    return None if dtype is None else np.dtype(jnp.dtype(dtype))


def _check_fit(name: str, source: Any, want: Any, step_dir: str) -> np.dtype | None:
    """Checks ``source`` against the target leaf ``want``; returns the dtype to read as."""
    want_shape = getattr(want, "shape", None)
    if want_shape is not None and tuple(want_shape) != tuple(source.shape):
        raise ValueError(
            f"shape mismatch for {name} in {step_dir}: the target expects {tuple(want_shape)}, "
            f"the checkpoint has {tuple(source.shape)}"
        )
    want_dtype = _dtype_of(want)
    if want_dtype is None:
        return None
    have = source.dtype
    floats = jax.dtypes.issubdtype(have, np.floating) and jax.dtypes.issubdtype(want_dtype, np.floating)
    if have != want_dtype and not floats and not (have.kind in "iub" and want_dtype.kind in "iub"):
        raise ValueError(
            f"dtype mismatch for {name} in {step_dir}: the target expects {want_dtype}, the checkpoint has {have}"
        )
    return want_dtype


def select(
    sources: Mapping[_tree.Path, Any],
    step_dir: str,
    target: Any = None,
    *,
    params_only: bool = False,
    assignment_map: AssignmentMap = (),
    fallback_to_target: bool = False,
    restore_dtype: Any = None,
) -> dict[_tree.Path, Any]:
    """Decides, per leaf of the result, where its value comes from.

    Args:
      sources: the checkpoint's leaves (from ``_reader.read_sources``).
      step_dir: the folder, for error messages.
      target: optional state dict giving the wanted structure, shapes and dtypes.
      params_only: take only ``target`` (parameters) from the checkpoint; every
        other leaf comes from ``target`` (a fresh optimizer state).
      assignment_map: ``(regex, replacement)`` rules applied to the model's
        slash-joined key (``target/encoder/...``); the first full match gives the
        checkpoint key via ``re.sub``; a ``None`` replacement drops the key (its
        value then comes from ``target``).
      fallback_to_target: leaves the checkpoint lacks take ``target``'s value.
      restore_dtype: cast floating ``target`` (parameter) leaves to this dtype.

    Returns:
      ``{path: LazyArray or concrete value}``.

    Raises:
      KeyError: the checkpoint lacks a leaf and there is no fallback (names it).
      ValueError: a shape or dtype does not fit (names parameter and values).
    """
    cast = None if restore_dtype is None else np.dtype(jnp.dtype(restore_dtype))
    by_name = {_tree.slash_name(path): value for path, value in sources.items()}
    wanted = _tree.flatten(target) if target is not None else dict(sources)
    chosen: dict[_tree.Path, Any] = {}
    for path, want in wanted.items():
        name = _tree.slash_name(path)
        own = target is not None
        if own and isinstance(want, Mapping) and not want:  # an empty slot has nothing to read
            chosen[path] = {}
            continue
        if params_only and path[0] != "target":
            if own:
                chosen[path] = want
            continue
        key = _mapped_name(name, assignment_map) if own else name
        source = by_name.get(key) if key is not None else None
        if source is None:
            if own and (key is None or fallback_to_target):
                if isinstance(want, jax.ShapeDtypeStruct):
                    raise ValueError(
                        f"{name} is not in {step_dir} and its target has no value to fall back to"
                    )
                chosen[path] = want
                continue
            newest = f" (checkpoint key {key!r})" if key != name else ""
            raise KeyError(
                f"{step_dir} has no parameter {name}{newest}; pass fallback_to_target=True to keep the initial value"
            )
        if not isinstance(source, _reader.LazyArray):
            chosen[path] = source
            continue
        dtype = _check_fit(name, source, want, step_dir) if own else None
        if (
            cast is not None
            and path[0] == "target"
            and jax.dtypes.issubdtype(dtype or source.dtype, np.floating)
        ):
            dtype = cast
        chosen[path] = source.astype(dtype) if dtype is not None and dtype != source.dtype else source
    return chosen


def _bounding_box(indices: Sequence[tuple[slice, ...]], shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(
        slice(min(index[d].start for index in indices), max(index[d].stop for index in indices))
        for d in range(len(shape))
    )


def _open_together(sources: Iterable[Any]) -> None:
    """Opens every lazy leaf's TensorStore at once: one open after another waits on each in turn."""
    opening = [(s, s.open_future()) for s in sources if isinstance(s, _reader.LazyArray)]
    for source, future in opening:
        if future is None:
            continue
        try:
            source.set_store(future.result())
        except Exception as error:
            raise source.failure("open", error) from error


def _place(leaves: dict[_tree.Path, Any], shardings: Mapping[_tree.Path, Any]) -> dict[_tree.Path, Any]:
    """Reads each leaf straight into the device shards its sharding asks for.

    A leaf whose chunks are verified is read once, as the chunk-aligned box
    around all of this process's shards (every chunk read and checked once,
    however many devices share it), and the shards are cut from that.
    """
    _open_together(source for path, source in leaves.items() if path in shardings)
    plans: list[tuple[_tree.Path, Any, Any, Any]] = []
    for path, source in leaves.items():
        sharding = shardings.get(path)
        if sharding is None:
            continue
        if not isinstance(source, _reader.LazyArray):
            plans.append((path, sharding, None, {}))
            continue
        indices = sharding.addressable_devices_indices_map(source.shape)
        futures: dict[tuple[tuple[int, int, int], ...], Any] = {}
        per_device = {}
        concretes = {device: _concrete(index, source.shape) for device, index in indices.items()}
        box, whole = None, None
        shards = list(concretes.values())
        # Several distinct shards of a verified leaf: read their chunk-aligned bounding box once.
        # One shard (or copies of it) needs no box: its read covers (and checks) whole chunks itself.
        if (
            source.verifies_chunks
            and len(shards) > 1
            and any(index != shards[0] for index in shards)
            and all(s.step == 1 for index in shards for s in index)
        ):
            box = _bounding_box(shards, source.shape)
            whole = source.read_future(box)
        for device, concrete in concretes.items():
            key = tuple((s.start, s.stop, s.step) for s in concrete)
            if box is None and key not in futures:
                futures[key] = source.read_future(concrete)
            per_device[device] = key
        plans.append((path, sharding, source, (futures, per_device, box, whole)))
    placed = dict(leaves)
    for path, sharding, source, work in plans:
        if source is None:
            placed[path] = jax.device_put(np.asarray(leaves[path]), sharding)
            continue
        futures, per_device, box, whole = work
        try:
            if box is None:
                host = {key: source.finish(future.result()) for key, future in futures.items()}
            else:
                data = whole.result()
                host = {}
                for key in per_device.values():
                    if key in host:
                        continue
                    if all((a, z) == (b.start, b.stop) for (a, z, _), b in zip(key, box)):
                        host[key] = source.finish(data)  # the whole box: no view (device_put may alias it)
                    else:
                        inner = tuple(slice(a - b.start, z - b.start) for (a, z, _), b in zip(key, box))
                        host[key] = source.finish(data[inner])
        except CheckpointIntegrityError:
            raise
        except Exception as error:
            raise source.failure("read", error) from error
        arrays = [jax.device_put(host[key], device) for device, key in per_device.items()]
        placed[path] = jax.make_array_from_single_device_arrays(source.shape, sharding, arrays)
    return placed


def materialize(leaves: dict[_tree.Path, Any], shardings: Any = None, lazy: bool = False) -> dict[str, Any]:
    """Reads the chosen leaves (unless ``lazy``) and rebuilds the nested dict.

    Args:
      leaves: from :func:`select`.
      shardings: optional tree like the state of ``jax.sharding.Sharding``s.
      lazy: leave checkpoint leaves as :class:`LazyArray` objects.

    Returns:
      The nested state dict.
    """
    if lazy:
        return _tree.unflatten(leaves)
    flat_shardings = {}
    if shardings is not None:
        flat_shardings = _tree.flatten(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    out = _place(leaves, flat_shardings) if flat_shardings else dict(leaves)
    pending = [p for p, v in out.items() if isinstance(v, _reader.LazyArray)]
    for path, value in zip(pending, _reader.read_all([out[p] for p in pending])):
        out[path] = value
    return _tree.unflatten(out)
