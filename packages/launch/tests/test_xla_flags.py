"""The launcher's XLA defaults: added once, never over a user's own setting, and in effect for jobs."""

import subprocess
import sys

from t5x.launch._xla_flags import CPU_DEFAULTS, add_xla_defaults


def test_defaults_are_appended_to_existing_flags():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    add_xla_defaults(env)
    flags = env["XLA_FLAGS"].split()
    assert flags[0] == "--xla_force_host_platform_device_count=8"
    assert [f"--{k}={v}" for k, v in CPU_DEFAULTS.items()] == flags[1:]
    add_xla_defaults(env)
    assert env["XLA_FLAGS"].split() == flags  # idempotent


def test_a_users_own_value_wins():
    name = next(iter(CPU_DEFAULTS))
    env = {"XLA_FLAGS": f"--{name}=dot"}
    add_xla_defaults(env)
    assert env["XLA_FLAGS"] == f"--{name}=dot"


def test_empty_environment_gets_only_the_defaults():
    env: dict[str, str] = {}
    add_xla_defaults(env)
    assert env["XLA_FLAGS"] == " ".join(f"--{k}={v}" for k, v in CPU_DEFAULTS.items())


def test_xla_accepts_the_flags():
    # XLA aborts the process on an unknown flag, so a backend that starts proves the names are right.
    code = "import os, jax; from t5x.launch._xla_flags import add_xla_defaults; add_xla_defaults(os.environ); print(jax.numpy.ones(2).sum())"
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2.0"
