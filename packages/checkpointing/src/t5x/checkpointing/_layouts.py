"""Parameter layout utilities: scanned <-> unscanned layers, ``model-info.txt``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t5x.checkpointing import _tree

_LAYER = re.compile(r"^layers_(\d+)$")


def unscan_layers(tree: Mapping[str, Any], scanned_key: str = "layers", axis: int = 1) -> dict[str, Any]:
    """Splits stacked (scanned) layer parameters into ``layers_<i>`` subtrees.

    A scanned network stores every layer's ``kernel`` in one array with a
    ``layers`` axis (T5X's default ``scan_axis`` is 1); the unscanned layout
    has ``layers_0``, ``layers_1``, ... each with its own slice. Works on any
    subtree keyed ``scanned_key`` (so optimizer slots convert the same way, as
    long as their arrays keep the layers axis; factored slots that dropped it
    must be re-initialised).

    Args:
      tree: nested params (or a whole state dict).
      scanned_key: the key of the stacked subtree.
      axis: the layers axis of every array in it.

    Returns:
      A new nested dict with ``layers_<i>`` subtrees in place of ``scanned_key``.

    Raises:
      ValueError: the arrays of one stacked subtree disagree on the layer count.
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if key == scanned_key and isinstance(value, Mapping):
            flat = _tree.flatten(value)
            counts = {np.shape(leaf)[axis] for leaf in flat.values()}
            if len(counts) != 1:
                raise ValueError(
                    f"arrays under {scanned_key!r} disagree on the layer count along axis {axis}: {counts}"
                )
            (count,) = counts
            for i in range(count):
                out[f"layers_{i}"] = _tree.unflatten(
                    {p: np.take(np.asarray(leaf), i, axis=axis) for p, leaf in flat.items()}
                )
        elif isinstance(value, Mapping):
            out[key] = unscan_layers(value, scanned_key, axis)
        else:
            out[key] = value
    return out


def scan_layers(tree: Mapping[str, Any], scanned_key: str = "layers", axis: int = 1) -> dict[str, Any]:
    """Stacks ``layers_<i>`` subtrees into one ``scanned_key`` subtree (inverse of :func:`unscan_layers`).

    Raises:
      ValueError: the layer numbers are not 0..n-1 or the layers differ in structure.
    """
    layers = {
        int(m.group(1)): v for k, v in tree.items() if (m := _LAYER.match(k)) and isinstance(v, Mapping)
    }
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if _LAYER.match(key) and isinstance(value, Mapping):
            continue
        out[key] = scan_layers(value, scanned_key, axis) if isinstance(value, Mapping) else value
    if layers:
        if sorted(layers) != list(range(len(layers))):
            raise ValueError(f"layer numbers must be 0..{len(layers) - 1}, got {sorted(layers)}")
        flats = [_tree.flatten(layers[i]) for i in range(len(layers))]
        for i, flat in enumerate(flats[1:], start=1):
            if flat.keys() != flats[0].keys():
                raise ValueError(f"layers_{i} has different parameters than layers_0")
        out[scanned_key] = _tree.unflatten(
            {p: np.stack([np.asarray(f[p]) for f in flats], axis=axis) for p in flats[0]}
        )
    return out


def _shape_text(shape: Sequence[int], axes: Sequence[str] | None) -> str:
    if axes is None or len(axes) != len(shape):
        return str(tuple(shape))
    return "({})".format(", ".join(f"{a}={d}" for a, d in zip(axes, shape)))


def _line(name: str, value: Any, axes: Any, spec: Any) -> str | None:
    if isinstance(value, Mapping) and not value:
        return None
    if value is None:
        return f"Variable    {name:<80} None"
    shape = tuple(np.shape(value))
    size = str(int(np.prod(shape, dtype=np.int64)))
    return f"Variable {name:<80} size {size:<12} shape {_shape_text(shape, axes):<40} partition spec {spec}"


def model_info(
    state: Mapping[str, Any],
    logical_axes: Mapping[str, Any] | None = None,
    partition_specs: Mapping[str, Any] | None = None,
) -> str:
    """The text of ``model-info.txt`` in the layout upstream T5X writes.

    One ``Variable <name> size <n> shape (<axis>=<dim>, ...) partition spec <spec>``
    line per parameter (names slash-joined, relative to ``target``), then
    ``Total number of parameters: <n>``, a blank line, and the same lines for
    ``state`` (optimizer slots named ``param_states/...`` and ``step``).

    Args:
      state: a T5X state dict (arrays or objects with ``shape``).
      logical_axes: optional tree like ``state`` of axis-name tuples.
      partition_specs: optional tree like ``state`` of partition specs.

    Returns:
      The file's text, ending with a newline.
    """
    axes_flat = _tree.flatten(logical_axes or {}, is_leaf=lambda x: isinstance(x, tuple))
    specs_flat = _tree.flatten(
        partition_specs or {}, is_leaf=lambda x: isinstance(x, tuple) or not isinstance(x, Mapping)
    )
    lines: list[str] = []
    total = 0
    for section in ("target", "state"):
        for path, value in _tree.flatten(state.get(section, {})).items():
            full = (section, *path)
            line = _line(_tree.slash_name(path), value, axes_flat.get(full), specs_flat.get(full))
            if line is not None:
                lines.append(line)
                if section == "target":
                    total += int(np.prod(np.shape(value), dtype=np.int64))
        if section == "target":
            lines.append(f"Total number of parameters: {total}")
            lines.append("")
    return "\n".join(lines) + "\n"


def write_model_info(
    path: str,
    state: Mapping[str, Any],
    logical_axes: Mapping[str, Any] | None = None,
    partition_specs: Mapping[str, Any] | None = None,
) -> None:
    """Writes :func:`model_info` to ``path`` (e.g. ``model_dir/model-info.txt``)."""
    with open(path, "w") as handle:
        handle.write(model_info(state, logical_axes, partition_specs))
