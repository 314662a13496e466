"""`t5x-launch verify`: a sound checkpoint passes, a damaged one exits 1 naming the array."""

import os
import pathlib

import numpy as np
import pytest

from t5x.checkpointing import save_t5x_checkpoint
from t5x.launch._cli import main

STATE = {
    "target": {"encoder": {"kernel": np.arange(64 * 32, dtype=np.float32).reshape(64, 32)}},
    "state": {"step": np.int32(3)},
}


@pytest.fixture
def model_dir(tmp_path) -> pathlib.Path:
    for step in (3, 4):
        save_t5x_checkpoint(tmp_path, step, STATE)
    return tmp_path


def _flip_a_byte(array_dir: pathlib.Path) -> None:
    chunk = next(p for p in sorted(array_dir.iterdir()) if not p.name.startswith("."))
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))


def test_sound_checkpoint_passes(model_dir, capsys):
    assert main(["verify", str(model_dir)]) == 0
    out = capsys.readouterr().out
    assert "checkpoint_4" in out and "OK" in out


def test_all_steps_checks_every_step(model_dir, capsys):
    assert main(["verify", str(model_dir), "--all_steps"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint_3" in out and "checkpoint_4" in out


def test_flipped_byte_exits_1_naming_the_array(model_dir, capsys):
    _flip_a_byte(model_dir / "checkpoint_3" / "target.encoder.kernel")
    assert main(["verify", str(model_dir), "--step=3"]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "target.encoder.kernel" in out
    # The other step is untouched and still passes; --all_steps reports both and fails.
    assert main(["verify", str(model_dir), "--step=4"]) == 0
    assert main(["verify", str(model_dir), "--all_steps"]) == 1


def test_deleted_chunk_exits_1(model_dir, capsys):
    array_dir = model_dir / "checkpoint_4" / "target.encoder.kernel"
    for chunk in array_dir.iterdir():
        if not chunk.name.startswith("."):
            os.remove(chunk)
    assert main(["verify", str(model_dir)]) == 1
    assert "target.encoder.kernel" in capsys.readouterr().out


def test_checkpoint_without_checksums_is_reported_unverified(model_dir, capsys):
    step_dir = model_dir / "checkpoint_4"
    manifests = [p for p in step_dir.iterdir() if p.is_file() and p.name not in ("checkpoint",)]
    manifests = [p for p in manifests if not p.name.startswith("train_ds")]
    assert manifests, "the checkpoint should carry a checksum file beside its index"
    for path in manifests:
        os.remove(path)  # what an upstream T5X checkpoint looks like
    assert main(["verify", str(step_dir)]) == 0
    assert "UNVERIFIED" in capsys.readouterr().out
    assert main(["verify", str(step_dir), "--require_checksums"]) == 1


def test_missing_path_is_a_user_error(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "Traceback" not in err
