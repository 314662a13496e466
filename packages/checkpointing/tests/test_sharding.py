"""Saving from a 2-D mesh of 8 virtual devices and restoring onto 1, 2 and 8 devices.

Each part runs in a fresh interpreter: the virtual device count is fixed when
JAX's backend starts.
"""

import socket
import subprocess
import sys

from ckpt_helpers import run_script

_COMMON = """
import sys
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding
from t5x.checkpointing import Checkpointer, load_t5x_checkpoint

def expected():
    rng = np.random.default_rng(0)
    return {
        "target": {"dense": {"kernel": rng.standard_normal((16, 8)).astype(np.float32)},
                   "embed": {"embedding": rng.standard_normal((40, 16)).astype(jax.numpy.bfloat16)}},
        "state": {"step": np.int32(11),
                  "param_states": {"dense": {"kernel": {"v_row": rng.standard_normal(16).astype(np.float32),
                                                        "v_col": rng.standard_normal(8).astype(np.float32)}},
                                   "embed": {"embedding": {"v": rng.standard_normal((40, 16)).astype(np.float32)}}}},
    }

def mesh(shape, names, devices):
    return jax.make_mesh(shape, names, devices=devices, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))

def specs_like(state, mesh_, kernel, embed, vec):
    return {
        "target": {"dense": {"kernel": NamedSharding(mesh_, kernel)}, "embed": {"embedding": NamedSharding(mesh_, embed)}},
        "state": {"step": NamedSharding(mesh_, P()),
                  "param_states": {"dense": {"kernel": {"v_row": NamedSharding(mesh_, vec),
                                                        "v_col": NamedSharding(mesh_, P())}},
                                   "embed": {"embedding": {"v": NamedSharding(mesh_, embed)}}}},
    }

def place(state, shardings):
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(np.shape(x), s, lambda i: np.asarray(x)[i]),
                        state, shardings)

def check(restored, want, shardings):
    flat_r, _ = jax.tree.flatten(restored)
    flat_w, _ = jax.tree.flatten(want)
    flat_s, _ = jax.tree.flatten(shardings)
    assert len(flat_r) == len(flat_w)
    for got, exp, sharding in zip(flat_r, flat_w, flat_s):
        assert isinstance(got, jax.Array), type(got)
        assert got.sharding == sharding, (got.sharding, sharding)
        assert got.dtype == np.asarray(exp).dtype
        for shard in got.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(exp)[shard.index])
"""


def test_save_on_8_devices_restore_on_8_and_1_then_2(tmp_path):
    save_and_restore = (
        _COMMON
        + """
assert jax.device_count() == 8
want = expected()
m = mesh((4, 2), ("data", "model"), jax.devices())
saved = place(want, specs_like(want, m, P("data", "model"), P(None, "model"), P("data")))
ckpt = Checkpointer(sys.argv[1])
ckpt.save(11, saved, {"seen": 5})
ckpt.close()
# Each 8-device shard is one zarr chunk: 4 x 2 chunk files for the kernel.
import os
assert len([f for f in os.listdir(sys.argv[1] + "/checkpoint_11/target.dense.kernel") if f != ".zarray"]) == 8
other = mesh((2, 4), ("a", "b"), jax.devices()[::-1])
shardings8 = specs_like(want, other, P("b", "a"), P("a", None), P(None))
check(Checkpointer(sys.argv[1]).restore(target=want, shardings=shardings8).state, want, shardings8)
one = SingleDeviceSharding(jax.devices()[3])
shardings1 = jax.tree.map(lambda _: one, want)
check(Checkpointer(sys.argv[1]).restore(target=want, shardings=shardings1).state, want, shardings1)
print("OK")
"""
    )
    out = run_script(save_and_restore, str(tmp_path), devices=8)
    assert "OK" in out.stdout

    restore_on_two = (
        _COMMON
        + """
assert jax.device_count() == 2
want = expected()
m = mesh((2,), ("x",), jax.devices())
shardings2 = specs_like(want, m, P(None, "x"), P("x", None), P("x"))
restored = Checkpointer(sys.argv[1]).restore(target=want, shardings=shardings2)
assert restored.step == 11 and restored.input_state == {"seen": 5}
check(restored.state, want, shardings2)
print("OK")
"""
    )
    out = run_script(restore_on_two, str(tmp_path), devices=2)
    assert "OK" in out.stdout


_TWO_PROCESSES = (
    _COMMON
    + """
process_id, port, model_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
want = expected()
m = mesh((2, 2), ("data", "model"), jax.devices())
saved = place(want, specs_like(want, m, P("data", "model"), P("model", None), P("data")))
ckpt = Checkpointer(model_dir, keep=1)
ckpt.save(11, saved, {"host": process_id})
ckpt.save(12, saved, {"host": process_id})
ckpt.close()
assert ckpt.all_steps() == [12], ckpt.all_steps()
other = specs_like(want, m, P("model", None), P(None, "data"), P(None))
restored = Checkpointer(model_dir).restore(target=want, shardings=other)
assert restored.input_state == {"host": process_id}, restored.input_state
check(restored.state, want, other)
if process_id == 0:
    loaded = load_t5x_checkpoint(model_dir)
    for got, exp in zip(jax.tree.leaves(loaded), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))
    from t5x.checkpointing import verify_checkpoint
    report = verify_checkpoint(model_dir)  # both processes' chunk digests, merged by process 0
    assert report.fully_verified and report.arrays == 5 and report.files == 3, report
print("OK", process_id)
"""
)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def test_two_processes_save_and_restore_one_global_state(tmp_path):
    import os
    import textwrap

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_TWO_PROCESSES), str(i), port, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        outs.append((proc.returncode, out, err))
    for i, (code, out, err) in enumerate(outs):
        assert code == 0 and f"OK {i}" in out, f"process {i} failed ({code}):\n{out}\n{err[-3000:]}"
    files = sorted(os.listdir(tmp_path / "checkpoint_12"))
    assert "train_ds-000-of-002.json" in files and "train_ds-001-of-002.json" in files
    assert "checksums.json" in files and not [f for f in files if f.startswith("checksums-")], files
