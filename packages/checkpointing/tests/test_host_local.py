"""save_host_local: each process writes its own chunks; process 0 completes the step."""

from __future__ import annotations

import os

import numpy as np
import pytest

from t5x import checkpointing


def _state(process: int, full: np.ndarray) -> dict:
    rows = slice(2 * process, 2 * process + 2)
    return {
        "target": {"w": checkpointing.HostChunk(full[rows], (rows, slice(None)), full.shape)},
        "state": {"step": np.int32(7), "param_states": {"w": None}},
    }


def test_two_processes_write_one_verified_step(tmp_path):
    full = np.arange(12, dtype=np.float32).reshape(4, 3)
    seen = []
    for process in (1, 0):
        checkpointing.save_host_local(
            tmp_path,
            7,
            _state(process, full),
            process_index=process,
            process_count=2,
            stamp="5",
            save_dtype=np.float16,
            before_commit=seen.append,
        )
        if process == 1:
            assert sorted(os.listdir(tmp_path)) == ["checkpoint_7.tmp-5"]
    assert seen == [str(tmp_path / "checkpoint_7.tmp-5")] * 2
    loaded = checkpointing.load_t5x_checkpoint(tmp_path / "checkpoint_7")
    assert loaded["target"]["w"].dtype == np.float16
    np.testing.assert_array_equal(loaded["target"]["w"], full.astype(np.float16))
    assert int(loaded["state"]["step"]) == 7
    report = checkpointing.verify_checkpoint(tmp_path / "checkpoint_7")
    assert report.verified == report.arrays == 1


def test_a_chunk_that_does_not_fit_its_index_is_named(tmp_path):
    bad = {"target": {"w": checkpointing.HostChunk(np.zeros((3, 3)), (slice(0, 2), slice(None)), (4, 3))}}
    with pytest.raises(ValueError, match=r"target/w: this process's chunk has shape \(3, 3\)"):
        checkpointing.save_host_local(tmp_path, 1, bad, process_index=0, process_count=1, stamp="0")
