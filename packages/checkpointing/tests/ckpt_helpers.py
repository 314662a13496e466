"""Shared helpers: small T5X-shaped train states with Adafactor-like slots."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np


def make_state(seed: int = 0, step: int = 7) -> dict:
    """A T5X state dict: params (one bfloat16), factored and unfactored slots, an int step."""
    rng = np.random.default_rng(seed)

    def normal(*shape, dtype=np.float32):
        return rng.standard_normal(shape).astype(dtype)

    target = {
        "encoder": {
            "layers_0": {
                "attention": {"query": {"kernel": normal(16, 8)}, "out": {"kernel": normal(8, 16)}},
                "pre_attention_layer_norm": {"scale": normal(16)},
            },
        },
        "token_embedder": {"embedding": normal(40, 16, dtype=jnp.bfloat16)},
    }
    param_states = {
        "encoder": {
            "layers_0": {
                "attention": {
                    "query": {
                        "kernel": {"v_row": normal(16), "v_col": normal(8), "v": np.zeros((1,), np.float32)}
                    },
                    "out": {
                        "kernel": {"v_row": normal(8), "v_col": normal(16), "v": np.zeros((1,), np.float32)}
                    },
                },
                "pre_attention_layer_norm": {
                    "scale": {
                        "v_row": np.zeros((1,), np.float32),
                        "v_col": np.zeros((1,), np.float32),
                        "v": normal(16),
                    }
                },
            },
        },
        "token_embedder": {
            "embedding": {"v_row": normal(40), "v_col": normal(16), "v": np.zeros((1,), np.float32)}
        },
    }
    return {"target": target, "state": {"step": np.int32(step), "param_states": param_states}}


def assert_same_tree(got, want, path="state"):
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{path}: expected a dict, got {type(got).__name__}"
        assert set(got) == set(want), f"{path}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_same_tree(got[key], want[key], f"{path}/{key}")
        return
    got_array, want_array = np.asarray(got), np.asarray(want)
    assert got_array.shape == want_array.shape, f"{path}: shape {got_array.shape} != {want_array.shape}"
    assert got_array.dtype == want_array.dtype, f"{path}: dtype {got_array.dtype} != {want_array.dtype}"
    np.testing.assert_array_equal(got_array, want_array, err_msg=path)


def run_script(
    code: str,
    *args: str,
    devices: int = 1,
    timeout: float = 120,
    check: bool = True,
    env_extra: dict | None = None,
) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh Python with ``devices`` virtual CPU devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env.update(env_extra or {})
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"script failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result
