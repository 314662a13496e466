"""Inference over a dataset: predictions or scores as JSON Lines, resumable."""

from __future__ import annotations

import glob
import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import numpy as np

from t5x.interfaces import Model, Partitioner, PyTree
from t5x.training._init import batch_shardings, sharding_for

COMPLETION_SUFFIX = ".COMPLETED"


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _to_json(value: Any) -> Any:
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array.tolist()


def _is_passthrough(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "OSU"


def _pad(batch: Mapping[str, np.ndarray], rows: int) -> tuple[dict[str, np.ndarray], int]:
    have = len(next(iter(batch.values())))
    if have > rows:
        raise ValueError(f"infer: a batch has {have} rows, more than the batch size {rows}")
    if have == rows:
        return dict(batch), have
    # Repeat the last row: padding with real data keeps every model input valid.
    return {k: np.concatenate([v, np.repeat(v[-1:], rows - have, axis=0)]) for k, v in batch.items()}, have


def infer(
    model: Model,
    params: PyTree,
    partitioner: Partitioner,
    batches: Iterable[Mapping[str, np.ndarray]],
    output_path: str,
    *,
    batch_size: int,
    mode: str = "predict",
    chunk_batches: int = 8,
    decode_fn: Callable[[np.ndarray], Any] | None = None,
    seed: int = 0,
    decode_kwargs: Mapping[str, Any] | None = None,
    record_fn: Callable[[int, Mapping[str, Any], Mapping[str, Any]], Mapping[str, Any]] | None = None,
    name_data_shards: bool = True,
    compiled_steps: dict[Any, Callable[..., Any]] | None = None,
) -> str:
    """Predicts or scores every example, writing JSON Lines in the input order.

    Each line is ``{"index": i, "prediction": ..., "score": s}`` (mode
    ``"predict"``; ``prediction`` is the token list, or ``decode_fn`` of it)
    or ``{"index": i, "score": s}`` (mode ``"score"``), ``i`` counting this
    data shard's examples from 0; ``record_fn`` replaces that layout. Results
    are written in chunks of ``chunk_batches`` batches, each made visible
    atomically together with the iterator state after it; a restarted call
    skips finished chunks (through the iterator's ``set_state`` when it has
    one). The output file appears atomically at the end, followed by
    ``<output>.COMPLETED``. With several data shards, each shard's writer adds
    ``-SSSSS-of-NNNNN`` to the file name (unless ``name_data_shards`` is False).

    A batch may carry *passthrough* fields besides the model's features: arrays
    of dtype object, bytes or str (e.g. each example's text). They are not given
    to the model; ``record_fn`` receives each row's values.

    Args:
      model: predicts (``predict_batch_with_aux``) or scores (``score_batch``).
      params: the parameters (placed arrays keep their shardings).
      partitioner: places batches and compiles the step.
      batches: this process's batches (an InputIterator makes resuming cheap);
        a short final batch is padded and its padding dropped.
      output_path: the JSON Lines file to write.
      batch_size: the global batch size of each step.
      mode: ``"predict"`` or ``"score"``.
      chunk_batches: batches per resumable chunk.
      decode_fn: turns one prediction row into what is written (e.g. text).
      seed: sampling seed; batch ``b`` uses ``fold_in(PRNGKey(seed), b)``.
      decode_kwargs: passed to ``predict_batch_with_aux``.
      record_fn: ``fn(index, passthrough_fields, outputs) -> line`` builds each
        JSON line; ``outputs`` has ``prediction`` (token ids, mode ``"predict"``),
        ``score`` and, in mode ``"predict"``, ``aux`` (every value
        ``predict_batch_with_aux`` returned for the row), all numpy.
      name_data_shards: add the data-shard suffix to ``output_path`` when the
        partitioner has several data shards (False: the caller's path names it).
      compiled_steps: a cache of compiled steps shared by calls with the same
        model, mode and ``decode_kwargs`` (e.g. one per task of a mixture), so
        that each batch shape compiles once.

    Returns:
      The path of the written file.

    Raises:
      ValueError: an unknown ``mode`` or an oversized batch.
    """
    if mode not in ("predict", "score"):
        raise ValueError(f"infer mode must be 'predict' or 'score', got {mode!r}")
    layout = partitioner.get_data_layout(batch_size)
    if layout.num_shards > 1 and name_data_shards:
        output_path = f"{output_path}-{layout.shard_id:05d}-of-{layout.num_shards:05d}"
    if os.path.exists(output_path + COMPLETION_SUFFIX):
        return output_path
    writes = layout.is_first_host_in_replica_set
    parts_dir = output_path + ".parts"
    os.makedirs(parts_dir, exist_ok=True)
    done = sorted(glob.glob(os.path.join(parts_dir, "part-*.state.json")))
    next_index = next_batch = 0
    iterator = iter(batches)
    if done:
        with open(done[-1]) as f:
            resume = json.load(f)
        next_index, next_batch = resume["next_index"], resume["next_batch"]
        if resume.get("input_state") is not None and hasattr(iterator, "set_state"):
            iterator.set_state(resume["input_state"])
        else:
            for _ in range(next_batch):
                next(iterator)

    rows = layout.per_shard_batch_size
    params_shardings = jax.tree.map(
        lambda p: p.sharding if isinstance(p, jax.Array) else sharding_for(partitioner, ()), params
    )
    replicated = sharding_for(partitioner, ())
    base_rng = jax.random.PRNGKey(seed)
    compiled = compiled_steps if compiled_steps is not None else {}

    def run(global_batch: dict[str, Any], batch_number: int) -> dict[str, Any]:
        key = (mode, *sorted((k, v.shape, str(v.dtype)) for k, v in global_batch.items()))
        if key not in compiled:
            if mode == "score":

                def step(params: Any, batch: Any, rng: Any) -> dict[str, Any]:
                    del rng
                    return {"score": model.score_batch(params, batch)}
            else:

                def step(params: Any, batch: Any, rng: Any) -> dict[str, Any]:
                    predictions, aux = model.predict_batch_with_aux(
                        params, batch, rng, **dict(decode_kwargs or {})
                    )
                    return {"prediction": predictions, "score": aux["scores"], "aux": aux}

            compiled[key] = partitioner.partition(
                step,
                in_shardings=(params_shardings, batch_shardings(partitioner, global_batch), replicated),
                out_shardings=replicated,
            )
        rng = jax.random.fold_in(base_rng, batch_number)
        return partitioner.global_to_host_local(compiled[key](params, global_batch, rng))

    chunk_lines: list[str] = []
    chunk_start = len(done)

    def flush_chunk(part: int) -> None:
        if writes:
            _atomic_write(os.path.join(parts_dir, f"part-{part:05d}.jsonl"), "".join(chunk_lines))
            state = iterator.get_state() if hasattr(iterator, "get_state") else None
            record = {"next_index": next_index, "next_batch": next_batch, "input_state": state}
            _atomic_write(os.path.join(parts_dir, f"part-{part:05d}.state.json"), json.dumps(record))
        chunk_lines.clear()

    part = chunk_start
    batches_in_chunk = 0
    for batch in iterator:
        passthrough = {k: v for k, v in batch.items() if _is_passthrough(v)}
        features = {k: v for k, v in batch.items() if k not in passthrough}
        padded, real = _pad(features, rows)
        outputs = run(partitioner.host_local_to_global(padded), next_batch)
        start = layout.shard_id * rows
        for row in range(real):
            picked = jax.tree.map(
                lambda v, r=start + row: np.asarray(v)[r] if np.ndim(v) else np.asarray(v), outputs
            )
            if record_fn is not None:
                fields = {k: v[row] for k, v in passthrough.items()}
                record: Any = record_fn(next_index, fields, picked)
            else:
                record = {"index": next_index}
                if mode == "predict":
                    prediction = picked["prediction"]
                    record["prediction"] = decode_fn(prediction) if decode_fn else _to_json(prediction)
                record["score"] = _to_json(picked["score"])
            chunk_lines.append(json.dumps(record) + "\n")
            next_index += 1
        next_batch += 1
        batches_in_chunk += 1
        if batches_in_chunk == chunk_batches:
            flush_chunk(part)
            part, batches_in_chunk = part + 1, 0
    if batches_in_chunk:
        flush_chunk(part)

    if writes:
        tmp = output_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            for path in sorted(glob.glob(os.path.join(parts_dir, "part-*.jsonl"))):
                with open(path, encoding="utf-8") as f:
                    shutil.copyfileobj(f, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, output_path)
        _atomic_write(output_path + COMPLETION_SUFFIX, json.dumps({"examples": next_index}))
        shutil.rmtree(parts_dir, ignore_errors=True)
    return output_path
