"""Two local processes under jax.distributed train to the same params as one process."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

tp = pytest.importorskip(
    "t5x.partitioning", reason="the multi-process test needs t5x-partitioning (test extra)"
)

WORKER = Path(__file__).with_name("_two_process_train.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    port, out = _free_port(), tmp_path / "two.npz"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(port), str(pid), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for pid in range(2)
    ]
    deadline = time.monotonic() + 240
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.2)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for pid, proc in enumerate(procs):
        _stdout, stderr = proc.communicate()
        assert proc.returncode == 0, f"process {pid}: {stderr[-3000:]}"

    sys.path.insert(0, str(WORKER.parent))
    import _two_process_train as worker
    from training_doubles import make_data

    result, params = worker.run(
        tp.PjitPartitioner(num_partitions=1, devices=jax.devices()[:1]),
        make_data(worker.STEPS * worker.GLOBAL_BATCH, seed=8),
    )
    with np.load(out) as two:
        np.testing.assert_allclose(two["losses"], [result.losses[s] for s in range(worker.STEPS)], rtol=1e-5)
        for path, value in jax.tree_util.tree_leaves_with_path(params):
            np.testing.assert_allclose(
                two[jax.tree_util.keystr(path)], np.asarray(value), rtol=1e-5, atol=1e-6
            )


@pytest.mark.slow
def test_a_signal_to_one_process_stops_every_process_after_the_same_step(tmp_path):
    worker = Path(__file__).with_name("_two_process_signal.py")
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(port), str(pid), str(tmp_path / "model")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for pid in range(2)
    ]
    deadline = time.monotonic() + 240
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # without agreement process 0 trains on alone and waits for process 1 forever
    for pid, proc in enumerate(procs):
        stdout, stderr = proc.communicate()
        assert proc.returncode == 0, f"process {pid}: {stderr[-3000:]}"
        assert f"stopped signal {int(signal.SIGTERM)} 3" in stdout, (pid, stdout, stderr[-3000:])
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["checkpoint_3"]
