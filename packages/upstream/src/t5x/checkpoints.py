"""Upstream t5x's ``t5x.checkpoints`` API over t5x.checkpointing.

``Checkpointer(train_state, partitioner, checkpoints_dir, ...)`` saves and
restores upstream train state objects (anything with ``state_dict()`` and
``restore_state()``, e.g. ``t5x.train_state.FlaxOptimTrainState``) in upstream's
layout: ``checkpoints_dir/checkpoint_<step>/checkpoint`` (msgpack index) plus
TensorStore zarr arrays, written with gzip as upstream does, with this
project's checksum manifest beside them.

Two protocols, chosen by the partitioner:

* a ``t5x.partitioning.BasePartitioner`` with ``use_gda=False`` (upstream's
  host-local protocol): the train state holds each process's numpy chunk of
  every partitioned array (``partitioner.get_local_chunk_info``); each process
  writes its chunks, process 0 writes the index and renames the step folder,
  and ``restore`` returns each process's chunks of the restoring mesh;
* anything else (e.g. ``t5x.partitioning.PjitPartitioner``): the leaves are
  whole (or global ``jax.Array``) values, saved and restored whole by
  ``t5x.checkpointing.Checkpointer``.

``SaveBestCheckpointer`` and ``CheckpointManager`` remain names gin binds.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import numpy as np
import tensorstore as ts
from flax import serialization, traverse_util
from jax.experimental import multihost_utils

from t5x import checkpointing, partitioning
from t5x.checkpointing import LazyArray

# The index format version upstream writes and this package reads.
VERSION = 3
_STEP_DIR = re.compile(r"^checkpoint_(\d+)$")
_INDEX = "checkpoint"
# TensorFlow names its checkpoint state file "checkpoint" too; its text starts so.
_TF_CHECKPOINT_STATE = b"model_checkpoint_path"

StateTransformation = Callable[..., Mapping[str, Any]]


def all_steps(checkpoints_dir: str) -> list[int]:
    """The steps under ``checkpoints_dir`` whose ``checkpoint`` index exists, ascending.

    Temporary folders (``checkpoint_<step>.tmp-...``) and step folders without
    an index file are not steps.
    """
    checkpoints_dir = os.fspath(checkpoints_dir)
    try:
        names = os.listdir(checkpoints_dir)
    except FileNotFoundError:
        return []
    steps = []
    for name in names:
        match = _STEP_DIR.match(name)
        if match and os.path.isfile(os.path.join(checkpoints_dir, name, _INDEX)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_step(checkpoints_dir: str) -> int | None:
    """The newest step under ``checkpoints_dir``, or None when there is none."""
    steps = all_steps(checkpoints_dir)
    return steps[-1] if steps else None


def get_checkpoint_dir(checkpoints_dir: str, step: int) -> str:
    """``checkpoints_dir/checkpoint_<step>`` (whether or not it exists)."""
    return os.path.join(os.fspath(checkpoints_dir), f"checkpoint_{int(step)}")


def find_checkpoint(path: str, step: int | None = None) -> str:
    """The ``checkpoint`` index file that ``path`` (and ``step``) mean.

    Args:
      path: the index file itself (``step`` is then ignored), a step folder
        (``step`` must then be None), or a folder of step folders (``step``,
        or the latest one when None).
      step: the step to pick from a folder of step folders.

    Raises:
      ValueError: nothing at ``path`` is a checkpoint, or ``step`` is given for
        a step folder, or the folder has no such step.
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    index = os.path.join(path, _INDEX)
    if os.path.isfile(index):
        if step is not None:
            raise ValueError(f"{path} is a step folder; step must be None, got {step}")
        return index
    if os.path.isdir(path):
        steps = all_steps(path)
        if step is None:
            if not steps:
                raise ValueError(f"Path is not a valid T5X checkpoint: no checkpoint_<step> folder in {path}")
            step = steps[-1]
        index = os.path.join(get_checkpoint_dir(path, step), _INDEX)
        if not os.path.isfile(index):
            raise ValueError(f"No checkpoint for step {step} in {path}; steps there: {steps}")
        return index
    raise ValueError(f"Path is not a valid T5X checkpoint: {path} does not exist")


# Upstream's chunk target: 64 MiB of elements of the stored dtype.
_DESIRED_CHUNK_BYTES = 64 * 1024 * 1024


def _choose_chunk_shape(write_shape: Sequence[int], target_elements: int) -> list[int]:
    """The largest chunk of at most ``target_elements`` that evenly tiles ``write_shape``."""
    return checkpointing.choose_chunk_shape(write_shape, 1, int(target_elements))


def load_t5x_checkpoint(
    path: str,
    step: int | None = None,
    state_transformation_fns: Sequence[StateTransformation] = (),
    remap: bool = True,
    restore_dtype: Any = None,
    lazy_parameters: bool = False,
    use_gda: bool = True,
) -> dict[str, Any]:
    """A checkpoint's whole state dict, without a train state (upstream's keywords).

    ``state_transformation_fns`` are applied in turn as ``fn(state_dict, {})``;
    ``lazy_parameters`` gives ``LazyArray`` leaves (``.get()`` reads one);
    ``remap`` and ``use_gda`` are accepted for upstream's signature.
    """
    del remap, use_gda
    state = checkpointing.load_t5x_checkpoint(path, step, restore_dtype, lazy=lazy_parameters)
    try:
        index = find_checkpoint(path, step)
    except ValueError:  # another layout (Orbax): no msgpack index to read unused slots from
        index = None
    if index is not None:
        state = _with_unused_slots(state, index)
    for fn in state_transformation_fns:
        state = dict(fn(state, {}))
    return state


def _with_unused_slots(state: dict[str, Any], index: str) -> dict[str, Any]:
    """``state`` with the None leaves of the index (unused optimizer slots) put back, as upstream returns them."""
    with open(index, "rb") as handle:
        contents = serialization.msgpack_restore(handle.read())
    tree = contents.get("optimizer", contents) if "version" in contents else contents
    unused = [path for path, value in _flat(tree).items() if value is None]
    if not unused:
        return state
    flat = _flat(state)
    flat.update(dict.fromkeys(unused))
    return traverse_util.unflatten_dict(flat)


def _cast_params(tree: Any, dtype: Any) -> Any:
    def cast(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray | jax.Array) and jax.dtypes.issubdtype(leaf.dtype, np.inexact):
            return np.asarray(leaf).astype(dtype)
        return leaf

    return jax.tree.map(cast, tree)


def _check_shapes(restored: Mapping[str, Any], wanted: Mapping[str, Any], prefix: str = "") -> None:
    for key, value in wanted.items():
        name = f"{prefix}{key}"
        if key not in restored:
            continue
        got = restored[key]
        if isinstance(value, Mapping):
            if isinstance(got, Mapping):
                _check_shapes(got, value, name + "/")
            continue
        want_shape = getattr(value, "shape", None)
        got_shape = getattr(got, "shape", None)
        if want_shape is not None and got_shape is not None and tuple(got_shape) != tuple(want_shape):
            raise ValueError(
                f"Shape of `{name}` in checkpoint {tuple(got_shape)} does not match expected {tuple(want_shape)}."
            )


def _merge_fallback(
    restored: Mapping[str, Any], wanted: Mapping[str, Any], fallback: Any, prefix: str = ""
) -> Any:
    merged: dict[str, Any] = {}
    for key, value in wanted.items():
        name = f"{prefix}{key}"
        sub_fallback = fallback.get(key) if isinstance(fallback, Mapping) else None
        if isinstance(value, Mapping):
            got = restored.get(key, {})
            merged[key] = _merge_fallback(
                got if isinstance(got, Mapping) else {}, value, sub_fallback, name + "/"
            )
        elif value is None:  # a slot the train state does not use (e.g. another optimizer's)
            merged[key] = None
        elif key in restored:
            merged[key] = restored[key]
        elif isinstance(fallback, Mapping) and key in fallback:
            merged[key] = fallback[key]
        else:
            raise ValueError(f"`{name}` is not in the checkpoint and fallback_state has no value for it")
    return merged


def _flat(state_dict: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    return traverse_util.flatten_dict(state_dict, keep_empty_nodes=True)


@dataclasses.dataclass(frozen=True)
class _ParameterInfo:
    """How one leaf of a train state is stored (upstream's record).

    Attributes:
      name: the leaf's slash-separated state path, e.g. ``target/encoder/kernel``.
      shape: its global shape.
      ts_spec: its TensorStore array (relative path), or None when it is stored
        inline in the index (leaves without mesh axes).
      local_chunk_info: this process's part of it (None when not partitioned).
      axes: its mesh axes (None: not partitioned).
    """

    name: str
    shape: tuple[int, ...]
    ts_spec: ts.Spec | None
    local_chunk_info: partitioning.LocalChunkInfo | None
    axes: Any = None


class _LazyChunk:
    """A part of a checkpoint array read on ``get()`` (verified against the step's checksums)."""

    def __init__(self, source: LazyArray, index: tuple[slice, ...] | None, dtype: Any):
        self._source = source
        self._index = index
        self.dtype = np.dtype(dtype)
        whole = source.shape
        self.shape = (
            whole if index is None else tuple(len(range(*s.indices(n))) for s, n in zip(index, whole))
        )

    def get(self) -> np.ndarray:
        raw = self._source.read_future(self._index).result()
        return np.asarray(raw).astype(self.dtype, copy=False)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self.get()
        return value if dtype is None else value.astype(dtype)


def _even_split_problem(name: str, shape: Sequence[int], axes: Any, chunker: Any) -> str | None:
    """Why ``shape`` does not split evenly over ``axes`` (None when it does)."""
    counts = getattr(chunker, "num_chunks", {})
    for size, entry in zip(shape, tuple(axes)):
        if entry is None:
            continue
        count = int(np.prod([counts.get(a, 1) for a in ((entry,) if isinstance(entry, str) else entry)]))
        if size % count:
            return (
                f"`{name}`: dimension of size {size} does not split into {count} process chunks over {entry}"
            )
    return None


class Checkpointer:
    """Saves and restores an upstream train state under ``checkpoints_dir``.

    Args:
      train_state: a train state with ``state_dict()`` / ``restore_state()``,
        holding global shapes (abstract or real values); its structure, shapes
        and dtypes are what ``restore`` returns.
      partitioner: a ``t5x.partitioning.BasePartitioner`` (host-local protocol
        when ``use_gda`` is False, see the module docstring) or any partitioner.
      checkpoints_dir: the folder of ``checkpoint_<step>`` folders.
      dataset_iterator: a ``tf.data`` iterator saved beside each step as
        ``train_ds-<shard>-of-<shards>`` (a ``tf.train.Checkpoint``, written by
        the first process of each data shard) and restored with it; None skips it.
      save_dtype: floating parameters are written as this dtype.
      restore_dtype: parameters are returned as this dtype (None: as stored).
      keep: keep this many newest steps (None keeps all; pinned ones stay).
      keep_dataset_checkpoints: keep the dataset files of only this many
        newest steps (None keeps all).
      use_gda: False selects the host-local protocol for a ``BasePartitioner``.
    """

    def __init__(
        self,
        train_state: Any,
        partitioner: Any,
        checkpoints_dir: str,
        dataset_iterator: Any = None,
        *,
        keep: int | None = None,
        save_dtype: Any = np.float32,
        restore_dtype: Any = None,
        keep_dataset_checkpoints: int | None = None,
        use_gda: bool = False,
    ) -> None:
        if not hasattr(train_state, "state_dict") or not hasattr(train_state, "restore_state"):
            raise TypeError(
                "train_state must have state_dict() and restore_state() (an upstream train state), "
                f"got {type(train_state).__name__}"
            )
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be None or >= 1, got {keep}")
        if keep_dataset_checkpoints is not None and keep_dataset_checkpoints < 1:
            raise ValueError(f"keep_dataset_checkpoints must be None or >= 1, got {keep_dataset_checkpoints}")
        self._train_state = train_state
        self._partitioner = partitioner
        self.checkpoints_dir = os.fspath(checkpoints_dir)
        self._dataset_iterator = dataset_iterator
        self.keep = keep
        self.keep_dataset_checkpoints = keep_dataset_checkpoints
        self.save_dtype = save_dtype
        self.restore_dtype = restore_dtype
        self.use_gda = use_gda
        self._host_local = isinstance(partitioner, partitioning.BasePartitioner) and not use_gda

    # ---- listing ---------------------------------------------------------
    def all_steps(self) -> list[int]:
        """The complete steps, ascending."""
        return all_steps(self.checkpoints_dir)

    def latest_step(self) -> int | None:
        """The newest complete step, or None."""
        return latest_step(self.checkpoints_dir)

    def all_dataset_checkpoint_steps(self) -> list[int]:
        """The complete steps that also hold dataset iterator files, ascending."""
        return [step for step in self.all_steps() if self._dataset_files(step)]

    def _dataset_name(self) -> tuple[str, bool]:
        """This process's dataset checkpoint name and whether it writes it (first of its data shard)."""
        layout = getattr(self._partitioner, "get_data_layout", None)
        if layout is None:
            index, count, first = jax.process_index(), jax.process_count(), True
        else:
            data = layout()
            index, count, first = data.shard_id, data.num_shards, data.is_first_host_in_replica_set
        return f"train_ds-{index:03}-of-{count:03}", first

    def _write_dataset(self, step_dir: str) -> None:
        if self._dataset_iterator is None:
            return
        name, writes = self._dataset_name()
        if writes:
            import tensorflow as tf

            tf.train.Checkpoint(ds=self._dataset_iterator).write(os.path.join(step_dir, name))

    def _dataset_files(self, step: int) -> list[str]:
        return glob.glob(os.path.join(get_checkpoint_dir(self.checkpoints_dir, step), "train_ds-*"))

    # ---- what is stored where (host-local protocol) ----------------------
    def _mesh_axes(self) -> dict[tuple[str, ...], Any]:
        return _flat(self._partitioner.get_mesh_axes(self._train_state).state_dict())

    def _get_parameter_infos(self) -> Any:
        """Per leaf of the train state: a :class:`_ParameterInfo` (None for an unused slot)."""
        axes_of = self._mesh_axes()
        infos = {}
        for path, value in _flat(self._train_state.state_dict()).items():
            infos[path] = None if value is None else self._parameter_info(path, value, axes_of.get(path))
        return traverse_util.unflatten_dict(infos)

    def _parameter_info(self, path: tuple[str, ...], value: Any, axes: Any) -> _ParameterInfo:
        name = "/".join(path)
        shape = tuple(int(n) for n in getattr(value, "shape", ()))
        if axes is None:
            return _ParameterInfo(name, shape, None, None, None)
        chunk = self._partitioner.get_local_chunk_info(shape, axes)
        dtype = np.dtype(getattr(value, "dtype", np.float32))
        if path[0] == "target" and jax.dtypes.issubdtype(dtype, np.floating) and self.save_dtype is not None:
            dtype = np.dtype(self.save_dtype)
        part = [len(range(*s.indices(n))) for s, n in zip(chunk.slice, shape)]
        spec = {
            "driver": "zarr",
            "dtype": jax.numpy.dtype(dtype).name,
            "kvstore": {"driver": "file", "path": ".".join(path)},
            "metadata": {
                "chunks": _choose_chunk_shape(part, _DESIRED_CHUNK_BYTES // dtype.itemsize),
                "compressor": {"id": "gzip"},
                "shape": list(shape),
            },
        }
        return _ParameterInfo(name, shape, ts.Spec(spec), chunk, axes)

    # ---- saving ----------------------------------------------------------
    def save(
        self,
        train_state: Any,
        state_transformation_fns: Sequence[StateTransformation] = (),
        *,
        concurrent_gb: int = 128,
    ) -> None:
        """Writes ``train_state`` as ``checkpoint_<its step>`` and waits for it.

        ``state_transformation_fns`` are applied in turn to the state dict
        (``fn(state_dict)``) before it is written; ``concurrent_gb`` is accepted
        for upstream's signature. A step that already exists is left as it is.
        """
        del concurrent_gb
        state_dict = train_state.state_dict()
        for fn in state_transformation_fns:
            state_dict = fn(state_dict)
        state_dict = jax.tree.map(
            lambda x: x.get() if isinstance(x, LazyArray | _LazyChunk) else x, state_dict
        )
        step = int(np.asarray(state_dict["state"]["step"]))
        if os.path.exists(os.path.join(get_checkpoint_dir(self.checkpoints_dir, step), _INDEX)):
            return
        if self._host_local:
            self._save_host_local(step, state_dict)
        else:
            self._save_whole(step, state_dict)
        if jax.process_index() == 0:
            self._apply_retention()

    def _save_whole(self, step: int, state_dict: Mapping[str, Any]) -> None:
        writer = checkpointing.Checkpointer(
            self.checkpoints_dir, save_dtype=self.save_dtype, compression="gzip", async_save=False
        )
        try:
            writer.save(step, state_dict)
        finally:
            writer.close()
        self._write_dataset(get_checkpoint_dir(self.checkpoints_dir, step))

    def _save_host_local(self, step: int, state_dict: Mapping[str, Any]) -> None:
        axes_of = self._mesh_axes()
        wanted = _flat(self._train_state.state_dict())
        leaves: dict[tuple[str, ...], Any] = {}
        for path, value in _flat(state_dict).items():
            axes = axes_of.get(path)
            if value is None or axes is None or path not in wanted:
                leaves[path] = value
                continue
            name = "/".join(path)
            shape = tuple(int(n) for n in wanted[path].shape)
            problem = _even_split_problem(
                name, shape, axes, getattr(self._partitioner, "_local_chunker", None)
            )
            if problem:
                raise ValueError(problem)
            chunk = self._partitioner.get_local_chunk_info(shape, axes)
            data = np.asarray(value)
            if data.shape == shape and any(s != slice(None) for s in chunk.slice):
                data = data[chunk.slice]  # a whole array given: keep this process's part
            leaves[path] = checkpointing.HostChunk(data, chunk.slice, shape, write=chunk.replica_id == 0)
        stamp = str(int(multihost_utils.broadcast_one_to_all(np.int64(time.time()))))
        checkpointing.save_host_local(
            self.checkpoints_dir,
            step,
            traverse_util.unflatten_dict(leaves),
            process_index=jax.process_index(),
            process_count=len({d.process_index for d in self._partitioner.mesh.devices.flat}),
            stamp=stamp,
            save_dtype=self.save_dtype,
            compression="gzip",
            before_commit=self._write_dataset,
        )

    def _is_pinned(self, step: int) -> bool:
        return os.path.exists(os.path.join(get_checkpoint_dir(self.checkpoints_dir, step), "PINNED"))

    def _steps_to_remove(self) -> list[int]:
        """Unpinned steps beyond the newest ``keep``."""
        if self.keep is None:
            return []
        return [step for step in self.all_steps()[: -self.keep] if not self._is_pinned(step)]

    def _apply_retention(self) -> None:
        remover = checkpointing.Checkpointer(self.checkpoints_dir, async_save=False)
        for old in self._steps_to_remove():
            remover.delete_step(old)
        if self._dataset_iterator is not None and self.keep_dataset_checkpoints is not None:
            with_data = self.all_dataset_checkpoint_steps()
            for old in with_data[: -self.keep_dataset_checkpoints]:
                if not self._is_pinned(old):
                    for name in self._dataset_files(old):
                        os.remove(name)

    # ---- restoring -------------------------------------------------------
    def restore(
        self,
        step: int | None = None,
        path: str | None = None,
        state_transformation_fns: Sequence[StateTransformation] = (),
        fallback_state: Mapping[str, Any] | None = None,
        lazy_parameters: bool = False,
    ) -> Any:
        """Loads a checkpoint into a train state like the constructor's.

        Args:
          step: the step under ``checkpoints_dir`` (the latest when both this
            and ``path`` are None).
          path: a checkpoint elsewhere (see :func:`find_checkpoint`).
          state_transformation_fns: ``fn(checkpoint_state_dict, model_state_dict)``
            each returning the state dict to continue with (e.g.
            ``state_utils.apply_assignment_map``).
          fallback_state: values for keys the (transformed) checkpoint lacks.
          lazy_parameters: leave the arrays unread: leaves with ``get()``.

        Raises:
          ValueError: no checkpoint there, a shape differs from the train
            state's, or a key is in neither the checkpoint nor fallback_state.
        """
        if path is None and step is None and self.latest_step() is None:
            raise ValueError(f"No checkpoint to restore in {self.checkpoints_dir}")
        index = find_checkpoint(self.checkpoints_dir if path is None else path, step)
        with open(index, "rb") as handle:
            if handle.read(len(_TF_CHECKPOINT_STATE)) == _TF_CHECKPOINT_STATE:
                raise ValueError(
                    "Attempting to restore a TensorFlow checkpoint as a native T5X checkpoint. Use "
                    f"`restore_from_tf_checkpoint` instead. Path: {index}"
                )
        step_dir = os.path.dirname(index)
        restored = checkpointing.load_t5x_checkpoint(step_dir, lazy=lazy_parameters or self._host_local)
        wanted = self._train_state.state_dict()
        for fn in state_transformation_fns:
            restored = dict(fn(restored, wanted))
        _check_shapes(restored, wanted)
        merged = _merge_fallback(restored, wanted, fallback_state)
        if self._host_local:
            merged = self._local_parts(merged, lazy_parameters)
        elif not lazy_parameters and self.restore_dtype is not None:
            merged["target"] = _cast_params(merged["target"], self.restore_dtype)
        if not lazy_parameters:
            step_value = merged.get("state", {}).get("step")
            if step_value is not None:
                merged["state"]["step"] = np.asarray(step_value, dtype=np.int32)
        if self._dataset_iterator is not None:
            import tensorflow as tf

            prefix = os.path.join(step_dir, self._dataset_name()[0])
            tf.train.Checkpoint(ds=self._dataset_iterator).read(prefix).assert_consumed()
        train_state = self._train_state.restore_state(merged)
        if self._host_local and not lazy_parameters and self._partitioner.params_on_devices:
            axes = self._partitioner.get_mesh_axes(train_state)
            train_state = self._partitioner.move_params_to_devices(train_state, axes)
        return train_state

    # ---- TensorFlow (Mesh TensorFlow T5) checkpoints ----------------------
    def restore_from_tf_checkpoint(
        self, path_or_dir: str, strict: bool = True, translator: Any = None
    ) -> Any:
        """A train state like the constructor's from a Mesh TensorFlow T5 checkpoint.

        Parameters and Adafactor slots are renamed to T5X's layout; slots the
        checkpoint lacks start at zero, the step comes from ``global_step``.

        Args:
          path_or_dir: a ``model.ckpt-N`` prefix or the folder holding it.
          strict: every parameter of the checkpoint must be one of the train
            state's (and every parameter of the train state must be there).
          translator: only None (the T5 naming) is supported.

        Raises:
          ValueError: a shape differs (``Variable <name> has shape ... != ...``),
            or, with ``strict``, a parameter is missing on either side.
        """
        if translator is not None:
            raise ValueError(
                "restore_from_tf_checkpoint supports the T5 variable names only (translator=None); "
                f"got translator={translator!r}"
            )
        from t5x.models import mtf_to_t5x_state

        found = _flat(mtf_to_t5x_state(checkpointing.read_mtf_checkpoint(path_or_dir)))
        wanted = _flat(self._train_state.state_dict())
        if strict:
            unused = sorted("/".join(p) for p in found if p[0] == "target" and p not in wanted)
            missing = sorted(
                "/".join(p)
                for p, v in wanted.items()
                if p[0] == "target" and v is not None and p not in found
            )
            if unused or missing:
                raise ValueError(
                    f"TensorFlow checkpoint {path_or_dir} does not match the train state: "
                    f"parameters only in the checkpoint {unused}, only in the train state {missing}"
                )
        merged: dict[tuple[str, ...], Any] = {}
        for path, want in wanted.items():
            if want is None:
                merged[path] = None
                continue
            shape, dtype = tuple(getattr(want, "shape", ())), getattr(want, "dtype", np.float32)
            if path in found:
                value = np.asarray(found[path])
                if value.shape != shape:
                    raise ValueError(f"Variable {'/'.join(path)} has shape {value.shape} != {shape}")
                merged[path] = value.astype(dtype)
            else:
                merged[path] = np.zeros(shape, dtype)
        return self._train_state.restore_state(traverse_util.unflatten_dict(merged))

    def convert_from_tf_checkpoint(
        self,
        path_or_dir: str,
        *,
        state_transformation_fns: Sequence[StateTransformation] = (),
        concurrent_gb: int = 16,
        translator: Any = None,
    ) -> None:
        """Restores a Mesh TensorFlow checkpoint (see ``restore_from_tf_checkpoint``) and saves it here."""
        state = self.restore_from_tf_checkpoint(path_or_dir, translator=translator)
        self.save(state, state_transformation_fns, concurrent_gb=concurrent_gb)

    def _local_parts(self, merged: Mapping[str, Any], lazy: bool) -> Any:
        """Each leaf cut to this process's chunk of the restoring mesh, cast, read unless ``lazy``."""
        axes_of = self._mesh_axes()
        out = {}
        for path, value in _flat(merged).items():
            if not isinstance(value, LazyArray):
                out[path] = value
                continue
            axes = axes_of.get(path)
            index = None
            if axes is not None:
                problem = _even_split_problem(
                    "/".join(path), value.shape, axes, getattr(self._partitioner, "_local_chunker", None)
                )
                if problem:
                    raise ValueError(problem)
                index = self._partitioner.get_local_chunk_info(value.shape, axes).slice
            dtype = value.dtype  # as stored, unless parameters are asked for in another dtype
            if path[0] == "target" and self.restore_dtype is not None:
                dtype = np.dtype(self.restore_dtype)
            chunk = _LazyChunk(value, index, dtype)
            out[path] = chunk if lazy else chunk.get()
        return traverse_util.unflatten_dict(out)


class SaveBestCheckpointer(Checkpointer):
    """A ``Checkpointer`` whose ``keep`` keeps the steps with the best metric.

    The metric is read from the TensorBoard event files the trainer writes:
    ``metric_name_to_monitor="train/accuracy"`` means tag ``accuracy`` under
    ``checkpoints_dir/train``. After each save, the newest step, pinned steps
    and (with ``force_keep_period``) steps divisible by it always stay; of the
    others the best ``keep`` by metric stay. Steps without a metric stay too
    when ``keep_checkpoints_without_metrics``, else they go first, oldest first.

    Args:
      metric_name_to_monitor: ``<event folder>/<tag>``.
      metric_mode: ``"max"`` or ``"min"``: which end is best.
      keep_checkpoints_without_metrics: never remove a step without a metric.
      force_keep_period: never remove steps divisible by this.
      (the rest as for ``Checkpointer``)

    ``utils.SaveCheckpointConfig.checkpointer_cls = @checkpoints.SaveBestCheckpointer``
    in gin is read by t5x-upstream's ``train`` into ``t5x.launch.SaveCheckpointConfig``.
    """

    # Upstream's defaults for the keywords gin may bind.
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "metric_name_to_monitor": "train/accuracy",
        "metric_mode": "max",
        "keep_checkpoints_without_metrics": True,
        "force_keep_period": None,
    }

    def __init__(
        self,
        train_state: Any,
        partitioner: Any,
        checkpoints_dir: str,
        dataset_iterator: Any = None,
        *,
        keep: int | None = None,
        save_dtype: Any = np.float32,
        restore_dtype: Any = None,
        metric_name_to_monitor: str = "train/accuracy",
        metric_mode: str = "max",
        keep_checkpoints_without_metrics: bool = True,
        force_keep_period: int | None = None,
        keep_dataset_checkpoints: int | None = None,
        use_gda: bool = False,
    ) -> None:
        if metric_mode not in ("max", "min"):
            raise ValueError(f"metric_mode must be 'max' or 'min', got {metric_mode!r}")
        if "/" not in metric_name_to_monitor:
            raise ValueError(
                f"metric_name_to_monitor must be '<event folder>/<tag>' (e.g. 'train/accuracy'), "
                f"got {metric_name_to_monitor!r}"
            )
        if force_keep_period is not None and force_keep_period < 1:
            raise ValueError(f"force_keep_period must be None or >= 1, got {force_keep_period}")
        super().__init__(
            train_state,
            partitioner,
            checkpoints_dir,
            dataset_iterator,
            keep=keep,
            save_dtype=save_dtype,
            restore_dtype=restore_dtype,
            keep_dataset_checkpoints=keep_dataset_checkpoints,
            use_gda=use_gda,
        )
        self._metric_name_to_monitor = metric_name_to_monitor
        self._metric_mode = metric_mode
        self._keep_checkpoints_without_metrics = keep_checkpoints_without_metrics
        self._force_keep_period = force_keep_period

    def _read_metrics(self) -> dict[int, float]:
        """step -> the last value logged for the monitored tag."""
        folder, tag = self._metric_name_to_monitor.rsplit("/", 1)
        files = sorted(glob.glob(os.path.join(self.checkpoints_dir, folder, "events.out.tfevents.*")))
        if not files:
            return {}
        import tensorflow as tf

        metrics: dict[int, float] = {}
        for name in files:
            for event in tf.compat.v1.train.summary_iterator(name):
                for value in event.summary.value:
                    if value.tag != tag:
                        continue
                    if value.HasField("tensor"):
                        metrics[int(event.step)] = float(tf.make_ndarray(value.tensor))
                    else:
                        metrics[int(event.step)] = float(value.simple_value)
        return metrics

    def _steps_to_remove(self) -> list[int]:
        if self.keep is None:
            return []
        steps = self.all_steps()[:-1]  # the step just saved always stays
        if self._force_keep_period:
            steps = [s for s in steps if s % self._force_keep_period]
        metrics = self._read_metrics() if steps else {}
        ranked = sorted(
            (s for s in steps if s in metrics), key=metrics.__getitem__, reverse=self._metric_mode == "max"
        )
        if not self._keep_checkpoints_without_metrics:
            ranked += sorted((s for s in steps if s not in metrics), reverse=True)  # oldest go first
        return [step for step in ranked[self.keep :] if not self._is_pinned(step)]


class CheckpointManager:
    """Upstream's Orbax-backed checkpoint manager, as a name to subclass or refer to.

    ``t5x.utils.restore`` and ``TrainStateInitializer`` call a subclass's
    ``restore(path=..., fallback_state=..., state_transformation_fns=...)``. This
    base is not built here: t5x-launch saves and restores with ``Checkpointer``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "checkpoints.CheckpointManager (upstream's Orbax manager) is not implemented here: "
            "t5x-launch saves and restores checkpoints with t5x.checkpointing.Checkpointer"
        )

    def restore(self, path: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.restore is not implemented (asked for {path})")


__all__ = [
    "VERSION",
    "CheckpointManager",
    "Checkpointer",
    "LazyArray",
    "SaveBestCheckpointer",
    "all_steps",
    "find_checkpoint",
    "get_checkpoint_dir",
    "latest_step",
    "load_t5x_checkpoint",
]
