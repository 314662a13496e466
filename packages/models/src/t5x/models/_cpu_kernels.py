"""Decoding steps through CPU kernels that read the weights and the KV cache once.

A decoding step multiplies a few rows (batch x beams) by every decoder kernel and attends
one query per row to the whole cache, so it streams all the weights and the cache from
memory at every step. XLA:CPU's library products repack the kernel on every call and, at
8 rows, read it at about a third of this machine's bandwidth (ENCDEC-S: 12.9 ms of
products per step); its one-query attention reads the cache at about half. The kernels
of ``cpu_kernels.cc`` read each operand front to back: the weights packed once per decode
call into 32-column blocks, ``[out / 32, in, 32]`` (the same products: 4.4 ms per step at
8 rows, 3.4 ms at one), and the cache in its ``[batch, heads, head_dim, length]`` layout.

They are compiled on first use with the system's C++ compiler (``$CXX``, ``g++``, ``c++``
or ``clang++``) for this CPU, cached under ``$T5X_CACHE_DIR`` (default ``~/.cache/t5x``)
and registered with XLA as FFI targets. Without a compiler, on other backends, with more
than one device, or with ``T5X_CPU_KERNELS=0``, decoding runs on XLA's products as before.
Float32 only; results differ from XLA's in the last bits (other summation orders).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Mapping
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# The variable collection `pack_decode_kernels` fills, mirroring the parameter tree.
PACKED = "packed_kernels"
# Most rows a step may have for the packed product. ENCDEC-S's step products here, packed vs
# XLA's: 2.8x as fast at 8 rows, 1.8x at 32, 1.2x at 64, 1.1x at 128; with more rows a
# library GEMM reuses each weight read more often, and prompt passes (thousands) keep it.
MAX_ROWS = 64

_BLOCK = 32
_SOURCE = "cpu_kernels.cc"
# FFI target -> the handler symbol cpu_kernels.cc exports for it.
_TARGETS = {
    "t5x_packed_matmul": "T5xPackedMatmul",
    "t5x_cache_logits": "T5xCacheLogits",
    "t5x_cache_values": "T5xCacheValues",
}
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")


def pack_kernel(kernel: jax.Array) -> jax.Array:
    """``[in, out]`` -> ``[ceil(out / 32), in, 32]``, the last block zero-padded."""
    k, n = kernel.shape
    padded = jnp.pad(jnp.asarray(kernel, jnp.float32), ((0, 0), (0, -n % _BLOCK)))
    return jnp.transpose(padded.reshape(k, -1, _BLOCK), (1, 0, 2))


def packed_matmul(x: jax.Array, packed: jax.Array, features: int) -> jax.Array:
    """``x [..., in] @ kernel [in, features]``, given ``packed = pack_kernel(kernel)``."""
    rows = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    out_type = jax.ShapeDtypeStruct((rows.shape[0], packed.shape[0] * _BLOCK), jnp.float32)
    out = jax.ffi.ffi_call("t5x_packed_matmul", out_type, vmap_method="sequential")(rows, packed)
    return out[:, :features].reshape(*x.shape[:-1], features)


def cache_logits(query: jax.Array, cache: jax.Array) -> jax.Array:
    """``einsum("...d,...dl->...l")``: one query per group against keys laid out ``[..., depth, length]``."""
    return _over_groups("t5x_cache_logits", query, cache, cache.shape[-1])


def cache_values(weights: jax.Array, cache: jax.Array) -> jax.Array:
    """``einsum("...l,...dl->...d")``: attention weights per group against values laid out ``[..., depth, length]``."""
    return _over_groups("t5x_cache_values", weights, cache, cache.shape[-2])


def _over_groups(target: str, rows: jax.Array, cache: jax.Array, width: int) -> jax.Array:
    """``target`` on ``rows [..., in]`` and ``cache [..., depth, length]``, giving ``[..., width]``."""
    groups = math.prod(rows.shape[:-1])
    out_type = jax.ShapeDtypeStruct((groups, width), jnp.float32)
    call = jax.ffi.ffi_call(target, out_type, vmap_method="sequential")
    out = call(rows.reshape(groups, -1).astype(jnp.float32), cache.reshape(groups, *cache.shape[-2:]))
    return out.reshape(*rows.shape[:-1], width)


def pack_decode_kernels(params: Mapping[str, Any]) -> dict[str, Any]:
    """The ``packed_kernels`` collection: every 2-D ``kernel`` of ``params``, packed."""
    packed: dict[str, Any] = {}
    for key, sub in params.items():
        if isinstance(sub, Mapping):
            if found := pack_decode_kernels(sub):
                packed[key] = found
        elif key == "kernel" and jnp.ndim(sub) == 2:
            packed[key] = pack_kernel(sub)
    return packed


def float32_only(dtype: Any, matmul_dtype: Any) -> bool:
    """Whether a layer of ``dtype`` with ``matmul_dtype`` multiplies in float32, the kernels' only dtype."""
    f32 = jnp.dtype(jnp.float32)
    return jnp.dtype(dtype) == f32 and (matmul_dtype is None or jnp.dtype(matmul_dtype) == f32)


def packed_kernel(module: nn.Module, inputs: jax.Array) -> jax.Array | None:
    """``module``'s packed ``kernel`` when it has one and ``inputs [..., in]`` are few rows."""
    if math.prod(inputs.shape[:-1]) > MAX_ROWS or not module.has_variable(PACKED, "kernel"):
        return None
    return module.get_variable(PACKED, "kernel")


@functools.cache
def cpu_kernels_ready() -> bool:
    """Whether decoding may use the CPU kernels here (built and registered on the first call).

    Decided once per process: ``T5X_CPU_KERNELS`` is read then.
    """
    if os.environ.get("T5X_CPU_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if jax.default_backend() != "cpu" or jax.device_count() != 1:
        return False
    try:
        library = ctypes.CDLL(str(_build()))
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or err
        warnings.warn(
            f"t5x.models: decoding uses XLA's products; the CPU kernels did not build: {detail}",
            stacklevel=2,
        )
        return False
    for target, symbol in _TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    return True


def _build() -> Path:
    """The compiled kernels for this CPU and jaxlib (whose FFI headers they use): cached, else built."""
    source = resources.files("t5x.models").joinpath(_SOURCE).read_bytes()
    digest = hashlib.sha256(
        b"\0".join([source, metadata.version("jaxlib").encode(), " ".join(_FLAGS).encode(), _cpu_identity()])
    ).hexdigest()[:16]
    cache = Path(os.environ.get("T5X_CACHE_DIR") or Path.home() / ".cache" / "t5x")
    target = cache / f"cpu_kernels-{digest}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CXX") or next(
        (found for name in ("g++", "c++", "clang++") if (found := shutil.which(name))), None
    )
    if compiler is None:
        raise OSError("no C++ compiler found (set CXX)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        src, out = Path(scratch) / _SOURCE, Path(scratch) / target.name
        src.write_bytes(source)
        subprocess.run(
            [compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}", str(src), "-o", str(out)],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(out, target)  # atomic: a concurrent build leaves one whole file
    return target


def _cpu_identity() -> bytes:
    """What ``-march=native`` compiles for: the CPU's model and feature flags where known."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted).encode()
