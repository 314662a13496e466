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

# Options of XLA:CPU's own (``--xla_backend_extra_options=key=value``). XLA:CPU compiles a
# while loop that its cost model rates below this many bytes into one single-threaded
# kernel, without its thunks' threaded and library-backed matmuls. A decoding loop rates
# below the 1 kB default although every step reads all the weights; at batch 1 its matmuls
# then ran up to 2x slower (greedy DEC-S: 66 -> 77 generated tokens/s with the pass off,
# ENCDEC-S: 109 -> 123; batch 8 was not affected).
BACKEND_DEFAULTS = {"xla_cpu_small_while_loop_byte_threshold": "0"}


def _append_missing(environ: MutableMapping[str, str], flags: dict[str, str]) -> None:
    """Appends each of ``flags``' values to ``XLA_FLAGS`` whose key does not appear there yet."""
    current = environ.get("XLA_FLAGS", "")
    added = [flag for probe, flag in flags.items() if probe not in current]
    if added:
        environ["XLA_FLAGS"] = " ".join(filter(None, [current, *added]))


def add_backend_defaults(environ: MutableMapping[str, str]) -> None:
    """Appends each of ``BACKEND_DEFAULTS`` to ``environ["XLA_FLAGS"]`` unless the user set it.

    XLA merges repeated ``--xla_backend_extra_options`` flags, so a user's other options
    stay as they are. Library users who decode outside ``t5x-launch`` call this before JAX
    starts its backend.
    """
    _append_missing(
        environ, {f"{k}=": f"--xla_backend_extra_options={k}={v}" for k, v in BACKEND_DEFAULTS.items()}
    )


def add_xla_defaults(environ: MutableMapping[str, str]) -> None:
    """Appends each default flag to ``environ["XLA_FLAGS"]`` unless the user already set it.

    Both ``CPU_DEFAULTS`` and ``BACKEND_DEFAULTS``. Takes effect only for a JAX backend that
    has not started yet (XLA reads the flags once, when the backend is created).
    """
    _append_missing(environ, {f"--{name}": f"--{name}={value}" for name, value in CPU_DEFAULTS.items()})
    add_backend_defaults(environ)
