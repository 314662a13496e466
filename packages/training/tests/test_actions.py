"""Periodic train-eval and inference-eval, actions, checkpoint_steps and gc_period in the train loop."""

import gc
import math

import numpy as np
import pytest
from training_doubles import ArrayIterator, LocalPartitioner, NpzCheckpointer, TinyModel, make_data

from t5x.training import (
    ActionMode,
    EarlyStoppingAction,
    TerminateOnNanAction,
    Trainer,
    adafactor,
    init_train_state,
    train,
)
from t5x.training._actions import normalize_actions

SHAPES = {"inputs": (8, 8), "targets": (8, 8)}
EVAL_DATA = make_data(16, seed=7)


def _trainer(lr=0.1):
    partitioner = LocalPartitioner()
    init = init_train_state(
        TinyModel(), adafactor(), partitioner, SHAPES, {"inputs": np.int32, "targets": np.int32}
    )
    return Trainer(TinyModel(), partitioner, init.state, init.shardings, learning_rate_fn=lambda step: lr)


def _valid():
    return ArrayIterator(EVAL_DATA, batch_size=8, repeat=False)


class Recorder:
    """Records what the loop gave it; asks to stop at ``stop_at``."""

    def __init__(self, stop_at=None):
        self.seen, self.stop_at = [], stop_at

    def run(self, step, metrics_by_task):
        self.seen.append((step, {t: dict(m) for t, m in metrics_by_task.items()}))
        return step == self.stop_at


def test_inference_eval_and_train_eval_run_every_eval_period_and_before_training():
    calls = []

    def inference_eval(step, params):
        calls.append(step)
        return {"task": {"bias_sum": float(np.sum(params["out"]["bias"])), "step": float(step)}}

    recorders = {mode: Recorder() for mode in ("TRAIN", "TRAIN_EVAL", "INFER_EVAL")}
    result = train(
        _trainer(),
        ArrayIterator(make_data(64), batch_size=8),
        total_steps=5,
        eval_sources={"valid": _valid},
        eval_period=2,
        eval_batches=1,
        inference_eval=inference_eval,
        run_eval_before_training=True,
        actions={mode: [rec] for mode, rec in recorders.items()},
    )
    assert result.stop_reason == "completed" and result.step == 5
    assert calls == [0, 2, 4, 5]  # before training, every 2 steps, and at the end
    assert [s for s, _ in recorders["INFER_EVAL"].seen] == [0, 2, 4, 5]
    assert recorders["INFER_EVAL"].seen[1][1]["task"]["step"] == 2.0
    assert [s for s, _ in recorders["TRAIN_EVAL"].seen] == [0, 2, 4, 5]
    assert set(recorders["TRAIN_EVAL"].seen[1][1]) == {"valid"}
    # TRAIN actions: every eval_period steps, the chunk's mean train metrics under "train".
    train_seen = recorders["TRAIN"].seen
    assert [s for s, _ in train_seen] == [2, 4]
    mean_loss = (result.losses[2] + result.losses[3]) / 2
    assert train_seen[1][1]["train"]["loss"] == pytest.approx(mean_loss, rel=1e-5)
    assert result.inference_metrics["task"]["step"] == 5.0


def test_early_stopping_action_stops_and_saves(tmp_path):
    checkpointer = NpzCheckpointer(str(tmp_path))
    stopper = EarlyStoppingAction(metric=("valid", "loss"), mode="min", patience=2)
    result = train(
        _trainer(lr=0.0),  # the eval loss never improves
        ArrayIterator(make_data(64), batch_size=8),
        total_steps=100,
        checkpointer=checkpointer,
        checkpoint_period=50,
        eval_sources={"valid": _valid},
        eval_period=2,
        actions={ActionMode.TRAIN_EVAL: [stopper]},
    )
    assert (result.stop_reason, result.step) == ("action", 6)  # 2 best, 4 miss, 6 miss
    assert result.stopped_by.startswith("TRAIN_EVAL: EarlyStoppingAction(valid/loss")
    assert checkpointer.all_steps() == [6]


def test_early_stopping_action_counts_improvements_with_tolerances():
    action = EarlyStoppingAction(metric=("t", "acc"), mode="max", patience=2, atol=0.1)
    runs = [0.5, 0.55, 0.7, 0.75, 0.79]  # +0.05 is no improvement with atol 0.1
    stops = [action.run(i, {"t": {"acc": v}}) for i, v in enumerate(runs)]
    assert stops == [False, False, False, False, True]
    with pytest.raises(KeyError, match="t/missing"):
        EarlyStoppingAction(metric=("t", "missing"), mode="max").run(0, {"t": {"acc": 1.0}})
    with pytest.raises(ValueError, match="mode"):
        EarlyStoppingAction(metric=("t", "acc"), mode="up")


def test_terminate_on_nan_action_stops_on_a_non_finite_eval_metric():
    def inference_eval(step, params):
        return {"task": {"score": math.nan if step >= 4 else 1.0}}

    result = train(
        _trainer(),
        ArrayIterator(make_data(64), batch_size=8),
        total_steps=10,
        eval_period=2,
        inference_eval=inference_eval,
        actions={"INFER_EVAL": [TerminateOnNanAction(task="task", metric="score")]},
    )
    assert (result.stop_reason, result.step) == ("action", 4)
    assert "TerminateOnNanAction(task/score = nan)" in result.stopped_by
    assert not TerminateOnNanAction("other").run(0, {"task": {"loss": math.nan}})


def test_actions_are_checked_by_mode_and_method():
    with pytest.raises(ValueError, match="unknown action mode 'EVAL'"):
        normalize_actions({"EVAL": []})
    with pytest.raises(TypeError, match=r"actions\[TRAIN\]: 3 has no run"):
        normalize_actions({"TRAIN": [3]})


def test_checkpoint_steps_and_gc_period(tmp_path, monkeypatch):
    collected = []
    states = []
    real_collect = gc.collect

    def collect(*args):
        collected.append(True)
        states.append(gc.isenabled())
        return real_collect(*args)

    monkeypatch.setattr(gc, "collect", collect)
    checkpointer = NpzCheckpointer(str(tmp_path))
    assert gc.isenabled()
    train(
        _trainer(),
        ArrayIterator(make_data(64), batch_size=8),
        total_steps=7,
        checkpointer=checkpointer,
        checkpoint_period=4,
        checkpoint_steps=[1, 6],
        gc_period=3,
    )
    assert checkpointer.all_steps() == [1, 4, 6, 7]
    assert len(collected) == 2 and states == [False, False]  # at steps 3 and 6, automatic gc off
    assert gc.isenabled()  # switched back on after training
