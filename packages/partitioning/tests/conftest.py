"""Gives every test in this package 8 virtual CPU devices.

XLA reads the device-count flag once, when JAX's CPU backend starts, so it is
set here, before any test module imports jax.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def devices():
    """The 8 virtual CPU devices."""
    found = jax.devices()
    if len(found) < 8:
        pytest.skip(
            f"needs 8 CPU devices but JAX started with {len(found)}: something imported jax before this "
            "package's conftest; run this package's tests in their own pytest process"
        )
    return found[:8]
