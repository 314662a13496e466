"""``seqio.loggers``: where evaluation results go, with seqio's calling convention and file formats.

A seqio logger is called as ``logger(task_name, step, metrics, dataset,
inferences, targets)``: ``metrics`` maps names to ``seqio.metrics`` values
(``Scalar``, ``Text``, ...; plain numbers are taken as scalars), ``dataset`` is
the task's eval dataset (a ``tf.data.Dataset``, or the list of example dicts
the core Evaluator passes), ``inferences`` holds ``"prediction"``, ``"score"``
and ``"aux_value"`` (the core's ``"predictions"`` / ``"scores"`` /
``"aux_values"`` are accepted too). The core's loggers (``t5x.tasks``) keep
their own, simpler formats.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from t5x.seqio import metrics as metrics_lib

_log = logging.getLogger("seqio.loggers")

# The core's inference keys -> seqio's.
_INFERENCE_KEYS = {"predictions": "prediction", "scores": "score", "aux_values": "aux_value"}


def _as_metric_value(value: Any) -> Any:
    if isinstance(value, metrics_lib.MetricValue):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return metrics_lib.Scalar(value.item() if isinstance(value, np.generic) else value)
    return value


def _seqio_inferences(inferences: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (inferences or {}).items():
        out[_INFERENCE_KEYS.get(key, key)] = value
    aux = out.get("aux_value")
    if isinstance(aux, Sequence) and not isinstance(aux, (str, bytes)):
        # The core keeps one aux dict per example; seqio keeps one list per aux name.
        rows = [a for a in aux if isinstance(a, Mapping)]
        names = sorted({k for a in rows for k in a})
        out["aux_value"] = {n: [a.get(n) for a in rows] for n in names}
    return out


def _examples(dataset: Any) -> Iterable[dict[str, Any]]:
    if dataset is None:
        return []
    if isinstance(dataset, tf.data.Dataset):
        return (_to_numpy(ex) for ex in dataset)
    return (_to_numpy(ex) for ex in dataset)


def _to_numpy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _to_numpy(v) for k, v in value.items()}
    if isinstance(value, tf.RaggedTensor):
        return value.to_list()
    if isinstance(value, tf.SparseTensor):
        return tf.sparse.to_dense(value).numpy()
    if isinstance(value, tf.Tensor):
        return value.numpy()
    return value


def _skip_none_fields(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {k: v for k, v in items if v is not None}


class TensorAndNumpyEncoder(json.JSONEncoder):
    """A JSON encoder for tensors, numpy values, bytes and dataclasses.

    Arrays with more than ``max_ndarray_size`` elements are written as a one-line
    summary (shape, dtype, first and last five values) instead of in full. Bytes
    are decoded as UTF-8, or base64-encoded when they are not text. Dataclasses
    become dicts without their None fields.
    """

    def __init__(self, *args: Any, max_ndarray_size: int = 32, **kwargs: Any):
        self.max_ndarray_size = max_ndarray_size
        super().__init__(*args, **kwargs)

    def default(self, o: Any) -> Any:
        if isinstance(o, tf.Tensor):
            o = (tf.cast(o, tf.float32) if o.dtype == tf.bfloat16 else o).numpy()
        if isinstance(o, np.ndarray):
            dtype = o.dtype
            if str(dtype) == "bfloat16":
                o = o.astype(np.float32)
            if o.size <= self.max_ndarray_size:
                return o.tolist()
            flat = o.reshape(-1)
            head = ", ".join(str(v) for v in flat[:5].tolist())
            tail = ", ".join(str(v) for v in flat[-5:].tolist())
            return f"{type(o).__name__}(shape={o.shape}, dtype={dtype}); summary: {head} ... {tail}"
        if isinstance(o, (np.number, np.bool_)):
            return o.item()
        if isinstance(o, bytes):
            try:
                return o.decode("utf-8")
            except UnicodeDecodeError:
                return base64.b64encode(o).decode("ascii")
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return dataclasses.asdict(o, dict_factory=_skip_none_fields)
        return super().default(o)


class Logger:
    """Base class: receives one task's evaluation results at one step.

    Args:
      output_dir: where to write (the Evaluator passes its ``log_dir``).
    """

    def __init__(self, output_dir: str | None = None):
        self.output_dir = output_dir

    def __call__(
        self,
        task_name: str,
        step: int | None,
        metrics: Mapping[str, Any],
        dataset: Any,
        inferences: Mapping[str, Any] | None,
        targets: Sequence[Any] | None,
    ) -> None:
        raise NotImplementedError

    def _require_dir(self) -> str:
        if not self.output_dir:
            raise ValueError(f"{type(self).__name__} writes files and needs output_dir, got None")
        return self.output_dir


class PyLoggingLogger(Logger):
    """Logs one line per scalar or text metric through Python logging."""

    def __init__(self, output_dir: str | None = None, level: int = logging.INFO):
        super().__init__(output_dir)
        self._level = level

    def __call__(self, task_name, step, metrics, dataset=None, inferences=None, targets=None) -> None:
        for name, raw in metrics.items():
            value = _as_metric_value(raw)
            if isinstance(value, metrics_lib.Scalar):
                shown: Any = value.value
            elif isinstance(value, metrics_lib.Text):
                shown = value.textdata
            else:
                _log.warning(
                    "PyLoggingLogger: metric %r of type %s is not logged", name, type(value).__name__
                )
                continue
            _log.log(self._level, "%s/%s at step %s: %s", task_name, name, step, shown)


def _plugin_metadata(plugin_name: str) -> Any:
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin_name)
    )


class TensorBoardLogger(Logger):
    """Writes metrics as TensorBoard summaries (``eval/<name>``) under ``<output_dir>/<task>``.

    Scalars, text, images, audio, histograms and generic tensors are written in
    the layouts TensorBoard's plugins read, without needing the tensorboard
    package installed.
    """

    def __init__(self, output_dir: str | None = None):
        super().__init__(output_dir)
        self._writers: dict[str, Any] = {}

    def _writer(self, task_name: str) -> Any:
        if task_name not in self._writers:
            path = os.path.join(self._require_dir(), task_name)
            self._writers[task_name] = tf.summary.create_file_writer(path)
        return self._writers[task_name]

    def _write(self, tag: str, value: Any, step: int) -> None:
        if isinstance(value, metrics_lib.Scalar):
            tensor, meta = tf.constant(float(value.value), tf.float32), _plugin_metadata("scalars")
        elif isinstance(value, metrics_lib.Text):
            tensor, meta = tf.constant(value.textdata), _plugin_metadata("text")
        elif isinstance(value, metrics_lib.Image):
            tensor, meta = _image_tensor(value), _plugin_metadata("images")
        elif isinstance(value, metrics_lib.Audio):
            tensor, meta = _audio_tensor(value), _plugin_metadata("audio")
        elif isinstance(value, metrics_lib.Histogram):
            tensor, meta = _histogram_tensor(value), _plugin_metadata("histograms")
        elif isinstance(value, metrics_lib.Generic):
            tensor, meta = tf.constant(value.tensor), value.metadata
        else:
            _log.warning("TensorBoardLogger: %r of type %s is not written", tag, type(value).__name__)
            return
        tf.summary.write(tag, tensor, step=step, metadata=meta)

    def __call__(self, task_name, step, metrics, dataset=None, inferences=None, targets=None) -> None:
        writer = self._writer(task_name)
        with writer.as_default():
            for name, raw in metrics.items():
                self._write(f"eval/{name}", _as_metric_value(raw), step or 0)
        writer.flush()


def _image_tensor(value: metrics_lib.Image) -> tf.Tensor:
    # The images plugin's layout: [width, height, png_1, ..., png_k] as strings.
    images = np.asarray(value.image)
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4:
        raise ValueError(f"Image metric: expected [k, height, width, channels], got shape {images.shape}")
    if images.dtype != np.uint8:
        scaled = images.astype(np.float64)
        if scaled.max(initial=0) <= 1.0:
            scaled = scaled * 255.0
        images = np.clip(np.round(scaled), 0, 255).astype(np.uint8)
    pngs = [tf.image.encode_png(im).numpy() for im in images[: value.max_outputs]]
    height, width = images.shape[1], images.shape[2]
    return tf.constant([str(width).encode(), str(height).encode(), *pngs])


def _audio_tensor(value: metrics_lib.Audio) -> tf.Tensor:
    # The audio plugin's layout: [k, 2] strings, (encoded WAV, label).
    clips = np.asarray(value.audiodata, dtype=np.float32)
    if clips.ndim != 3:
        raise ValueError(f"Audio metric: expected [k, samples, channels], got shape {clips.shape}")
    rows = [
        [tf.audio.encode_wav(clip, value.sample_rate).numpy(), b""] for clip in clips[: value.max_outputs]
    ]
    return tf.constant(rows)


def _histogram_tensor(value: metrics_lib.Histogram) -> tf.Tensor:
    # The histograms plugin's layout: [bins, 3] rows of (left edge, right edge, count).
    data = np.asarray(value.values, dtype=np.float64).reshape(-1)
    counts, edges = np.histogram(data, bins=value.bins or 30)
    return tf.constant(np.stack([edges[:-1], edges[1:], counts.astype(np.float64)], axis=1))


class TensorBoardLoggerV1(TensorBoardLogger):
    """Writes scalar metrics as TF1-style ``simple_value`` summaries; other values are skipped."""

    def _write(self, tag: str, value: Any, step: int) -> None:
        from tensorflow.core.framework import summary_pb2

        if not isinstance(value, metrics_lib.Scalar):
            _log.warning("TensorBoardLoggerV1: %r of type %s is not written", tag, type(value).__name__)
            return
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value.value))]
        )
        tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=step)


def _serializable(value: Any, encoder: type[json.JSONEncoder]) -> bool:
    try:
        json.dumps(value, cls=encoder)
    except (TypeError, ValueError):
        return False
    return True


class JSONLogger(Logger):
    """Appends a line per step to ``<task>-metrics.jsonl`` and writes ``<task>-<step:06>.jsonl``.

    Each line of the per-step file holds one example: ``"input"`` (its features),
    ``"target"``, each inference (``"prediction"``, ``"score"``) and
    ``"aux_<name>"`` for each aux value; values the encoder cannot write are
    left out. Only scalar, text and generic metrics go into the metrics file.

    Args:
      output_dir: the folder.
      write_n_results: examples to write per step (None: all; 0: none).
      json_encoder_cls: the encoder for both files.
    """

    def __init__(
        self,
        output_dir: str | None = None,
        write_n_results: int | None = None,
        json_encoder_cls: type[json.JSONEncoder] = TensorAndNumpyEncoder,
    ):
        super().__init__(output_dir)
        self._write_n_results = write_n_results
        self._json_encoder_cls = json_encoder_cls

    def __call__(self, task_name, step, metrics, dataset=None, inferences=None, targets=None) -> None:
        out_dir = self._require_dir()
        tf.io.gfile.makedirs(out_dir)
        step = -1 if step is None else step
        if metrics:
            self._append_metrics(os.path.join(out_dir, f"{task_name}-metrics.jsonl"), step, metrics)
        inferences = _seqio_inferences(inferences)
        if self._write_n_results == 0 or not inferences or not targets or dataset is None:
            return
        self._write_inferences(
            os.path.join(out_dir, f"{task_name}-{step:06}.jsonl"), dataset, inferences, targets
        )

    def _append_metrics(self, path: str, step: int, metrics: Mapping[str, Any]) -> None:
        row: dict[str, Any] = {"step": step}
        for name, raw in metrics.items():
            value = _as_metric_value(raw)
            if isinstance(value, metrics_lib.Scalar):
                row[name] = value.value
            elif isinstance(value, metrics_lib.Text):
                row[name] = value.textdata
            elif isinstance(value, metrics_lib.Generic):
                row[name] = np.asarray(value.tensor).tolist()
            else:
                _log.warning("JSONLogger: metric %r of type %s is not written", name, type(value).__name__)
        previous = ""
        if tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path) as f:
                previous = f.read()
        # Write-then-rename: an append that also works on filesystems without append mode.
        with tf.io.gfile.GFile(path + ".tmp", "w") as f:
            f.write(previous + json.dumps(row, cls=self._json_encoder_cls) + "\n")
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)

    def _write_inferences(
        self, path: str, dataset: Any, inferences: Mapping[str, Any], targets: Sequence[Any]
    ) -> None:
        aux = inferences.get("aux_value") or {}
        kinds = [k for k in inferences if k != "aux_value"]
        columns = [targets, *(inferences[k] for k in kinds)]
        rows: Iterator[Any] = itertools.zip_longest(_examples(dataset), *columns)
        if self._write_n_results:
            rows = itertools.islice(rows, self._write_n_results)
        with tf.io.gfile.GFile(path, "w") as f:
            for index, (example, *results) in enumerate(rows):
                if example is None:
                    continue
                record: dict[str, Any] = {"input": example}
                for field, value in zip(["target", *kinds], results, strict=True):
                    if _serializable(value, self._json_encoder_cls):
                        record[field] = value
                for name, values in aux.items():
                    value = values[index]
                    if _serializable(value, self._json_encoder_cls):
                        record[f"aux_{name}"] = value
                f.write(json.dumps(record, cls=self._json_encoder_cls) + "\n")


__all__ = [
    "JSONLogger",
    "Logger",
    "PyLoggingLogger",
    "TensorAndNumpyEncoder",
    "TensorBoardLogger",
    "TensorBoardLoggerV1",
]
