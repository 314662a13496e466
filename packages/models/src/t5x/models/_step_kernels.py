"""Which products a decoding step runs: the model's ``cpu_kernels`` option and the per-call choice.

A decode call runs its steps in one of three ways, chosen once per call by the model
(:func:`step_kernels`) and handed to the decoder's modules as their ``step_kernels``
attribute:

- ``"xla"``: XLA's products (training, prompt passes and scoring always run this way);
- ``"packed"``: the CPU kernels of ``_cpu_kernels`` (weights packed once per call into the
  ``packed_kernels`` collection, attention reading the KV cache through two more kernels);
- ``"joined"``: XLA's products, with a one-row step's query/key/value and gated MLP inputs
  each joined into one kernel once per call (the ``joined_kernels`` collection, ``_joined``).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, Literal, cast

from t5x.models._cpu_kernels import MAX_ROWS, float32_only, unavailable_reason

StepKernels = Literal["xla", "packed", "joined"]
STEP_KERNELS: tuple[str, ...] = ("xla", "packed", "joined")


@dataclasses.dataclass(frozen=True)
class CpuKernels:
    """Whether a model's decoding steps run on the CPU kernels, and how they are built.

    Attributes:
      enabled: ``"auto"`` (default): where they can run (JAX's CPU backend with one device,
        float32 unscanned layers, a step of at most 64 rows) and they build, else XLA's
        products (with a warning when the build failed). ``True``: the same, but a decode
        call raises where the backend or the build rules them out (and the model refuses
        scanned or non-float32 layers); steps of more than 64 rows still use XLA's products,
        which are as fast there. ``False``: never.
      cache_dir: the folder the compiled kernels are kept in (default ``~/.cache/t5x``).
      compiler: the C++ compiler to build them with (default: ``g++``, ``c++`` or
        ``clang++``, the first on ``PATH``).
    """

    enabled: bool | Literal["auto"] = "auto"
    cache_dir: str | os.PathLike[str] | None = None
    compiler: str | None = None

    def __post_init__(self) -> None:
        if self.enabled not in (True, False, "auto") or not isinstance(self.enabled, (bool, str)):
            raise ValueError(f"CpuKernels.enabled must be True, False or 'auto', got {self.enabled!r}")

    @classmethod
    def of(cls, value: Any) -> CpuKernels:
        """``value`` as a ``CpuKernels``: one already, or its ``enabled`` (True, False, ``"auto"``).

        Raises:
          ValueError: for any other value.
        """
        if isinstance(value, CpuKernels):
            return value
        if value in (True, False, "auto") and isinstance(value, (bool, str)):
            return cls(enabled=cast("bool | Literal['auto']", value))
        raise ValueError(f"cpu_kernels must be True, False, 'auto' or a t5x.models.CpuKernels, got {value!r}")


def check_config(option: CpuKernels, config: Any, who: str) -> None:
    """Raises ValueError when ``option`` demands the kernels for a ``config`` they cannot run."""
    if option.enabled is not True:
        return
    if config.scan_layers:
        raise ValueError(f"{who}: cpu_kernels=True needs unscanned layers, got scan_layers=True")
    if not float32_only(config.dtype, config.matmul_dtype):
        raise ValueError(
            f"{who}: cpu_kernels=True needs float32 layers, got dtype={config.dtype!r}, "
            f"matmul_dtype={config.matmul_dtype!r}"
        )


def step_kernels(option: CpuKernels, config: Any, rows: int, joins: bool) -> StepKernels:
    """How a decode call whose steps have ``rows`` rows runs them.

    Args:
      option: the model's ``cpu_kernels``.
      config: the network's config.
      rows: rows per step (batch x beams or samples).
      joins: whether the decoder has kernels to join (``join_decode_kernels`` not empty).

    Raises:
      RuntimeError: when ``option`` demands the CPU kernels and they cannot run here.
    """
    if config.scan_layers:
        return "xla"
    # More rows reuse each weight read often enough for XLA's library products (see MAX_ROWS).
    if option.enabled is not False and rows <= MAX_ROWS and float32_only(config.dtype, config.matmul_dtype):
        reason = unavailable_reason(option.cache_dir, option.compiler)
        if reason is None:
            return "packed"
        if option.enabled is True:
            raise RuntimeError(f"cpu_kernels=True, but decoding cannot use the CPU kernels: {reason}")
        if reason.startswith("the CPU kernels did not build"):
            warnings.warn(f"t5x.models: decoding uses XLA's products; {reason}", stacklevel=3)
    return "joined" if rows == 1 and joins else "xla"
