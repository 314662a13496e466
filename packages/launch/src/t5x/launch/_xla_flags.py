"""XLA defaults the launcher sets for its jobs before JAX starts its backend."""

from __future__ import annotations

from collections.abc import MutableMapping

# XLA:CPU hands matmuls, reductions and elementwise fusions to YNNPACK by default. Its
# float32 results are as precise, and a float32 DEC-S train step is as fast either way, but
# the built-in demo (1000 steps, fixed seeds) ends at 54% exact match with it against 78%
# without: that run is sensitive to the last bits of float32 rounding, and it was
# validated with YNNPACK off. bfloat16 matmuls (`matmul_dtype="bfloat16"`) need YNNPACK for
# AMX: `XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=individual_dot` (a 2048^3 bf16
# product: 1.3 TFLOP/s on the 2-core Xeon here, 0.24 without). Other backends ignore the flag.
CPU_DEFAULTS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def add_xla_defaults(environ: MutableMapping[str, str]) -> None:
    """Appends each default flag to ``environ["XLA_FLAGS"]`` unless the user already set it.

    Takes effect only for a JAX backend that has not started yet (XLA reads the
    flags once, when the backend is created).
    """
    flags = environ.get("XLA_FLAGS", "")
    added = [f"--{name}={value}" for name, value in CPU_DEFAULTS.items() if f"--{name}" not in flags]
    if added:
        environ["XLA_FLAGS"] = " ".join(filter(None, [flags, *added]))
