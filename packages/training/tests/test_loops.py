"""The train loop: exact resume after a kill, SIGTERM, non-finite losses, early stopping."""

import json
import math
import os
import signal
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from training_doubles import ArrayIterator, LocalPartitioner, NpzCheckpointer, TinyModel, make_data

from t5x.training import (
    EarlyStopping,
    NonFiniteLossError,
    Trainer,
    adafactor,
    evaluate,
    init_train_state,
    train,
)

SCRIPT = os.path.join(os.path.dirname(__file__), "train_script.py")
SHAPES = {"inputs": (8, 8), "targets": (8, 8)}


def _spawn(workdir, total_steps, *extra):
    extra = (*extra, "--checkpointer", "t5x")
    os.makedirs(workdir, exist_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(workdir), str(total_steps), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _result(workdir):
    with open(os.path.join(workdir, "result.json")) as f:
        result = json.load(f)
    with np.load(os.path.join(workdir, "params.npz")) as params:
        return result, {k: params[k] for k in params.files}


@pytest.mark.slow
def test_resume_after_kill_reproduces_uninterrupted_run(tmp_path):
    straight = _spawn(tmp_path / "straight", 20)
    killed = _spawn(tmp_path / "resumed", 20, "--die-after", "12")
    rc, out, err = _finish(straight)
    assert rc == 0, err
    rc, out, err = _finish(killed)
    assert rc == -signal.SIGKILL, (rc, err)
    assert "step 12 " in out
    restarted = _spawn(tmp_path / "resumed", 20)
    rc, out, err = _finish(restarted)
    assert rc == 0, err

    want, want_params = _result(tmp_path / "straight")
    got, got_params = _result(tmp_path / "resumed")
    # Checkpoints every 5 steps, saved asynchronously: the kill at 12 may have beaten the save of 10.
    start = got["start_step"]
    assert start in (5, 10)
    assert sorted(int(s) for s in got["losses"]) == list(range(start, 20))
    for step, loss in got["losses"].items():
        assert loss == want["losses"][step], step
    assert want_params.keys() == got_params.keys()
    for name in want_params:
        np.testing.assert_array_equal(got_params[name], want_params[name], err_msg=name)


def test_sigterm_saves_checkpoint_and_exits_cleanly(tmp_path):
    proc = _spawn(tmp_path, 10_000, "--slow")
    for line in proc.stdout:
        if line.startswith("step 3 "):
            proc.send_signal(signal.SIGTERM)
            break
    rc, _out, err = _finish(proc)
    assert rc == 0, err
    result, _ = _result(tmp_path)
    assert result["stop_reason"] == "signal"
    assert result["signal"] == signal.SIGTERM
    reached = result["step"]
    assert 3 <= reached < 10_000
    assert os.path.isdir(tmp_path / "model" / f"checkpoint_{reached}")


def _trainer(model=None, lr=0.1):
    model = model or TinyModel()
    partitioner = LocalPartitioner()
    init = init_train_state(
        model, adafactor(), partitioner, SHAPES, {"inputs": np.int32, "targets": np.int32}
    )
    return Trainer(model, partitioner, init.state, init.shardings, learning_rate_fn=lambda step: lr)


class ExplodingModel(TinyModel):
    """Gives a NaN loss once the step's inputs contain the token 15 in the first row."""

    def loss_fn(self, params, batch, dropout_rng):
        loss, metrics = super().loss_fn(params, batch, dropout_rng)
        bad = batch["inputs"][0, 0] == 15
        loss = jnp.where(bad, jnp.nan, loss)
        metrics["loss"] = loss
        return loss, metrics


def test_non_finite_loss_stops_with_step_and_keeps_last_good_checkpoint(tmp_path):
    data = make_data(64, seed=5)
    rows = np.where(data["inputs"][:, 0] != 15)[0]
    clean = {k: v[rows] for k, v in data.items()}
    poisoned = {k: v.copy() for k, v in clean.items()}
    poisoned["inputs"][6 * 4, 0] = 15  # the first row of batch 6 (batch size 4, no shuffle)
    iterator = ArrayIterator(poisoned, batch_size=4, shuffle=False)
    checkpointer = NpzCheckpointer(str(tmp_path))
    trainer = _trainer(ExplodingModel())
    with pytest.raises(NonFiniteLossError, match="train step 6") as info:
        train(trainer, iterator, total_steps=20, checkpointer=checkpointer, checkpoint_period=4)
    assert info.value.step == 6
    assert math.isnan(info.value.loss)
    assert info.value.last_checkpoint_step == 4
    assert checkpointer.all_steps() == [4]


def _signal_at(step_to_signal, *signals):
    def on_step(step, metrics):
        del metrics
        if step == step_to_signal:
            for signum in signals:
                os.kill(os.getpid(), signum)

    return on_step


def test_sigint_stops_after_the_step_with_its_number_and_restores_the_handlers(tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    checkpointer = NpzCheckpointer(str(tmp_path))
    result = train(
        _trainer(),
        ArrayIterator(make_data(64), batch_size=4),
        total_steps=50,
        checkpointer=checkpointer,
        checkpoint_period=10,
        on_step=_signal_at(3, signal.SIGINT),
    )
    assert (result.stop_reason, result.signal, result.step) == ("signal", signal.SIGINT, 3)
    assert checkpointer.all_steps() == [3]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_second_sigint_aborts_at_once(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    checkpointer = NpzCheckpointer(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        train(
            _trainer(),
            ArrayIterator(make_data(64), batch_size=4),
            total_steps=50,
            checkpointer=checkpointer,
            checkpoint_period=10,
            on_step=_signal_at(3, signal.SIGTERM, signal.SIGINT),
        )
    assert checkpointer.all_steps() == []  # no waiting for the save of step 3
    assert signal.getsignal(signal.SIGINT) == before


def test_a_signal_during_the_final_save_is_reported(tmp_path):
    class SignalledOnSave(NpzCheckpointer):
        def save(self, step, train_state, input_state=None):
            super().save(step, train_state, input_state)
            os.kill(os.getpid(), signal.SIGTERM)

    checkpointer = SignalledOnSave(str(tmp_path))
    result = train(
        _trainer(), ArrayIterator(make_data(64), batch_size=4), total_steps=5, checkpointer=checkpointer
    )
    # Training was complete, but a caller that runs several trainings must still learn of the signal.
    assert (result.stop_reason, result.signal, result.step) == ("completed", signal.SIGTERM, 5)
    assert checkpointer.all_steps() == [5]


def test_early_stopping_and_evaluate():
    trainer = _trainer(lr=0.0)  # the eval loss can never improve
    stopper = EarlyStopping(metric=("valid", "loss"), mode="min", patience=2)
    eval_data = make_data(16, seed=7)
    result = train(
        trainer,
        ArrayIterator(make_data(64), batch_size=8),
        total_steps=100,
        eval_sources={"valid": lambda: ArrayIterator(eval_data, batch_size=8, repeat=False)},
        eval_period=2,
        early_stopping=stopper,
    )
    assert result.stop_reason == "early_stopping"
    assert result.step == 6  # evaluations at 2 (best), 4 (miss), 6 (miss)
    metrics = evaluate(
        trainer,
        {"valid": ArrayIterator(eval_data, batch_size=8, repeat=False)},
        inference_evaluators={"valid": lambda params: {"bias_sum": float(np.sum(params["out"]["bias"]))}},
    )
    assert metrics["valid"]["loss"] == pytest.approx(result.eval_metrics["valid"]["loss"], rel=1e-6)
    assert metrics["valid"]["bias_sum"] == 0.0  # lr 0: the zero-initialised bias never moved
    with pytest.raises(ValueError, match="'empty'"):
        evaluate(trainer, {"empty": []})
