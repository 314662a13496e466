"""XLA defaults the launcher sets for its jobs before JAX starts its backend."""

from __future__ import annotations

from collections.abc import MutableMapping

# XLA:CPU hands matrix multiplies to YNNPACK by default. Its Eigen path used ~15% less
# CPU time for a DEC-S train step (tools/bench_train_step.py) on a busy 2-core machine,
# mostly on the large-vocabulary logits matmuls; idle, wall time was the same within noise
# (13.8 s vs 14.1 s). Other backends ignore the flag.
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
