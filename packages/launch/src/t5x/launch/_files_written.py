"""The last line of a job: what it wrote, so a user sees the files without listing the folder."""

from __future__ import annotations

import os
import pathlib


def folder_listing(directory: str | os.PathLike[str]) -> str:
    """What a model or output folder holds, for one log line.

    Checkpoint folders are named as such (``checkpoint_1000/``); the files of
    any other folder are listed by path (``train/events.out.tfevents...``).
    """
    root = pathlib.Path(directory)
    names: list[str] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.name.startswith("checkpoint_"):
            files = sorted(p for p in entry.rglob("*") if p.is_file())
            names.extend(str(p.relative_to(root)) for p in files)
            if not files:
                names.append(entry.name + "/")
        else:
            names.append(entry.name + ("/" if entry.is_dir() else ""))
    return ", ".join(names)


def print_files_written(directory: str | os.PathLike[str]) -> None:
    """The last line of ``train`` and ``eval``: every file in the folder they wrote to."""
    import jax

    if jax.process_index() == 0 and pathlib.Path(directory).is_dir():
        print(f"[t5x-launch] files in {directory}: {folder_listing(directory)}", flush=True)


def print_infer_files(paths: list[str], output_dir: str) -> None:
    """The last line of ``infer``: the files this job wrote (other shards' files are theirs)."""
    import jax

    if jax.process_index() != 0:
        return
    names = [p for path in paths for p in (path, f"{path}.COMPLETED") if os.path.exists(p)]
    config = pathlib.Path(output_dir) / "config.gin"
    names += [str(config)] if config.exists() else []
    print(f"[t5x-launch] wrote {', '.join(names)}", flush=True)
