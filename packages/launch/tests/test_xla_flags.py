"""The launcher's XLA flags: its CPU defaults and a config's own, added once, never over a
user's own setting, and in effect for jobs."""

import subprocess
import sys

import pytest

from t5x.launch._xla_flags import BACKEND_DEFAULTS, add_backend_defaults, add_config_flags, add_xla_defaults

DEFAULT_FLAGS = [f"--xla_backend_extra_options={k}={v}" for k, v in BACKEND_DEFAULTS.items()]


def test_defaults_are_appended_to_existing_flags():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    add_xla_defaults(env)
    flags = env["XLA_FLAGS"].split()
    assert flags[0] == "--xla_force_host_platform_device_count=8"
    assert flags[1:] == DEFAULT_FLAGS
    add_xla_defaults(env)
    assert env["XLA_FLAGS"].split() == flags  # idempotent


def test_a_users_own_value_wins():
    key = next(iter(BACKEND_DEFAULTS))
    own = f"--xla_backend_extra_options={key}=4096"
    env = {"XLA_FLAGS": own}
    add_xla_defaults(env)
    assert env["XLA_FLAGS"] == own


def test_a_users_other_backend_options_are_kept():
    env = {"XLA_FLAGS": "--xla_backend_extra_options=xla_cpu_disable_loop_unrolling=1"}
    add_backend_defaults(env)
    assert env["XLA_FLAGS"].split() == [
        "--xla_backend_extra_options=xla_cpu_disable_loop_unrolling=1",
        *DEFAULT_FLAGS,
    ]


def test_empty_environment_gets_only_the_defaults():
    env: dict[str, str] = {}
    add_xla_defaults(env)
    assert env["XLA_FLAGS"].split() == DEFAULT_FLAGS


def test_a_configs_flags_are_added_unless_the_user_named_them():
    env = {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=individual_dot"}
    add_config_flags(env, ["--xla_cpu_experimental_ynn_fusion_type=", "--xla_cpu_enable_fast_math=false"])
    assert env["XLA_FLAGS"].split() == [
        "--xla_cpu_experimental_ynn_fusion_type=individual_dot",
        "--xla_cpu_enable_fast_math=false",
    ]
    empty: dict[str, str] = {}
    add_config_flags(empty, ("--xla_cpu_experimental_ynn_fusion_type=",))
    assert empty == {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type="}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--xla_a=1", "must be a list of XLA flags like"),
        (["xla_a=1"], "each XLA flag must be a string '--name=value', got 'xla_a=1'"),
        (["--xla_a"], "got '--xla_a'"),
        ([3], "got 3"),
    ],
)
def test_a_configs_malformed_flags_are_refused(flags, message):
    with pytest.raises(ValueError, match=message) as caught:
        add_config_flags({}, flags, "the gin macro XLA_FLAGS")
    assert str(caught.value).startswith("the gin macro XLA_FLAGS")


def test_xla_accepts_the_flags():
    # XLA aborts the process on an unknown flag, so a backend that starts proves the names are right.
    code = (
        "import os, jax; from t5x.launch._xla_flags import add_xla_defaults; add_xla_defaults(os.environ); "
        "os.environ['XLA_FLAGS'] += ' --xla_cpu_experimental_ynn_fusion_type='; print(jax.numpy.ones(2).sum())"
    )
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2.0"


_LOOP = """
import os, sys
if sys.argv[1] == "defaults":
    from t5x.launch import add_backend_defaults
    add_backend_defaults(os.environ)
import jax, jax.numpy as jnp
kernel, x = jnp.ones((512, 4096)), jnp.ones((1, 512))
step = lambda i, x: x + (x @ kernel)[:, :512]
compiled = jax.jit(lambda x: jax.lax.fori_loop(0, 4, step, x)).lower(x).compile()
print("single kernel" if "xla_cpu_small_call" in compiled.as_text() else "thunks")
"""


def test_backend_defaults_keep_a_decoding_sized_loop_out_of_a_single_kernel():
    # Without the defaults XLA:CPU rates this loop "small" and emits it as one kernel.
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    results = {}
    for mode in ("plain", "defaults"):
        out = subprocess.run(
            [sys.executable, "-c", _LOOP, mode], capture_output=True, text=True, env=env, timeout=120
        )
        assert out.returncode == 0, out.stderr
        results[mode] = out.stdout.strip()
    assert results == {"plain": "single kernel", "defaults": "thunks"}


def test_the_demos_numerics_come_from_its_gin_file(monkeypatch):
    import gin

    from t5x.launch import GinArgs, GinConfigError, parse_gin
    from t5x.launch._xla_flags import add_gin_flags

    gin.clear_config()
    try:
        parse_gin(GinArgs(("runs/demo.gin",), (), (), ()))
        env: dict[str, str] = {}
        add_gin_flags(env)
        assert env == {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type="}
        gin.bind_parameter("XLA_FLAGS/macro.value", "--oops")
        with pytest.raises(GinConfigError, match="the gin macro XLA_FLAGS must be a list"):
            add_gin_flags({})
        gin.clear_config()
        parse_gin(GinArgs(("runs/pretrain.gin",), (), (), ()))  # no XLA_FLAGS macro: nothing added
        untouched: dict[str, str] = {}
        add_gin_flags(untouched)
        assert untouched == {}
    finally:
        gin.clear_config()
