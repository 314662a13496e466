"""Hugging Face model folders: ``config.json`` plus safetensors weights (never pickle)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

_WEIGHTS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_CONFIG = "config.json"


def _safetensors_numpy() -> Any:
    try:
        import safetensors.numpy as st_numpy
    except ImportError as err:  # optional dependency
        raise ImportError(
            "reading or writing Hugging Face folders needs the 'safetensors' package (pip install safetensors)"
        ) from err
    return st_numpy


def _load_file(path: str) -> dict[str, np.ndarray]:
    st_numpy = _safetensors_numpy()
    try:
        loaded = dict(st_numpy.load_file(path))
    except (TypeError, ValueError) as err:
        # numpy has no bfloat16: read those files through the raw format instead.
        if "bf16" not in str(err).lower() and "bfloat16" not in str(err).lower():
            raise
        return _load_bfloat16_file(path)
    # Recent safetensors hand bfloat16 back as ml_dtypes arrays; widen them like the fallback does.
    return {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in loaded.items()}


def _load_bfloat16_file(path: str) -> dict[str, np.ndarray]:
    import ml_dtypes

    dtypes = {
        "BF16": ml_dtypes.bfloat16,
        "F16": np.float16,
        "F32": np.float32,
        "F64": np.float64,
        "I64": np.int64,
        "I32": np.int32,
        "I8": np.int8,
        "U8": np.uint8,
        "BOOL": np.bool_,
    }
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in dtypes:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']!r}")
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[start:end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
        out[name] = arr.astype(np.float32) if info["dtype"] == "BF16" else arr.copy()
    return out


def read_hf_folder(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Reads a ``transformers`` model folder saved with safetensors.

    Args:
      path: folder holding ``config.json`` and ``model.safetensors`` (or a
        sharded ``model.safetensors.index.json`` with its shards).

    Returns:
      ``(state, config)``: ``name -> numpy array`` (bfloat16 tensors widened to
      float32) and the ``config.json`` dict.

    Raises:
      FileNotFoundError: when the folder has no config or no safetensors weights
        (pickled ``pytorch_model.bin`` files are refused on purpose).
    """
    path = os.fspath(path)
    config_path = os.path.join(path, _CONFIG)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{path}: no {_CONFIG} in the Hugging Face folder")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    single = os.path.join(path, _WEIGHTS)
    index = os.path.join(path, _INDEX)
    if os.path.isfile(single):
        return _load_file(single), config
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        state: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(_load_file(os.path.join(path, shard)))
        missing = sorted(set(weight_map) - set(state))
        if missing:
            raise KeyError(f"{index} lists tensors no shard holds: {missing[:5]}")
        return state, config
    raise FileNotFoundError(
        f"{path}: expected {_WEIGHTS} or {_INDEX}; pickled PyTorch weights are not read (convert them to safetensors)"
    )


def write_hf_folder(
    path: str | os.PathLike[str], state: Mapping[str, Any], config: Mapping[str, Any]
) -> None:
    """Writes ``config.json`` and ``model.safetensors`` into ``path`` (created if needed).

    Args:
      path: destination folder.
      state: ``name -> array``; arrays are written contiguous, in their dtype.
      config: the ``config.json`` dict.

    Raises:
      TypeError: when a state entry is not an array-like of numbers.
    """
    st_numpy = _safetensors_numpy()
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for name, value in state.items():
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf" and arr.dtype.name != "bfloat16":
            raise TypeError(f"state[{name!r}] must be a numeric array, got dtype {arr.dtype}")
        tensors[name] = np.ascontiguousarray(arr)
    st_numpy.save_file(tensors, os.path.join(path, _WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(path, _CONFIG), "w", encoding="utf-8") as f:
        json.dump(dict(config), f, indent=2, sort_keys=True)
