import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # pytest's importlib mode adds no path
import _tiny


def run_launch(*args: str, cwd: pathlib.Path, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    """Runs ``t5x-launch ARGS`` as a user would, from the installed console script."""
    script = pathlib.Path(sys.executable).with_name("t5x-launch")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise AssertionError(
            f"t5x-launch {' '.join(args)} exited {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
        )
    return result


@pytest.fixture
def launch():
    return run_launch


@pytest.fixture(scope="session", autouse=True)
def shared_compilation_cache(tmp_path_factory):
    """One JAX persistent compilation cache for every process the tests start.

    Most launches here compile the same tiny programs; the first compiles and
    stores them, the rest load them (same program, same executable). Kept for
    the session only, so no run reads another run's entries.
    """
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:  # the caller chose one
        yield
        return
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path_factory.mktemp("jax-compilation-cache"))
    try:
        yield
    finally:
        del os.environ["JAX_COMPILATION_CACHE_DIR"]


@pytest.fixture(scope="session")
def encdec_reference(tmp_path_factory) -> pathlib.Path:
    """The tiny encoder-decoder trained REFERENCE_STEPS steps with a checkpoint every step.

    Trained once for every module that needs a trained model folder: read it as
    it is, or copy it (`_tiny.copy_model_dir`) before changing anything in it.
    """
    tmp = tmp_path_factory.mktemp("encdec-reference")
    model_dir = tmp / "model"
    result = _tiny.run_raw(_tiny.reference_job(model_dir), tmp)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert _tiny.steps_of(model_dir) == list(range(1, _tiny.REFERENCE_STEPS + 1))
    return model_dir
