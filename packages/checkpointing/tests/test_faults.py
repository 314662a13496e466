"""Interrupted, refused and failing saves never lose or expose checkpoints."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from ckpt_helpers import assert_same_tree, make_state, run_script

from t5x.checkpointing import Checkpointer

_KILLED_MID_SAVE = """
import sys, time
sys.path.insert(0, sys.argv[2])
from ckpt_helpers import make_state
from t5x.checkpointing import Checkpointer, _format

ckpt = Checkpointer(sys.argv[1])
ckpt.save(1, make_state(seed=1))
ckpt.wait_until_finished()

real_write = _format.write_arrays
def write_then_stall(*args, **kwargs):
    real_write(*args, **kwargs)          # the arrays are on disk, the index is not
    print("ARRAYS WRITTEN", flush=True)
    time.sleep(120)
_format.write_arrays = write_then_stall
ckpt.save(2, make_state(seed=2))
time.sleep(120)
"""


def test_sigkill_mid_save_keeps_previous_and_hides_partial(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_KILLED_MID_SAVE), str(tmp_path), os.path.dirname(__file__)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ARRAYS WRITTEN", (
            f"{line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    leftovers = sorted(os.listdir(tmp_path))
    assert leftovers[0] == "checkpoint_1" and leftovers[1].startswith("checkpoint_2.tmp-"), leftovers
    assert os.listdir(tmp_path / leftovers[1]), "the partial save had written array files"

    ckpt = Checkpointer(tmp_path)
    assert ckpt.all_steps() == [1]  # the partial folder is invisible
    assert_same_tree(ckpt.restore().state, make_state(seed=1))
    ckpt.save(2, make_state(seed=2))  # another writer's temporary folder is left alone ...
    ckpt.wait_until_finished()
    assert leftovers[1] in os.listdir(tmp_path)
    removed = ckpt.remove_abandoned_saves()  # ... until the lock holder removes it
    ckpt.close()
    assert removed == [str(tmp_path / leftovers[1])]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_1", "checkpoint_2"]
    assert Checkpointer(tmp_path).all_steps() == [1, 2]


_READ_ONLY = """
import sys
sys.path.insert(0, sys.argv[2])
from ckpt_helpers import assert_same_tree, make_state
from t5x.checkpointing import Checkpointer

ckpt = Checkpointer(sys.argv[1])
try:
    ckpt.save(2, make_state(seed=2))
except PermissionError as error:
    assert sys.argv[1] in str(error) and "step 2" in str(error), error
    print("REFUSED:", error)
else:
    raise SystemExit("saving into a read-only folder did not fail")
assert ckpt.all_steps() == [1]
assert_same_tree(ckpt.restore(1).state, make_state(seed=1))
ckpt.close()
print("OK")
"""


def test_read_only_folder_gives_clear_error_and_loses_nothing(tmp_path):
    model_dir = str(tmp_path / "model")
    Checkpointer(model_dir, async_save=False).save(1, make_state(seed=1))
    os.chmod(model_dir, 0o555)
    command = [sys.executable, "-c", textwrap.dedent(_READ_ONLY), model_dir, os.path.dirname(__file__)]
    if os.geteuid() == 0:
        # Root ignores permission bits; without these capabilities it obeys them.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without util-linux setpriv: cannot make a folder read-only for us")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--", *command]
    try:
        result = subprocess.run(
            command, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=120
        )
    finally:
        os.chmod(model_dir, 0o755)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr
    assert "Permission denied" in result.stdout
    assert sorted(os.listdir(model_dir)) == ["checkpoint_1"]


_FILE_SIZE_LIMIT = """
import resource, signal, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from ckpt_helpers import assert_same_tree, make_state
from t5x.checkpointing import Checkpointer

ckpt = Checkpointer(sys.argv[1], compression="none")
ckpt.save(1, make_state(seed=1))
ckpt.wait_until_finished()
# A full disk, as the kernel reports it to one process: writes past 64 KiB fail.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
big = make_state(seed=2)
big["target"]["huge"] = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
ckpt.save(2, big)
try:
    ckpt.wait_until_finished()
except OSError as error:
    assert "target.huge" in str(error), error
    print("FAILED AS EXPECTED:", str(error)[:200])
else:
    raise SystemExit("a write past the size limit did not fail")
assert ckpt.all_steps() == [1]
assert_same_tree(ckpt.restore(1).state, make_state(seed=1))
print("OK")
"""


def test_full_disk_fails_save_and_loses_nothing(tmp_path):
    helpers = os.path.dirname(os.path.abspath(__file__))
    result = run_script(_FILE_SIZE_LIMIT, str(tmp_path), helpers, check=False)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_1"]


@pytest.mark.parametrize("async_save", [True, False])
def test_state_that_cannot_be_stored_is_rejected(tmp_path, async_save):
    ckpt = Checkpointer(tmp_path, async_save=async_save)
    with pytest.raises(ValueError, match="'target'"):
        ckpt.save(1, {"params": {}})
    ckpt.close()
