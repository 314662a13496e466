"""The Checkpointer: atomic, asynchronous, multi-process saves of T5X state dicts."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from typing import Any

import jax

from t5x.checkpointing import _format, _multihost, _reader, _restore
from t5x.checkpointing._codec import CorruptIndexError
from t5x.interfaces import JSONValue, RestoredCheckpoint

_TMP_DIR = re.compile(r"^checkpoint_(\d+)\.tmp-\d+$")


def _remove_step_dir(step_dir: str) -> None:
    # Drop the index first: an interrupted removal then leaves an invisible
    # folder (cleaned later), never a listed step with missing arrays.
    index = os.path.join(step_dir, _format.INDEX_FILE)
    if os.path.exists(index):
        os.remove(index)
    shutil.rmtree(step_dir, ignore_errors=True)


def pin_checkpoint(step_dir: str) -> None:
    """Marks a step folder so retention never deletes it (a ``PINNED`` file)."""
    with open(os.path.join(step_dir, _format.PINNED_FILE), "w") as handle:
        handle.write("1")


def unpin_checkpoint(step_dir: str) -> None:
    """Removes a step folder's ``PINNED`` mark (if any)."""
    path = os.path.join(step_dir, _format.PINNED_FILE)
    if os.path.exists(path):
        os.remove(path)


class Checkpointer:
    """Saves and restores T5X state dicts under ``model_dir/checkpoint_<step>/``.

    Implements ``t5x.interfaces.Checkpointer``. A save copies device data to
    host memory, returns, and writes in a background thread (``async_save``)
    into ``checkpoint_<step>.tmp-<time>/``, renamed to ``checkpoint_<step>/``
    only once every process finished and process 0 wrote the index. A second
    save waits for the first; a background failure is raised by the next
    ``save``, ``wait_until_finished`` or ``close``. Each process stores its
    ``input_state`` as ``train_ds-<process>-of-<count>.json`` in the step folder.

    Args:
      model_dir: the folder holding the step folders (created if missing).
      keep: keep at most this many newest steps (None keeps all).
      keep_every: additionally never delete steps divisible by this.
      save_dtype: cast floating parameters (``target``) to this dtype on save.
      restore_dtype: cast floating parameters to this dtype on restore.
      compression: zarr chunk compressor: ``"zstd"`` (level 1, the default:
        several times faster than gzip), ``"gzip"`` (what upstream T5X writes)
        or ``"none"``. TensorStore reads all three, so upstream T5X reads any.
      async_save: write in a background thread (False: ``save`` blocks).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        keep: int | None = None,
        keep_every: int | None = None,
        save_dtype: Any = None,
        restore_dtype: Any = None,
        compression: str = "zstd",
        async_save: bool = True,
    ) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be None or >= 1, got {keep}")
        if keep_every is not None and keep_every < 1:
            raise ValueError(f"keep_every must be None or >= 1, got {keep_every}")
        from t5x.checkpointing import _specs

        _specs.compressor_json(compression)  # validates the name
        self.model_dir = os.path.abspath(os.fspath(model_dir))
        self.keep = keep
        self.keep_every = keep_every
        self.save_dtype = save_dtype
        self.restore_dtype = restore_dtype
        self.compression = compression
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "t5x-checkpoint") if async_save else None
        self._pending: concurrent.futures.Future[None] | None = None
        self._saves = 0
        self._closed = False
        self._tag = hashlib.sha1(self.model_dir.encode()).hexdigest()[:12]

    # ---- listing ---------------------------------------------------------
    def all_steps(self) -> list[int]:
        """The steps of all complete checkpoints, ascending."""
        return _reader.list_steps(self.model_dir)

    def latest_step(self) -> int | None:
        """The newest complete step, or None."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def step_dir(self, step: int) -> str:
        """The folder of ``step`` (whether or not it exists)."""
        return os.path.join(self.model_dir, f"checkpoint_{int(step)}")

    # ---- saving ----------------------------------------------------------
    def save(
        self, step: int, train_state: Mapping[str, Any], input_state: Mapping[str, JSONValue] | None = None
    ) -> None:
        """Starts saving ``train_state`` as ``step``; blocks for the host copy only.

        Args:
          step: the training step (the folder's number).
          train_state: ``{"target": params, "state": {"step", "param_states"}}``
            with jax or numpy leaves.
          input_state: the input iterator's JSON-able state for this process.

        Raises:
          RuntimeError: the checkpointer is closed.
          PermissionError / OSError: the model folder cannot be written (names it).
          Exception: the previous background save's failure.
        """
        if self._closed:
            raise RuntimeError(f"Checkpointer for {self.model_dir} is closed")
        self.wait_until_finished()
        step = int(step)
        if not isinstance(train_state, Mapping) or "target" not in train_state:
            raise ValueError(
                f"train_state must be a dict with a 'target' key, got {type(train_state).__name__}"
            )
        input_json = None if input_state is None else json.dumps(input_state)
        if self._saves == 0 and jax.process_index() == 0:
            # Only a writer cleans up what crashed saves left: a reader (an eval job
            # watching the folder) must never delete a live writer's temporary folder.
            self._remove_stale_temporaries()
        self._saves += 1
        final_dir = self.step_dir(step)
        tmp_dir = self._make_tmp_dir(step, final_dir)
        if tmp_dir is None:
            return
        leaves = _format.snapshot(train_state, self.save_dtype)
        job = (step, leaves, input_json, tmp_dir, final_dir, self._saves)
        if self._executor is None:
            self._write(*job)
        else:
            self._pending = self._executor.submit(self._write, *job)

    def _make_tmp_dir(self, step: int, final_dir: str) -> str | None:
        """Process 0 creates the temporary folder and tells the others its name (or its failure)."""
        key = f"t5x_ckpt/{self._tag}/{self._saves}/tmp"
        answer, failure = None, None
        if jax.process_index() == 0:
            if os.path.exists(final_dir):
                answer = "SKIP"
            else:
                tmp_dir = f"{final_dir}.tmp-{int(time.time() * 1000)}"
                try:
                    os.makedirs(tmp_dir)
                    answer = tmp_dir
                except OSError as error:
                    failure = error
                    answer = f"ERROR:cannot save step {step}: cannot create {tmp_dir}: {error}"
        answer = _multihost.broadcast_text(key, answer)
        if answer.startswith("ERROR:"):
            kind = type(failure) if failure is not None else OSError
            raise kind(answer[len("ERROR:") :]) from failure
        return None if answer == "SKIP" else answer

    def _write(
        self,
        step: int,
        leaves: list[_format.HostLeaf],
        input_json: str | None,
        tmp_dir: str,
        final_dir: str,
        save_id: int,
    ) -> None:
        tag = f"t5x_ckpt/{self._tag}/{save_id}"
        try:
            _format.write_arrays(tmp_dir, leaves, self.compression)
            if input_json is not None:
                name = _format.input_state_file(jax.process_index(), jax.process_count())
                with open(os.path.join(tmp_dir, name), "w") as handle:
                    handle.write(input_json)
        except BaseException:
            if jax.process_index() == 0:
                shutil.rmtree(tmp_dir, ignore_errors=True)
            raise
        _multihost.barrier(f"{tag}/written")
        if jax.process_index() == 0:
            try:
                index = _format.build_index(leaves, self.compression)
                path = os.path.join(tmp_dir, _format.INDEX_FILE)
                with open(path, "wb") as handle:
                    handle.write(index)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.rename(tmp_dir, final_dir)
            except BaseException:
                shutil.rmtree(tmp_dir, ignore_errors=True)
                raise
            self._apply_retention()
        _multihost.barrier(f"{tag}/renamed")

    def _apply_retention(self) -> None:
        if self.keep is None:
            return
        steps = self.all_steps()
        for step in steps[: max(0, len(steps) - self.keep)]:
            if self.keep_every and step % self.keep_every == 0:
                continue
            step_dir = self.step_dir(step)
            if os.path.exists(os.path.join(step_dir, _format.PINNED_FILE)):
                continue
            _remove_step_dir(step_dir)

    def _newest_valid_hint(self, broken_step: int) -> str:
        """Names the newest checkpoint older than ``broken_step`` whose index decodes."""
        for step in reversed([s for s in self.all_steps() if s < broken_step]):
            try:
                _reader.read_sources(self.step_dir(step))
            except (CorruptIndexError, OSError):
                continue
            return f"the newest valid checkpoint is step {step} ({self.step_dir(step)}): restore it with step={step}, or remove {self.step_dir(broken_step)}"
        return "no older valid checkpoint exists"

    def _remove_stale_temporaries(self) -> None:
        try:
            names = os.listdir(self.model_dir)
        except FileNotFoundError:
            return
        for name in names:
            if _TMP_DIR.match(name):
                shutil.rmtree(os.path.join(self.model_dir, name), ignore_errors=True)

    def wait_until_finished(self) -> None:
        """Blocks until a pending save is on disk; raises its error, if any."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Waits for the pending save (raising its error) and stops the worker."""
        if self._closed:
            return
        try:
            self.wait_until_finished()
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)

    # ---- restoring -------------------------------------------------------
    def restore(
        self,
        step: int | None = None,
        target: Any = None,
        shardings: Any = None,
        *,
        params_only: bool = False,
        assignment_map: _restore.AssignmentMap = (),
        fallback_to_target: bool = False,
        lazy: bool = False,
    ) -> RestoredCheckpoint:
        """Loads checkpoint ``step`` (the latest when None).

        Args:
          step: which checkpoint.
          target: a state dict of the wanted structure (arrays or
            ``jax.ShapeDtypeStruct``s); shapes are checked, floats are cast to
            its dtypes. None restores everything in the checkpoint.
          shardings: a tree like ``target`` of ``jax.sharding.Sharding``s; each
            process then reads only the slices its devices hold.
          params_only: restore only ``target`` (parameters); the optimizer state
            comes from ``target`` (fine-tuning from a pretrained checkpoint).
          assignment_map: ``(regex, replacement)`` renames from model keys
            (``target/encoder/...``) to checkpoint keys; ``None`` drops a key.
          fallback_to_target: keys the checkpoint lacks keep ``target``'s values.
          lazy: return :class:`LazyArray` leaves instead of reading them.

        Returns:
          ``RestoredCheckpoint(step, state, input_state)``.

        Raises:
          FileNotFoundError: no such checkpoint (names the folder and the newest
            complete step), or an array file is missing.
          ValueError: a shape or dtype does not fit ``target``.
          KeyError: the checkpoint lacks a parameter and there is no fallback.
        """
        if lazy and shardings is not None:
            raise ValueError(
                "lazy=True returns host-side LazyArray leaves; it cannot be combined with shardings"
            )
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no complete checkpoint in {self.model_dir}")
        step_dir, _ = _reader.locate(self.model_dir, int(step))
        try:
            sources = _reader.read_sources(step_dir)
        except CorruptIndexError as error:
            raise CorruptIndexError(f"{error}; {self._newest_valid_hint(int(step))}") from None
        chosen = _restore.select(
            sources,
            step_dir,
            target,
            params_only=params_only,
            assignment_map=assignment_map,
            fallback_to_target=fallback_to_target,
            restore_dtype=self.restore_dtype,
        )
        state = _restore.materialize(chosen, shardings, lazy=lazy)
        return RestoredCheckpoint(step=int(step), state=state, input_state=_read_input_state(step_dir))


def _read_input_state(step_dir: str) -> dict[str, JSONValue] | None:
    path = os.path.join(step_dir, _format.input_state_file(jax.process_index(), jax.process_count()))
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        try:
            return json.load(handle)
        except ValueError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from error
