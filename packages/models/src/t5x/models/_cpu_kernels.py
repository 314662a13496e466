"""Decoding steps through CPU kernels that read the weights and the KV cache once.

A decoding step multiplies a few rows (batch x beams) by every decoder kernel and attends
one query per row to the whole cache, so it streams all the weights and the cache from
memory at every step. XLA:CPU's library products repack the kernel on every call and, at
8 rows, read it at about a third of this machine's bandwidth (ENCDEC-S: 12.9 ms of
products per step); its one-query attention reads the cache at about half. The kernels
of ``cpu_kernels.cc`` read each operand front to back: the weights packed once per decode
call into 32-column blocks, ``[out / 32, in, 32]`` (the same products: 4.4 ms per step at
8 rows, 3.4 ms at one), and the cache in its ``[batch, heads, head_dim, length]`` layout.

They are compiled on first use with a C++ compiler (the one named, else ``g++``, ``c++`` or
``clang++``) for this CPU, cached in a folder (default ``~/.cache/t5x``) and registered with
XLA as FFI targets, once per process. Whether a model decodes with them is its
``cpu_kernels`` option (:class:`t5x.models.CpuKernels`); nothing here reads the environment.
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
from collections.abc import Mapping, Sequence
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
    "t5x_cache_attention": "T5xCacheAttention",
    "t5x_cache_step": "T5xCacheStep",
    "t5x_pack_kernel": "T5xPackKernel",
}
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")


def pack_kernel(kernel: jax.Array) -> jax.Array:
    """``[in, out]`` -> ``[ceil(out / 32), in, 32]``, the last block zero-padded."""
    k, n = kernel.shape
    if _registered and jnp.dtype(kernel.dtype) == jnp.float32:
        # XLA:CPU's transpose moved the weights at ~2 GB/s: 0.2 s of every DEC-S decode call.
        out_type = jax.ShapeDtypeStruct((-(-n // _BLOCK), k, _BLOCK), jnp.float32)
        return jax.ffi.ffi_call("t5x_pack_kernel", out_type)(kernel)
    padded = jnp.pad(jnp.asarray(kernel, jnp.float32), ((0, 0), (0, -n % _BLOCK)))
    return jnp.transpose(padded.reshape(k, -1, _BLOCK), (1, 0, 2))


def packed_matmul(x: jax.Array, packed: jax.Array, features: int) -> jax.Array:
    """``x [..., in] @ kernel [in, features]``, given ``packed = pack_kernel(kernel)``."""
    return packed_matmuls(x, [(packed, features)])[0]


def packed_matmuls(x: jax.Array, kernels: Sequence[tuple[jax.Array, int]]) -> list[jax.Array]:
    """``x @ kernel`` for each ``(pack_kernel(kernel), features)`` of ``kernels``, in one call.

    A step's query, key and value (or its gated MLP's inputs) then take one kernel call, and
    their column blocks are split over the threads together.
    """
    rows = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    out_types = [jax.ShapeDtypeStruct((rows.shape[0], p.shape[0] * _BLOCK), jnp.float32) for p, _ in kernels]
    call = jax.ffi.ffi_call("t5x_packed_matmul", out_types, vmap_method="sequential")
    outs = call(rows, *(p for p, _ in kernels))
    return [
        out[:, :features].reshape(*x.shape[:-1], features)
        for out, (_, features) in zip(outs, kernels, strict=True)
    ]


def cache_attention(query: jax.Array, key: jax.Array, value: jax.Array, bias: jax.Array | None) -> jax.Array:
    """``softmax(q . k + bias) . v`` for each query of each group, in one kernel.

    Args:
      query: ``[..., queries, depth]``: a group's queries (the beams or samples of one
        example) share its keys and values, read from memory once for them all.
      key: ``[..., depth, length]`` (the cache layout).
      value: ``[..., depth, length]``.
      bias: broadcastable to ``[..., queries, length]``, or None; masked positions carry
        about ``-1e10`` (a masked tail is skipped, its weights being exactly zero).

    Returns:
      ``[..., queries, depth]``.
    """
    lead, queries, depth, length = query.shape[:-2], query.shape[-2], key.shape[-2], key.shape[-1]
    groups = math.prod(lead)
    bias = jnp.zeros((), jnp.float32) if bias is None else bias.astype(jnp.float32)
    bias = jnp.broadcast_to(bias, (*lead, queries, length)).reshape(groups, queries, length)
    out_type = jax.ShapeDtypeStruct((groups, queries, depth), jnp.float32)
    call = jax.ffi.ffi_call("t5x_cache_attention", out_type, vmap_method="sequential")
    out = call(
        query.reshape(groups, queries, depth).astype(jnp.float32),
        key.reshape(groups, depth, length),
        value.reshape(groups, depth, length),
        bias,
    )
    return out.reshape(*lead, queries, depth)


def cache_step(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    cached_key: jax.Array,
    cached_value: jax.Array,
    index: jax.Array,
    bias: jax.Array | None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A decoding step's self-attention: writes ``key`` / ``value`` into the caches, attends.

    Args:
      query, key, value: ``[batch, heads, depth]``, one position per row.
      cached_key, cached_value: ``[batch, heads, depth, length]``; updated in place (the
        results alias them), so the caller hands them over.
      index: ``[1]`` or ``[batch]`` int32, the position each row writes (clamped into the
        cache, as ``lax.dynamic_update_slice``).
      bias: broadcastable to ``[batch, heads, length]``, or None; as in :func:`cache_attention`.

    Returns:
      ``(out [batch, heads, depth], cached_key, cached_value)`` after the write.
    """
    batch, heads, depth, length = cached_key.shape
    bias = jnp.zeros((), jnp.float32) if bias is None else bias.astype(jnp.float32)
    # The caches go in with their own shape: XLA copied a reshaped one before the in-place write.
    out_types = (
        jax.ShapeDtypeStruct(cached_key.shape, jnp.float32),
        jax.ShapeDtypeStruct(cached_value.shape, jnp.float32),
        jax.ShapeDtypeStruct((batch, heads, depth), jnp.float32),
    )
    call = jax.ffi.ffi_call(
        "t5x_cache_step", out_types, input_output_aliases={0: 0, 1: 1}, vmap_method="sequential"
    )
    new_key, new_value, out = call(
        cached_key,
        cached_value,
        query.astype(jnp.float32),
        key.astype(jnp.float32),
        value.astype(jnp.float32),
        jnp.asarray(index, jnp.int32).reshape(-1),
        jnp.broadcast_to(bias, (batch, heads, length)),
    )
    return out, new_key, new_value


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
    """``module``'s packed ``kernel`` for a step of few rows (``inputs [..., in]``), else None.

    For a module whose step multiplies through the CPU kernels; a step of more than
    :data:`MAX_ROWS` rows keeps XLA's product.

    Raises:
      ValueError: when the ``packed_kernels`` collection lacks the module's kernel.
    """
    if math.prod(inputs.shape[:-1]) > MAX_ROWS:
        return None
    packed: jax.Array | None = module.get_variable(PACKED, "kernel")
    if packed is None:
        raise ValueError(
            f"{module.name}: a step on the CPU kernels needs the {PACKED!r} collection with this "
            "layer's packed kernel (`pack_decode_kernels` of the parameters)"
        )
    return packed


def packed_kernels(module: nn.Module, names: Sequence[str], inputs: jax.Array) -> list[jax.Array] | None:
    """The packed ``kernel`` of each of ``module``'s submodules ``names``, for a step of few
    rows (``inputs [..., in]``); None when the step has more rows or a kernel is missing
    (each submodule then multiplies on its own, and says what it lacks).
    """
    if math.prod(inputs.shape[:-1]) > MAX_ROWS:
        return None
    found: list[Any] = [module.get_variable(PACKED, name) for name in names]
    if not all(isinstance(sub, Mapping) and "kernel" in sub for sub in found):
        return None
    return [sub["kernel"] for sub in found]


_registered = False  # XLA's FFI registry is per process: the kernels register once


def unavailable_reason(
    cache_dir: str | os.PathLike[str] | None = None, compiler: str | None = None
) -> str | None:
    """None when decoding can use the CPU kernels here, else why not.

    They need JAX's CPU backend with one device; the first call that gets that far builds
    the kernels (or finds them built) in ``cache_dir`` with ``compiler`` and registers them.
    A failed build is tried once per ``(cache_dir, compiler)``.
    """
    backend = jax.default_backend()
    if backend != "cpu":
        return f"JAX's backend is {backend}, not cpu"
    if jax.device_count() != 1:
        return f"there are {jax.device_count()} devices (the kernels run on one)"
    if _registered:
        return None
    return _load(Path(cache_dir) if cache_dir else Path.home() / ".cache" / "t5x", compiler)


def cpu_kernels_ready(cache_dir: str | os.PathLike[str] | None = None, compiler: str | None = None) -> bool:
    """Whether decoding can use the CPU kernels in this process (see :func:`unavailable_reason`)."""
    return unavailable_reason(cache_dir, compiler) is None


@functools.cache
def _load(cache_dir: Path, compiler: str | None) -> str | None:
    global _registered
    try:
        library = ctypes.CDLL(str(_build(cache_dir, compiler)))
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or err
        return f"the CPU kernels did not build: {detail}"
    for target, symbol in _TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    _registered = True
    return None


def _build(cache: Path, compiler: str | None) -> Path:
    """The compiled kernels for this CPU and jaxlib (whose FFI headers they use): cached, else built."""
    source = resources.files("t5x.models").joinpath(_SOURCE).read_bytes()
    digest = hashlib.sha256(
        b"\0".join([source, metadata.version("jaxlib").encode(), " ".join(_FLAGS).encode(), _cpu_identity()])
    ).hexdigest()[:16]
    target = cache / f"cpu_kernels-{digest}.so"
    if target.exists():
        return target
    compiler = compiler or next(
        (found for name in ("g++", "c++", "clang++") if (found := shutil.which(name))), None
    )
    if compiler is None:
        raise OSError("no C++ compiler found (g++, c++ or clang++; or name one: CpuKernels(compiler=...))")
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
