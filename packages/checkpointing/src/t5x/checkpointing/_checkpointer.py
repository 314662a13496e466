"""The Checkpointer: atomic, asynchronous, multi-process saves of T5X state dicts."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping
from typing import Any

import jax

from t5x.checkpointing import _format, _integrity, _manifest, _multihost, _reader, _restore
from t5x.checkpointing._errors import CheckpointIntegrityError
from t5x.interfaces import JSONValue, RestoredCheckpoint

# A save in progress: ``checkpoint_<step>.tmp-<ms>-<writer>``, where the writer id
# (``<pid>-<random hex>``) tells one Checkpointer's folders from another's. The form
# without a writer id (written before) is still recognised as temporary.
_TMP_DIR = re.compile(r"^checkpoint_(\d+)\.tmp-\d+(?:-(?P<writer>\d+-[0-9a-f]+))?$")


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
      verify: check what ``restore`` reads against the step's checksums (see
        :func:`verify_checkpoint`); False skips the checks (links leaving the
        step folder are refused either way).

    Temporary folders carry this Checkpointer's writer id; a save removes only
    its own leftovers. Folders of killed writers are removed by
    :meth:`remove_abandoned_saves`, which only the holder of the model folder's
    lock may call.
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
        verify: bool = True,
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
        self.verify = verify
        self._writer = f"{os.getpid()}-{secrets.token_hex(4)}"
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
        if jax.process_index() == 0:
            # Only this writer's own leftovers: another writer's temporary folder may be a
            # save in progress (see remove_abandoned_saves for those of dead writers).
            self._remove_temporaries(own=True)
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
                tmp_dir = f"{final_dir}.tmp-{int(time.time() * 1000)}-{self._writer}"
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
        checksums = _integrity.WRITE_CHECKSUMS
        process, count = jax.process_index(), jax.process_count()
        try:
            written = _format.write_arrays(tmp_dir, leaves, self.compression, checksums)
            if input_json is not None:
                name = _format.input_state_file(process, count)
                with open(os.path.join(tmp_dir, name), "w") as handle:
                    handle.write(input_json)
            if checksums and count > 1:
                part = os.path.join(tmp_dir, _integrity.part_file(process, count))
                _integrity.write_json(part, written.digests)
        except BaseException:
            if process == 0:
                shutil.rmtree(tmp_dir, ignore_errors=True)
            raise
        _multihost.barrier(f"{tag}/written")
        if process == 0:
            commit_step(tmp_dir, final_dir, leaves, written, self.compression, count, checksums)
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

    def delete_step(self, step: int) -> None:
        """Removes the complete checkpoint ``step`` (on process 0; for retention rules of a caller's own).

        Raises:
          ValueError: the step is pinned (``pin_checkpoint``).
        """
        step_dir = self.step_dir(step)
        if os.path.exists(os.path.join(step_dir, _format.PINNED_FILE)):
            raise ValueError(f"checkpoint {step_dir} is pinned; unpin it before deleting it")
        if jax.process_index() == 0:
            _remove_step_dir(step_dir)

    def _newest_valid_hint(self, broken_step: int) -> str:
        """Names the newest checkpoint older than ``broken_step`` whose index and metadata check out."""
        for step in reversed([s for s in self.all_steps() if s < broken_step]):
            try:
                _reader.read_sources(self.step_dir(step), verify=self.verify)
            except (CheckpointIntegrityError, OSError):
                continue
            return f"the newest valid checkpoint is step {step} ({self.step_dir(step)}): restore it with step={step}, or remove {self.step_dir(broken_step)}"
        return "no older valid checkpoint exists"

    def _remove_temporaries(self, *, own: bool) -> list[str]:
        """Removes this writer's temporary folders (``own``) or every other writer's."""
        try:
            names = os.listdir(self.model_dir)
        except FileNotFoundError:
            return []
        removed = []
        for name in sorted(names):
            match = _TMP_DIR.match(name)
            if match and (match.group("writer") == self._writer) == own:
                path = os.path.join(self.model_dir, name)
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed

    def remove_abandoned_saves(self) -> list[str]:
        """Removes every temporary save folder in the model folder not created by this Checkpointer.

        A save writes into ``checkpoint_<step>.tmp-<ms>-<writer id>/`` and renames it
        when complete; a killed job leaves that folder behind (invisible to
        listing and restore, but using disk space). ``save`` removes only its own
        Checkpointer's leftovers, because another writer's temporary folder may
        be a save still in progress. This method removes all the others,
        including the older ``checkpoint_<step>.tmp-<ms>`` form.

        Call it only while holding the model folder's lock (e.g. right after a
        training job takes it, before its first save): any other writer's save in
        progress would be deleted under it. Runs on process 0 only (it owns the
        folder, as for saves); other processes return ``[]``.

        Returns:
          The removed folders' paths.
        """
        if jax.process_index() != 0:
            return []
        return self._remove_temporaries(own=False)

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
        verify: bool | None = None,
    ) -> RestoredCheckpoint:
        """Loads checkpoint ``step`` (the latest when None).

        Args:
          step: which checkpoint.
          target: a state dict of the wanted structure (arrays or
            ``jax.ShapeDtypeStruct``s), or a train state object with a
            ``state_dict()`` method (``t5x.training``'s ``TrainState``, e.g.
            ``init_train_state(...).state`` or its abstract ``.shapes``), which
            stands for that state dict; shapes are checked, floats are cast to
            its dtypes. None restores everything in the checkpoint.
          shardings: a tree like ``target`` of ``jax.sharding.Sharding``s (or a
            train state of them, e.g. ``init_train_state(...).shardings``); each
            process then reads only the slices its devices hold.
          params_only: restore only ``target`` (parameters); the optimizer state
            comes from ``target`` (fine-tuning from a pretrained checkpoint).
          assignment_map: ``(regex, replacement)`` renames from model keys
            (``target/encoder/...``) to checkpoint keys; ``None`` drops a key.
          fallback_to_target: keys the checkpoint lacks keep ``target``'s values.
          lazy: return :class:`LazyArray` leaves instead of reading them (they
            verify their chunks when read).
          verify: check every array read against the step's checksums (None:
            the Checkpointer's ``verify``). A checkpoint without checksums is
            read unverified with a warning.

        Returns:
          ``RestoredCheckpoint(step, state, input_state)``; ``state`` is a state
          dict even for a train state ``target`` (``TrainState.restore_state``
          turns it back into one).

        Raises:
          TypeError: ``target`` or ``shardings`` is neither a mapping nor a
            train state object.
          FileNotFoundError: no such checkpoint (names the folder and the newest
            complete step), or (not verifying) an array file is missing.
          CheckpointIntegrityError: a chunk, array folder or metadata file is
            missing or changed (names the parameter, the file, expected and
            found, and the newest older checkpoint that checks out).
          ValueError: a shape or dtype does not fit ``target``.
          KeyError: the checkpoint lacks a parameter and there is no fallback.
        """
        target = _restore.as_state_dict(target, "target")
        shardings = _restore.as_state_dict(shardings, "shardings")
        if lazy and shardings is not None:
            raise ValueError(
                "lazy=True returns host-side LazyArray leaves; it cannot be combined with shardings"
            )
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no complete checkpoint in {self.model_dir}")
        step_dir, _ = _reader.locate(self.model_dir, int(step))
        verify = self.verify if verify is None else bool(verify)
        try:
            sources = _reader.read_sources(step_dir, verify=verify)
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
            input_state = _read_input_state(step_dir, verify)
        except CheckpointIntegrityError as error:
            # The same error (class, name, path), its message extended with where to go back to.
            error.args = (f"{error.args[0]}; {self._newest_valid_hint(int(step))}", *error.args[1:])
            raise
        return RestoredCheckpoint(step=int(step), state=state, input_state=input_state)


def commit_step(
    tmp_dir: str,
    final_dir: str,
    leaves: list[_format.HostLeaf],
    written: _integrity.Written,
    compression: str,
    count: int,
    checksums: bool,
) -> None:
    """Process 0, once every process wrote its arrays: index, manifest, fsync, rename.

    On failure the temporary folder is removed and the error raised.
    """
    try:
        index = _format.build_index(leaves, compression)
        paths = [os.path.join(tmp_dir, _format.INDEX_FILE)]
        with open(paths[0], "wb") as handle:
            handle.write(index)
        if checksums:
            paths.append(_write_manifest(tmp_dir, leaves, written, index, count))
        for path in paths:  # both written before either is synced: the second fsync has little left
            with open(path, "rb+") as handle:
                os.fsync(handle.fileno())
        os.rename(tmp_dir, final_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


def _write_manifest(
    tmp_dir: str,
    leaves: list[_format.HostLeaf],
    written: _integrity.Written,
    index: bytes,
    count: int,
) -> str:
    """Gathers every process's chunk digests and writes ``checksums.json`` (unsynced).

    Returns:
      The manifest's path.
    """
    merged: dict[str, dict[str, str]] = {}
    parts = [os.path.join(tmp_dir, _integrity.part_file(p, count)) for p in range(count)] if count > 1 else []
    for part in parts:
        with open(part) as handle:
            for folder, chunks in json.load(handle).items():
                merged.setdefault(folder, {}).update(chunks)
    for folder, chunks in written.digests.items():
        merged.setdefault(folder, {}).update(chunks)
    files = {_format.INDEX_FILE: index}
    for name in sorted(os.listdir(tmp_dir)):
        if name.startswith(_format.INPUT_STATE_PREFIX + "-"):
            with open(os.path.join(tmp_dir, name), "rb") as handle:
                files[name] = handle.read()
    manifest = _integrity.build_manifest(
        tmp_dir, _format.stored_arrays(leaves), merged, files, _format.ts_context()
    )
    path = os.path.join(tmp_dir, _manifest.MANIFEST_FILE)
    _integrity.write_json(path, manifest)
    for part in parts:
        os.remove(part)
    return path


def _read_input_state(step_dir: str, verify: bool = True) -> dict[str, JSONValue] | None:
    name = _format.input_state_file(jax.process_index(), jax.process_count())
    path = os.path.join(step_dir, name)
    if not os.path.exists(path):
        return None
    real, step_real = os.path.realpath(path), os.path.realpath(step_dir)
    if not _manifest.inside(real, step_real):
        raise CheckpointIntegrityError(
            f"{path} resolves to {real}, outside the step folder {step_real}", path=path
        )
    with open(path, "rb") as handle:
        raw = handle.read()
    if verify:
        manifest = _manifest.load_manifest(step_dir)
        if manifest is not None:
            manifest.check_file(name, raw, path, required=True)
    try:
        return json.loads(raw)
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
