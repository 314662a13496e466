"""Serializes jax2tf's StableHLO at a version the installed TensorFlow can read.

jax2tf (native serialization, the only kind JAX still has) writes the exported
computation as a StableHLO portable artifact targeting "four weeks old" by JAX's
own clock: JAX 0.12 writes 1.18, while TensorFlow 2.21's ``XlaCallModule`` reads up
to 1.13.7 and refuses newer ops (``vhlo.custom_call_v2``). StableHLO artifacts are
downgradable within its compatibility window, so the export targets the older of
the two versions. JAX exposes no public option for the target, hence the patch of
its one serialization helper, scoped to the export.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def tensorflow_stablehlo_version() -> str:
    """The newest StableHLO version the installed TensorFlow deserializes."""
    from tensorflow.compiler.mlir.stablehlo import stablehlo as tf_stablehlo

    return str(tf_stablehlo.get_current_version())


def jax_stablehlo_version() -> str:
    """The StableHLO version JAX targets by default (its four-week compatibility window)."""
    from jax._src.lib.mlir.dialects import hlo

    return str(hlo.get_version_from_compatibility_requirement(hlo.StablehloCompatibilityRequirement.WEEK_4))


def target_version() -> str:
    """The older of JAX's default target and TensorFlow's newest readable version."""
    return min(jax_stablehlo_version(), tensorflow_stablehlo_version(), key=_version_tuple)


@contextlib.contextmanager
def serialize_for_tensorflow() -> Iterator[str]:
    """Within the block, jax.export (and so jax2tf) writes StableHLO at ``target_version()``."""
    from jax._src import xla_bridge
    from jax._src.export import _export
    from jax._src.lib import _jax

    version = target_version()
    original = _export._module_to_bytecode

    def to_bytecode(module):  # type: ignore[no-untyped-def]
        backend = xla_bridge.get_backend()
        return _jax.mlir.serialize_portable_artifact(module, version, backend.serialize_with_sdy)

    _export._module_to_bytecode = to_bytecode
    try:
        yield version
    finally:
        _export._module_to_bytecode = original
