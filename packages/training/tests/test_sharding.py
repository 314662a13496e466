"""Train-state shardings on a data x model mesh of 8 virtual CPU devices."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("t5x.partitioning", reason="the mesh test needs t5x-partitioning (test extra)")

WORKER = Path(__file__).with_name("_sharded_train.py")


@pytest.fixture(scope="module")
def result():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_params_and_slots_follow_logical_axes(result):
    assert result["kernel"] == [None, "model"]  # ("embed", "vocab")
    assert result["bias"] == ["model"]  # ("vocab",)
    assert result["kernel_m"] == result["kernel"]  # momentum shaped like the kernel
    assert result["kernel_v"] == result["kernel"]  # unfactored second moment too
    assert result["kernel_v_row"] == []  # placeholder: replicated
    assert result["count"] == []


def test_sharded_training_matches_one_device(result):
    np.testing.assert_allclose(result["losses"], result["single_losses"], rtol=1e-5)
    assert result["max_param_diff"] < 1e-5
