"""Which backend a job will run on (decided before JAX starts one), and the CPU kernels' overrides.

The launcher's CPU defaults (glibc malloc tunables, XLA:CPU flags) must be set before JAX
creates its backend, and glibc's only when the process starts, so the answer cannot come
from ``jax.default_backend()``. The rule, in order:

1. ``JAX_PLATFORMS`` (or the older ``JAX_PLATFORM_NAME``) set: a CPU job when its first
   platform is ``cpu``. JAX tries the listed platforms in order, so the first is the one
   the user asked for.
2. Otherwise a CPU job unless the host shows an accelerator's device files: TPU VMs expose
   ``/dev/accel*`` (v2-v4) or ``/dev/vfio/<n>`` (v5 and later), NVIDIA GPUs
   ``/dev/nvidia<n>``, AMD GPUs ``/dev/kfd``. JAX picks such a device when its plugin is
   installed; without the plugin it falls back to the CPU, and the job only misses the CPU
   defaults, which is the safe side: they are never applied on a TPU or GPU host unless
   ``JAX_PLATFORMS=cpu`` says so.
"""

from __future__ import annotations

import dataclasses
import glob
from collections.abc import Callable, Mapping
from typing import Any

from t5x.launch._errors import ConfigurationError

ACCELERATOR_DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*", "/dev/kfd")


def accelerator_devices(matches: Callable[[str], list[str]] = glob.glob) -> list[str]:
    """The accelerator device files present on this host (see the module docstring)."""
    return [path for pattern in ACCELERATOR_DEVICE_PATTERNS for path in sorted(matches(pattern))]


def job_runs_on_cpu(environ: Mapping[str, str], devices: list[str] | None = None) -> bool:
    """Whether a JAX job started with ``environ`` will run on the CPU backend.

    Args:
      environ: the job's environment.
      devices: the host's accelerator device files (default: :func:`accelerator_devices`).
    """
    requested = environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME") or ""
    first = requested.split(",")[0].strip().lower()
    if first:
        return first == "cpu"
    return not (accelerator_devices() if devices is None else devices)


# The command line's overrides of a model's `cpu_kernels` option (t5x.models.CpuKernels).
CPU_KERNELS_ENV = "T5X_CPU_KERNELS"
CPU_KERNELS_CACHE_ENV = "T5X_CACHE_DIR"
CPU_KERNELS_COMPILER_ENV = "CXX"
_SWITCH = {
    **dict.fromkeys(("0", "false", "no", "off"), False),
    **dict.fromkeys(("1", "true", "yes", "on"), True),
    "auto": "auto",
}


def cpu_kernels_override(environ: Mapping[str, str], configured: Any) -> Any:
    """A model's ``cpu_kernels`` option with the environment's overrides applied.

    ``T5X_CPU_KERNELS`` (``0``/``1``/``auto``, or ``off``/``on``, ``false``/``true``, ...)
    replaces ``enabled``; ``T5X_CACHE_DIR`` the folder the kernels are built into; ``CXX``
    the compiler. Without any of them ``configured`` is returned as it is.

    Args:
      environ: the job's environment.
      configured: the model's ``cpu_kernels`` (a ``t5x.models.CpuKernels``).

    Raises:
      ConfigurationError: for a ``T5X_CPU_KERNELS`` value it does not know.
    """
    changes: dict[str, Any] = {}
    if CPU_KERNELS_ENV in environ:
        value = environ[CPU_KERNELS_ENV].strip().lower()
        if value not in _SWITCH:
            raise ConfigurationError(
                f"the environment variable {CPU_KERNELS_ENV}={environ[CPU_KERNELS_ENV]!r}: "
                "expected 0, 1 or auto (or off / on)"
            )
        changes["enabled"] = _SWITCH[value]
    if environ.get(CPU_KERNELS_CACHE_ENV):
        changes["cache_dir"] = environ[CPU_KERNELS_CACHE_ENV]
    if environ.get(CPU_KERNELS_COMPILER_ENV):
        changes["compiler"] = environ[CPU_KERNELS_COMPILER_ENV]
    return dataclasses.replace(configured, **changes) if changes else configured


def apply_cpu_kernels_override(model: Any, environ: Mapping[str, str]) -> None:
    """Sets ``model.cpu_kernels`` from :func:`cpu_kernels_override` (models without the option are left alone)."""
    if hasattr(model, "cpu_kernels"):
        model.cpu_kernels = cpu_kernels_override(environ, model.cpu_kernels)
