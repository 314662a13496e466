"""A training run that fails before its first checkpoint leaves no half-written model folder.

Two steps, because the model folder's lock file lives in the folder:

- while the run still holds the lock, :func:`undo_early_failure` removes what
  the run wrote (model-info, metrics, TensorBoard events, ...) when it fails and
  the folder holds no checkpoint; entries that were there before are kept.
  Where a checkpoint was being written when the run failed (a partial
  ``checkpoint_*`` folder), nothing is removed and a ``FAILED`` file says why;
- after the lock is released, :func:`new_model_dir` removes the folders the
  run created, only if they are empty.

A folder the user made, anything in it before the run, and any checkpoint are
never removed.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pathlib
import re
import shutil
import traceback
from collections.abc import Iterator

FAILED_NAME = "FAILED"
_FAILED_HEADER = "t5x-launch train failed before writing its first checkpoint"
_COMPLETE = re.compile(r"checkpoint_\d+")  # a step folder (partial saves have a suffix)


def _is_main_process() -> bool:
    import jax

    return jax.process_index() == 0


@contextlib.contextmanager
def new_model_dir(directory: pathlib.Path) -> Iterator[list[pathlib.Path]]:
    """Creates ``directory`` (and missing parents); removes those left empty when the body fails.

    Yields:
      The folders this call created, outermost first (empty when it existed).
    """
    created: list[pathlib.Path] = []
    folder = directory.absolute()
    while not folder.exists() and folder.parent != folder:
        created.insert(0, folder)
        folder = folder.parent
    directory.mkdir(parents=True, exist_ok=True)
    try:
        yield created
    except BaseException:
        if created and _is_main_process():
            for path in reversed(created):
                try:
                    path.rmdir()  # only succeeds on an empty folder
                except OSError:
                    break
        raise


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _is_our_marker(path: pathlib.Path) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return f.readline().startswith(_FAILED_HEADER)
    except OSError:
        return False


@contextlib.contextmanager
def undo_early_failure(directory: pathlib.Path, *, held: bool, keep: tuple[str, ...] = ()) -> Iterator[None]:
    """Removes what the body wrote into ``directory`` when it fails before any checkpoint exists.

    Args:
      directory: the model folder (it exists).
      held: this process holds the folder's lock (only the holder cleans up).
      keep: names never touched (the lock file).
    """
    if not held:
        yield
        return
    marker = directory / FAILED_NAME
    if marker.is_file() and _is_our_marker(marker):
        marker.unlink()  # a previous attempt's; this run starts afresh
    before = set(os.listdir(directory))
    try:
        yield
    except BaseException as error:
        with contextlib.suppress(OSError):
            _after_failure(directory, before, keep, error)
        raise


def _after_failure(
    directory: pathlib.Path, before: set[str], keep: tuple[str, ...], error: BaseException
) -> None:
    now = set(os.listdir(directory))
    if any(_COMPLETE.fullmatch(name) for name in before | now):
        return  # a resumed run, or one that got as far as a checkpoint: the folder is the user's
    new = {name for name in now - before if not name.startswith((*keep, "checkpoint"))}
    for name in new:
        _remove(directory / name)
    if any(name.startswith("checkpoint") for name in now):
        # A save was under way: leave it for inspection (the next run clears partial saves).
        summary = "".join(traceback.format_exception_only(type(error), error)).strip()
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        (directory / FAILED_NAME).write_text(
            f"{_FAILED_HEADER} ({stamp}).\n{summary}\n"
            "This folder holds no complete checkpoint: delete it, or rerun the same command to start again.\n",
            encoding="utf-8",
        )
