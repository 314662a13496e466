import os
import pathlib
import subprocess
import sys

import pytest


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
