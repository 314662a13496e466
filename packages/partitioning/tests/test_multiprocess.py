"""Two real local processes under jax.distributed, 2 CPU devices each."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import t5x.partitioning as tp

WORKER = Path(__file__).with_name("_two_process_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two_processes")
    port = _free_port()
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    env["JAX_PLATFORMS"] = "cpu"
    procs, logs = [], []
    for pid in range(2):
        out, err = open(folder / f"{pid}.out", "w+"), open(folder / f"{pid}.err", "w+")  # noqa: SIM115
        logs.append((out, err))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), str(port), str(pid)], stdout=out, stderr=err, env=env
            )
        )
    deadline = time.monotonic() + 180
    try:
        # One failed process leaves the other waiting in a collective: stop at the first failure.
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for pid, (proc, (out, err)) in enumerate(zip(procs, logs)):
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        out.close()
        err.close()
        assert proc.returncode == 0, (
            f"process {pid} ended with {proc.returncode}:\n{stdout}\n{stderr[-4000:]}"
        )
        line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    return results


def test_each_process_feeds_half_and_the_global_batch_is_whole(two_process_results):
    for pid, result in enumerate(two_process_results):
        # shard id, shards, rows per process, first host of its shard
        assert result["layout"] == [pid, 2, 4, True]
        assert result["global_equals_full"]


def test_cross_process_reduction(two_process_results):
    for result in two_process_results:
        assert result["sum"] == result["want_sum"]
        assert result["column_sums"] == result["want_column_sums"]


def test_sharded_init_matches_unsharded(two_process_results):
    assert all(r["init_matches"] for r in two_process_results)


def test_model_axis_spanning_processes_gives_one_shard(two_process_results):
    assert [r["wide_layout"] for r in two_process_results] == [[0, 1, True], [0, 1, False]]
    assert all(r["wide_equals"] for r in two_process_results)


def test_seed_broadcast_and_agreement_checks(two_process_results):
    assert [r["seed"] for r in two_process_results] == [100, 100]
    for result in two_process_results:
        assert "process id differs between processes: processes [1]" in result["mismatch_error"]


def test_single_process_helpers():
    assert tp.is_process_zero()
    assert tp.on_process_zero(lambda x: x + 1)(1) == 2
    assert tp.broadcast_seed(2**40 + 5) == 2**40 + 5
    assert 0 <= tp.broadcast_seed() < 2**63
    with pytest.raises(ValueError, match="seed must be"):
        tp.broadcast_seed(-1)
    tp.assert_same_across_processes([1, "a"])
    tp.barrier("single")
    # Already initialised or not, a bad explicit configuration is refused before JAX sees it.
    with pytest.raises(ValueError, match="num_processes and process_id"):
        tp.initialize_distributed("localhost:1234")
    with pytest.raises(ValueError, match=r"process_id must be in \[0, num_processes=2\)"):
        tp.initialize_distributed("localhost:1234", 2, 5)


def test_no_cluster_detected_is_a_clear_error():
    # A fresh process: jax.distributed must start before JAX's backend does.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "OMPI_", "PMI_", "KUBERNETES_", "TPU_", "CLOUD_TPU", "MEGASCALE_"))
    }
    env["JAX_PLATFORMS"] = "cpu"
    code = (
        "import t5x.partitioning as tp\n"
        "try:\n"
        "    tp.initialize_distributed()\n"
        "except RuntimeError as error:\n"
        "    print('ERROR', error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "found no cluster to join" in done.stdout
    assert "coordinator_address" in done.stdout
