"""Resuming training from a damaged checkpoint fails, naming the parameter and the file.

The session's reference run (conftest's `encdec_reference`), cut back to its
checkpoint at step 2, is the model folder of the module. For each way a checkpoint gets damaged on disk (a chunk file deleted, also one
whose values equal the fill value; a byte flipped; ``fill_value``, shape or dtype
edited in a ``.zarray``; an array folder deleted, or replaced by a link to an
identical array elsewhere; a chunk file replaced by a link), a copy of the model
folder is damaged that way and training is resumed with the same arguments and
more steps. Each must exit non-zero naming the parameter and the file, and write
no new checkpoint; before checksums, most of these loaded silently (a missing
chunk as zeros). The resumes run a few at a time.

Each resume costs a launcher start, the data pipeline and an initialisation
compile (~15 s of CPU) before the restore fails, so by default one kind per way
of detecting damage runs (the recorded chunk list, the chunk checksums, the
recorded ``.zarray``, a missing folder, containment); ``T5X_INTEGRITY_ALL_KINDS=1``
runs all nine. The package's own tests (packages/checkpointing/tests/test_integrity.py)
cover every kind through ``Checkpointer.restore``, the call a resume makes.
"""

import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # pytest's importlib mode adds no path
import _tiny

STEPS = 2
PARAM = "target.token_embedder.embedding"


def _job(model_dir: pathlib.Path, steps: int) -> list[str]:
    return ["train", *_tiny.ENCDEC, *_tiny.train_args(model_dir, steps, STEPS)]


def _env(pycache: pathlib.Path) -> dict[str, str]:
    from t5x.launch import add_malloc_defaults

    env = _tiny.launch_env(PYTHONPYCACHEPREFIX=str(pycache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the runs after the first reuse the bytecode
    add_malloc_defaults(env)  # set up front, so that the launcher does not re-execute itself
    return env


def _flip(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _edit_zarray(folder: pathlib.Path, **changes) -> None:
    zarray = json.loads((folder / ".zarray").read_text())
    zarray.update(changes)
    (folder / ".zarray").write_text(json.dumps(zarray))


def _chunk(folder: pathlib.Path) -> str:
    (name,) = [p.name for p in folder.iterdir() if p.name[0].isdigit()]
    return name


# Each damages a step folder and returns (parameter, file or folder the error must name).
def delete_chunk(step, zeros):
    name = _chunk(step / PARAM)
    os.remove(step / PARAM / name)
    return PARAM, step / PARAM / name


def delete_fill_value_chunk(step, zeros):
    name = _chunk(step / zeros)
    os.remove(step / zeros / name)
    return zeros, step / zeros / name


def flip_byte(step, zeros):
    name = _chunk(step / PARAM)
    _flip(step / PARAM / name)
    return PARAM, step / PARAM / name


def edit_fill_value(step, zeros):
    _edit_zarray(step / PARAM, fill_value=0.5)
    return PARAM, step / PARAM / ".zarray"


def edit_shape(step, zeros):
    shape = json.loads((step / PARAM / ".zarray").read_text())["shape"]
    _edit_zarray(step / PARAM, shape=shape[::-1])
    return PARAM, step / PARAM / ".zarray"


def edit_dtype(step, zeros):
    _edit_zarray(step / PARAM, dtype="<i4")
    return PARAM, step / PARAM / ".zarray"


def delete_array_folder(step, zeros):
    shutil.rmtree(step / PARAM)
    return PARAM, step / PARAM


def symlink_array_folder(step, zeros):
    outside = step.parent.parent / "elsewhere"
    shutil.copytree(step / PARAM, outside)
    shutil.rmtree(step / PARAM)
    os.symlink(outside, step / PARAM)
    return PARAM, step / PARAM


def symlink_chunk_file(step, zeros):
    name = _chunk(step / PARAM)
    outside = step.parent.parent / "elsewhere-chunk"
    shutil.move(step / PARAM / name, outside)
    os.symlink(outside, step / PARAM / name)
    return PARAM, step / PARAM / name


ALL_KINDS = [
    delete_chunk,
    delete_fill_value_chunk,
    flip_byte,
    edit_fill_value,
    edit_shape,
    edit_dtype,
    delete_array_folder,
    symlink_array_folder,
    symlink_chunk_file,
]
# One per check that catches it: chunk list, checksum, .zarray record, folder, containment.
DEFAULT_KINDS = [delete_fill_value_chunk, flip_byte, edit_fill_value, delete_array_folder, symlink_chunk_file]
KINDS = ALL_KINDS if os.environ.get("T5X_INTEGRITY_ALL_KINDS") == "1" else DEFAULT_KINDS


@pytest.fixture(scope="module")
def trained(tmp_path_factory, encdec_reference):
    tmp = tmp_path_factory.mktemp("integrity")
    env = _env(tmp / "pycache")
    # A folder whose newest checkpoint is step 2, as a 2-step run leaves it (that run's
    # config.gin and logs name more steps; a resume reads the checkpoint only).
    model_dir = _tiny.copy_model_dir(encdec_reference, tmp / "reference" / "model", steps=[STEPS])
    assert _tiny.steps_of(model_dir) == [STEPS]
    from t5x.checkpointing import verify_checkpoint

    assert verify_checkpoint(model_dir).fully_verified
    return tmp, model_dir, env


@pytest.fixture(scope="module")
def resumed(trained):
    """Damages one copy per kind and resumes each, a few at a time: ``{kind: (result, parameter, file)}``."""
    tmp, reference, env = trained
    state = _tiny.flatten(_tiny.load(reference / f"checkpoint_{STEPS}"))
    zeros = next(
        name.replace("/", ".")
        for name, value in sorted(state.items())
        if name.startswith("state/param_states/") and value.ndim > 0 and not np.any(value)
    )
    jobs = {}
    for corrupt in KINDS:
        model_dir = tmp / corrupt.__name__ / "model"
        shutil.copytree(reference, model_dir)
        name, path = corrupt(model_dir / f"checkpoint_{STEPS}", zeros)
        jobs[corrupt.__name__] = (model_dir, name, path)

    def resume(model_dir: pathlib.Path) -> subprocess.CompletedProcess[str]:
        return _tiny.run_raw(_job(model_dir, STEPS + 2), model_dir.parent, env=env)

    workers = max(2, min(4, (os.cpu_count() or 2)))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {kind: pool.submit(resume, model_dir) for kind, (model_dir, _, _) in jobs.items()}
        return {kind: (futures[kind].result(), *jobs[kind][1:], jobs[kind][0]) for kind in jobs}


@pytest.mark.parametrize("kind", [k.__name__ for k in KINDS])
def test_resume_from_damaged_checkpoint_fails_naming_parameter_and_file(resumed, kind):
    result, name, path, model_dir = resumed[kind]
    message = result.stderr[-4000:]
    assert result.returncode != 0, f"resumed from a damaged checkpoint ({kind}):\n{message}"
    assert name in message and str(path) in message, message
    assert _tiny.steps_of(model_dir) == [STEPS], "a failed resume must not write checkpoints"
