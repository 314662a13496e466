"""XLA defaults the launcher sets for its jobs before JAX starts its backend."""

from __future__ import annotations

from collections.abc import MutableMapping

# XLA:CPU hands matrix multiplies to YNNPACK by default; on the benchmark models
# (tools/bench_train_step.py) its Eigen path trains 10-15% faster, chiefly on the
# large-vocabulary logits matmuls. The flag is ignored by other backends.
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
