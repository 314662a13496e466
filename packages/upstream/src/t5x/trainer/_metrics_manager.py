"""``MetricsManager``: upstream's per-run metric summaries and their TensorBoard events."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import logging

# clu is the `metrics` extra: without it the settings record and the actions still work
# (t5x-upstream's train script imports this module), the trainer object does not.
try:
    from clu import metrics as clu_metrics
    from clu import values as clu_values

    from t5x import metrics as metrics_lib
except ImportError:  # pragma: no cover - exercised only without the extra
    clu_metrics = clu_values = metrics_lib = None  # type: ignore[assignment]

PyTree = Any


def _require_clu(what: str) -> None:
    if clu_metrics is None:
        raise ImportError(f"t5x.trainer.{what} needs clu: install t5x-upstream[metrics] (pip install clu)")


def _host_value(x: Any) -> Any:
    """A numpy copy of ``x``; of an array spread over processes, this process's first shard."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return jax.device_get(x)


def _time_when_ready(block_on: PyTree) -> float:
    """The wall time once ``block_on``'s arrays are computed (a donated array counts as done)."""
    try:
        jax.block_until_ready(block_on)
    except RuntimeError as error:
        if "deleted or donated" not in str(error):
            raise
    return time.time()


class _DurationTimer:
    """Measures the time between two points of asynchronously dispatched device work.

    One worker thread runs the requests in order, so a stop always follows its start.
    """

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="t5x-timer")
        self._start_future: concurrent.futures.Future[float] | None = None

    def start(self, block_on: PyTree = ()) -> None:
        self._start_future = self._pool.submit(_time_when_ready, block_on)

    def stop(self, block_on: PyTree = ()) -> concurrent.futures.Future[float]:
        """A future of the seconds between the last ``start`` and ``block_on`` being ready."""
        if self._start_future is None:
            raise ValueError("the duration timer was not started: call start_duration_timer() first")
        start, self._start_future = self._start_future, None
        end = self._pool.submit(_time_when_ready, block_on)
        return self._pool.submit(lambda: end.result() - start.result())

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class _NullWriter:
    """The writer of processes other than 0, and of process 0 without a summary_dir and clu writers."""

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        del step, scalars

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class _EventsWriter(_NullWriter):
    """TensorBoard events through ``t5x.training.TensorBoardWriter``, for when clu's writers
    cannot be imported (they need the ``tensorboard`` package).

    Writes one event per value, as TensorFlow's summary writer does; the event file is
    opened on the first write.
    """

    def __init__(self, logdir: str):
        self.logdir = logdir
        os.makedirs(logdir, exist_ok=True)
        self._writer: Any = None

    def _file(self) -> Any:
        if self._writer is None:
            from t5x.training import TensorBoardWriter

            self._writer = TensorBoardWriter(self.logdir, is_primary=True)
        return self._writer

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        for name, value in scalars.items():
            self._file().write_scalars(step, {name: float(np.asarray(value).reshape(()))})

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        for name, value in texts.items():
            self._file().write_texts(step, {name: value})

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _clu_writers() -> Any:
    try:
        from clu import metric_writers
    except ImportError:  # clu's writers import tensorboard
        return None
    return metric_writers


def _make_writer(name: str, summary_dir: str | None) -> Any:
    """Process 0's writer: clu's default (logs, and TensorBoard under summary_dir/name)."""
    metric_writers = _clu_writers()
    if metric_writers is not None:
        return metric_writers.create_default_writer(summary_dir, collection=name, asynchronous=True)
    logging.log_first_n(
        logging.WARNING, "clu.metric_writers is unavailable (no tensorboard): writing events directly", 1
    )
    return _EventsWriter(os.path.join(summary_dir, name)) if summary_dir else _NullWriter()


def _write_values(writer: Any, step: int, summary: Mapping[str, Any]) -> None:
    metric_writers = _clu_writers()
    if metric_writers is not None and isinstance(writer, metric_writers.MetricWriter):
        metric_writers.write_values(writer, step, summary)
        return
    scalars = {k: v.value for k, v in summary.items() if isinstance(v, clu_values.Scalar)}
    texts = {k: v.value for k, v in summary.items() if isinstance(v, clu_values.Text)}
    if scalars:
        writer.write_scalars(step, scalars)
    if texts and hasattr(writer, "write_texts"):
        writer.write_texts(step, texts)
    logging.info("metrics at step %s: %s", step, {**scalars, **texts})


class MetricsManager:
    """Summarises accumulated metrics and writes them, on process 0 only.

    Writes go to TensorBoard under ``summary_dir/name`` and to the log. Summaries are
    computed in a background thread; call ``close()`` (or ``flush()``) to wait for them.

    Args:
      name: what the metrics are of (``"train"``, ``"training_eval/<task>"``).
      summary_dir: the TensorBoard folder's parent; None: log only.
    """

    def __init__(self, name: str, summary_dir: str | None = None):
        _require_clu("MetricsManager")
        self._name = name
        self.summary_dir = os.path.join(summary_dir, name) if summary_dir else None
        self._writer: Any = _make_writer(name, summary_dir) if jax.process_index() == 0 else _NullWriter()
        self._writer_lock = threading.Lock()
        self._summary_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="t5x-metrics"
        )
        self._pending: list[concurrent.futures.Future[Any]] = []
        self._duration_timer = _DurationTimer()
        self._closed = False

    @property
    def summary_writer(self) -> Any:
        """The writer in use (a clu ``MetricWriter`` on process 0 when clu's writers import)."""
        return self._writer

    def write_scalar(self, key: str, val: Any, step: Any) -> None:
        self.write_scalars(step, {key: val})

    def write_scalars(self, step: Any, scalars: Mapping[str, Any]) -> None:
        with self._writer_lock:
            self._writer.write_scalars(int(_host_value(step)), scalars)

    def start_duration_timer(self, block_on: PyTree = ()) -> None:
        """Starts timing once ``block_on`` is computed (e.g. the train state before the steps)."""
        self._duration_timer.start(block_on=block_on)

    def write_metrics_summary(
        self, metrics: Mapping[str, clu_metrics.Metric], step: Any, num_steps: int
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """Computes and writes ``metrics`` gathered over ``num_steps`` steps, in the background.

        The duration (for ``Time`` metrics) runs from ``start_duration_timer`` to the
        moment ``metrics`` are computed, which tracks the device's work rather than
        its dispatch.

        Returns:
          A future of ``{name: clu value}`` (every process computes it; only 0 writes).
        """
        duration = self._duration_timer.stop(block_on=metrics)  # here: the main thread's order
        step = int(_host_value(step))
        future = self._summary_pool.submit(
            self._summarize_and_write, dict(metrics), step, num_steps, duration
        )
        self._pending.append(future)
        return future

    def _summarize_and_write(
        self,
        metrics: dict[str, clu_metrics.Metric],
        step: int,
        num_steps: int,
        duration: concurrent.futures.Future[float],
    ) -> dict[str, Any]:
        host = jax.tree.map(_host_value, metrics)
        host = metrics_lib.set_time_metrics_duration(host, duration.result())
        host = metrics_lib.set_step_metrics_num_steps(host, num_steps)
        summary = {name: metric.compute_value() for name, metric in host.items()}
        with self._writer_lock:
            _write_values(self._writer, step, summary)
        return summary

    def flush(self) -> None:
        """Waits for the pending summaries (raising their errors), then flushes the writer."""
        pending, self._pending = self._pending, []
        try:
            for future in pending:
                future.result()
        finally:
            with self._writer_lock:
                self._writer.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._summary_pool.shutdown(wait=True)
            self._duration_timer.close()
        finally:
            self._writer.close()

    def __del__(self) -> None:
        # At interpreter shutdown the pools' pieces may already be gone.
        with contextlib.suppress(Exception):
            self.close()
