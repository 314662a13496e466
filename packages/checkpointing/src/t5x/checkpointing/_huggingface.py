"""Hugging Face model folders: ``config.json`` plus safetensors weights (never pickle)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np

_WEIGHTS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_CONFIG = "config.json"
# Bytes per element of each safetensors dtype (for checking a file's size against its header).
_DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


class HfFolderError(ValueError):
    """A file of a Hugging Face model folder cannot be read: the message names it and what is wrong."""


def _safetensors_numpy() -> Any:
    try:
        import safetensors.numpy as st_numpy
    except ImportError as err:  # optional dependency
        raise ImportError(
            "reading or writing Hugging Face folders needs the 'safetensors' package: pip install --find-links dist 't5x-checkpointing[hf]' (in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md)"
        ) from err
    return st_numpy


def _safetensors_problem(path: str) -> str | None:
    """What makes ``path`` an unreadable safetensors file (None when its layout is sound)."""
    size = os.path.getsize(path)
    if size < 8:
        return f"the file is {size} bytes, too short for a safetensors header (empty or truncated?)"
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        if header_len > size - 8:
            return (
                f"its header should be {header_len} bytes but the file holds only {size - 8} after the "
                "length (truncated, or not a safetensors file)"
            )
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"its header is not valid JSON ({err}): not a safetensors file, or damaged"
    if not isinstance(header, dict):
        return "its header is not a JSON object: not a safetensors file, or damaged"
    needed = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(v) for v in info["data_offsets"])
            count = int(np.prod(info["shape"], dtype=np.int64))
            width = _DTYPE_SIZES.get(info["dtype"])
        except (KeyError, TypeError, ValueError):
            return f"its header entry for tensor {name!r} is malformed: {info!r}"
        if end < start or (width is not None and end - start != count * width):
            return f"its header gives tensor {name!r} inconsistent offsets {[start, end]} for shape {info['shape']}"
        needed = max(needed, end)
    data = size - 8 - header_len
    if data < needed:
        return (
            f"truncated: its header describes {needed} bytes of tensor data but the file holds {data} "
            "(an interrupted download or copy?)"
        )
    return None


def _load_file(path: str) -> dict[str, np.ndarray]:
    """Reads one safetensors file; HfFolderError names it when it is truncated or damaged."""
    st_numpy = _safetensors_numpy()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such safetensors file")
    problem = _safetensors_problem(path)
    if problem is not None:
        raise HfFolderError(f"{path}: cannot read the safetensors file: {problem}")
    try:
        loaded = dict(st_numpy.load_file(path))
    except (TypeError, ValueError) as err:
        # numpy has no bfloat16: read those files through the raw format instead.
        if "bf16" not in str(err).lower() and "bfloat16" not in str(err).lower():
            raise HfFolderError(f"{path}: cannot read the safetensors file: {err}") from err
        return _load_bfloat16_file(path)
    except Exception as err:  # safetensors' own error type is not a ValueError
        if type(err).__name__ != "SafetensorError":
            raise
        raise HfFolderError(f"{path}: cannot read the safetensors file: {err}") from err
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
        (pickled ``pytorch_model.bin`` files are refused on purpose), or a shard
        its index lists is missing.
      HfFolderError: a file is truncated or damaged (names it and what is wrong).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such Hugging Face model folder")
    config_path = os.path.join(path, _CONFIG)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{path}: no {_CONFIG} in the Hugging Face folder")
    config = _read_json(config_path)
    single = os.path.join(path, _WEIGHTS)
    index = os.path.join(path, _INDEX)
    if os.path.isfile(single):
        return _load_file(single), config
    if os.path.isfile(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise HfFolderError(f'{index}: no "weight_map" object (not a safetensors index?)')
        state: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = os.path.join(path, shard)
            if not os.path.isfile(shard_path):
                raise FileNotFoundError(f"{index} lists the shard {shard}, which is not in {path}")
            state.update(_load_file(shard_path))
        missing = sorted(set(weight_map) - set(state))
        if missing:
            raise KeyError(f"{index} lists tensors no shard holds: {missing[:5]}")
        return state, config
    pickles = sorted(n for n in os.listdir(path) if n.endswith((".bin", ".pt", ".pth", ".ckpt")))
    found = f"found only {pickles}, " if pickles else ""
    raise FileNotFoundError(
        f"{path}: expected {_WEIGHTS} or {_INDEX}; {found}pickled PyTorch weights are never read because "
        "loading them can run code (re-save with transformers' save_pretrained(..., safe_serialization=True))"
    )


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HfFolderError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise HfFolderError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


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


_TOKENIZER_CONFIG = "tokenizer_config.json"
_SPECIAL_TOKENS = "special_tokens_map.json"
_SPIECE = "spiece.model"
# ByT5Tokenizer's default sentinel count (259 byte ids + 125 = 384 rows).
_BYT5_DEFAULT_EXTRA_IDS = 125


@dataclasses.dataclass(frozen=True)
class HfTokenizerInfo:
    """The tokenizer a Hugging Face T5-family folder carries.

    Attributes:
      kind: ``"sentencepiece"`` (T5Tokenizer with ``spiece.model``), ``"byte"``
        (ByT5Tokenizer) or ``"none"`` (no tokenizer files).
      sentencepiece_model: path of ``spiece.model`` (``kind == "sentencepiece"``).
      extra_ids: sentinel count (``<extra_id_0>`` is the highest id).
    """

    kind: str
    sentencepiece_model: str | None = None
    extra_ids: int = 0


def read_hf_tokenizer_info(path: str | os.PathLike[str]) -> HfTokenizerInfo:
    """Says which tokenizer a ``transformers`` folder holds (no tokenizer library needed).

    Args:
      path: the model folder.

    Returns:
      The tokenizer's kind, SentencePiece file and sentinel count. A folder
      without tokenizer files reads as ``kind="none"``.
    """
    path = os.fspath(path)
    config: dict[str, Any] = {}
    config_path = os.path.join(path, _TOKENIZER_CONFIG)
    if os.path.isfile(config_path):
        config = _read_json(config_path)
    tokenizer_class = str(config.get("tokenizer_class", ""))
    if tokenizer_class.startswith("ByT5"):
        return HfTokenizerInfo("byte", extra_ids=int(config.get("extra_ids", _BYT5_DEFAULT_EXTRA_IDS)))
    spiece = os.path.join(path, _SPIECE)
    if os.path.isfile(spiece):
        # T5Tokenizer's default: 100 sentinels.
        return HfTokenizerInfo("sentencepiece", spiece, int(config.get("extra_ids", 100)))
    return HfTokenizerInfo("none")


def write_hf_tokenizer(
    path: str | os.PathLike[str],
    *,
    sentencepiece_model: str | os.PathLike[str] | None = None,
    extra_ids: int = 0,
    model_max_length: int = 512,
) -> list[str]:
    """Writes the tokenizer files ``transformers.AutoTokenizer`` loads for a T5-family model.

    With ``sentencepiece_model`` a T5Tokenizer (``spiece.model`` copied, ``legacy``
    handling so that plain text encodes exactly as the SentencePiece model
    does); without it a ByT5Tokenizer (UTF-8 bytes shifted by 3).

    Args:
      path: the model folder (created if needed).
      sentencepiece_model: the ``.model`` file, or None for ByT5.
      extra_ids: sentinel count (``<extra_id_0>`` is the highest id).
      model_max_length: the tokenizer's nominal maximum length.

    Returns:
      The names of the files written.

    Raises:
      FileNotFoundError: the SentencePiece file does not exist.
      ValueError: ``extra_ids`` is negative.
    """
    if extra_ids < 0:
        raise ValueError(f"extra_ids must be >= 0, got {extra_ids}")
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    sentinels = [f"<extra_id_{i}>" for i in range(extra_ids)]
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    written = []
    if sentencepiece_model is not None:
        source = os.fspath(sentencepiece_model)
        if not os.path.isfile(source):
            raise FileNotFoundError(f"{source}: no such SentencePiece model file")
        destination = os.path.join(path, _SPIECE)
        if os.path.abspath(source) != os.path.abspath(destination):
            shutil.copyfile(source, destination)
        written.append(_SPIECE)
        config: dict[str, Any] = {"tokenizer_class": "T5Tokenizer", "legacy": True}
    else:
        config = {"tokenizer_class": "ByT5Tokenizer"}
    config.update(special, extra_ids=extra_ids, additional_special_tokens=sentinels)
    config["model_max_length"] = model_max_length
    for name, content in (
        (_TOKENIZER_CONFIG, config),
        (_SPECIAL_TOKENS, {**special, "additional_special_tokens": sentinels}),
    ):
        with open(os.path.join(path, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2)
        written.append(name)
    return written
