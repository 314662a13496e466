"""Conformance checks for the compute-side contracts.

These checks import nothing beyond numpy themselves; they call the
implementation, which brings its own framework.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from t5x.interfaces._checkpointer import Checkpointer
from t5x.interfaces._metric_writer import MetricWriter
from t5x.interfaces._model import Model
from t5x.interfaces._partitioner import Partitioner
from t5x.interfaces._values import DataLayout, RestoredCheckpoint
from t5x.interfaces.testing._common import require, require_members


def check_model(model: Model, params: Any, batch: Mapping[str, np.ndarray]) -> None:
    """Checks ``model`` on one batch against the Model contract.

    Raises:
      ConformanceError: naming the broken rule.
    """
    require_members(model, Model)
    batch_size = next(iter(batch.values())).shape[0]
    loss, metrics = model.loss_fn(params, batch, None)
    require(
        np.ndim(loss) == 0 and np.isfinite(float(loss)),
        f"loss_fn must return a finite scalar loss, got {loss!r}",
    )
    require(isinstance(metrics, Mapping), f"loss_fn metrics must be a mapping, got {type(metrics).__name__}")
    eval_loss, _ = model.eval_fn(params, batch)
    require(
        bool(np.isclose(float(eval_loss), float(loss), rtol=1e-5)),
        "eval_fn and deterministic loss_fn disagree",
    )
    scores = np.asarray(model.score_batch(params, batch))
    require(
        scores.shape == (batch_size,),
        f"score_batch must return [batch]={batch_size} scores, got {scores.shape}",
    )
    require(bool(np.all(scores <= 1e-5)), "score_batch must return log-likelihoods (<= 0)")
    predictions, aux = model.predict_batch_with_aux(params, batch)
    require(
        np.shape(predictions)[0] == batch_size,
        f"predictions must have {batch_size} rows, got {np.shape(predictions)}",
    )
    require("scores" in aux, "predict_batch_with_aux must return aux['scores']")
    lengths = {k: int(v.shape[1]) for k, v in batch.items() if np.ndim(v) == 2}
    flops = model.flops_per_token(lengths)
    require(isinstance(flops, (int, float)) and flops > 0, f"flops_per_token must be positive, got {flops!r}")


def check_partitioner(partitioner: Partitioner, batch_size: int) -> None:
    """Checks ``partitioner`` with a small batch-sharded computation.

    Raises:
      ConformanceError: naming the broken rule.
    """
    require_members(partitioner, Partitioner)
    layout = partitioner.get_data_layout(batch_size)
    require(
        isinstance(layout, DataLayout),
        f"get_data_layout must return a DataLayout, got {type(layout).__name__}",
    )
    require(
        layout.batch_size == batch_size, f"DataLayout.batch_size={layout.batch_size}, asked for {batch_size}"
    )
    full = np.arange(batch_size * 4, dtype=np.float32).reshape(batch_size, 4)
    start = layout.shard_id * layout.per_shard_batch_size
    local = {"x": full[start : start + layout.per_shard_batch_size]}
    global_batch = partitioner.host_local_to_global(local, {"x": ("batch", None)})
    require(
        tuple(global_batch["x"].shape) == full.shape,
        f"global batch shape {global_batch['x'].shape} != {full.shape}",
    )
    double = partitioner.partition(
        lambda b: {"x": b["x"] * 2},
        in_shardings=({"x": ("batch", None)},),
        out_shardings={"x": ("batch", None)},
    )
    result = partitioner.global_to_host_local(double(global_batch))
    require(np.array_equal(np.asarray(result["x"]), full * 2), "a partitioned computation gave wrong numbers")


def check_checkpointer(make_checkpointer: Callable[[], Checkpointer], state: Mapping[str, Any]) -> None:
    """Checks checkpointers from ``make_checkpointer`` (all on one empty folder).

    ``state`` is a T5X state dict with numpy leaves.

    Raises:
      ConformanceError: naming the broken rule.
    """
    checkpointer = make_checkpointer()
    require_members(checkpointer, Checkpointer)
    require(checkpointer.latest_step() is None, "a new folder must have no latest step")
    input_state = {"epoch": 0, "position": 7}
    checkpointer.save(3, state, input_state)
    checkpointer.save(5, state)
    checkpointer.wait_until_finished()
    require(
        list(checkpointer.all_steps()) == [3, 5], f"all_steps must be [3, 5], got {checkpointer.all_steps()}"
    )
    checkpointer.close()

    reopened = make_checkpointer()
    require(
        reopened.latest_step() == 5, f"latest_step after reopening must be 5, got {reopened.latest_step()}"
    )
    restored = reopened.restore(3, target=state)
    require(
        isinstance(restored, RestoredCheckpoint),
        f"restore must return RestoredCheckpoint, got {type(restored).__name__}",
    )
    require(restored.step == 3, f"restored step must be 3, got {restored.step}")
    require(
        json.dumps(restored.input_state) == json.dumps(input_state),
        f"input_state came back as {restored.input_state!r}",
    )
    _require_same_tree(restored.state, state, "state")
    try:
        reopened.restore(4, target=state)
    except FileNotFoundError:
        pass
    else:
        require(False, "restoring a step that was never saved must raise FileNotFoundError")
    reopened.close()


def _require_same_tree(got: Any, want: Any, path: str) -> None:
    if isinstance(want, Mapping):
        require(
            isinstance(got, Mapping) and set(got) == set(want),
            f"{path}: keys {sorted(got)} != {sorted(want)}",
        )
        for key in want:
            _require_same_tree(got[key], want[key], f"{path}/{key}")
        return
    got_array, want_array = np.asarray(got), np.asarray(want)
    require(got_array.shape == want_array.shape, f"{path}: shape {got_array.shape} != {want_array.shape}")
    require(np.array_equal(got_array, want_array), f"{path}: values differ after restore")


def check_metric_writer(writer: MetricWriter) -> None:
    """Checks that ``writer`` accepts every call of the contract in order.

    What reached the destination is for the implementation's own tests to check.

    Raises:
      ConformanceError: naming the broken rule.
    """
    require_members(writer, MetricWriter)
    writer.write_hparams({"learning_rate": 0.01, "model": "tiny"})
    writer.write_scalars(1, {"loss": 2.5, "accuracy": 0.25})
    writer.write_texts(1, {"prediction": "hello"})
    writer.flush()
    writer.close()
    try:
        writer.write_scalars(2, {"loss": 1.0})
    except RuntimeError:
        return
    require(False, "writing after close must raise RuntimeError")
