"""Evaluator with fake predict / score functions: order, padding, sharding, postprocessing, loggers."""

from __future__ import annotations

import glob
import json
import logging
import threading

import numpy as np
import pytest
import tensorflow as tf
from tasks_testlib import PadConverter

import t5x.tasks as tt
from t5x.interfaces import ShardInfo
from t5x.tasks._evaluator import Evaluator
from t5x.tasks._loggers import JSONLogger, PyLoggingLogger, TensorBoardLogger
from t5x.tasks.metrics import sequence_accuracy

PAIRS = [(f"question {i}", f"answer {i}" if i % 3 else f"question {i}") for i in range(7)]


def record_predictions(targets, predictions):
    return {"n": len(predictions), "first": predictions[0], "all": list(predictions)}


def mean_score(targets, scores):
    return {"mean_score": float(np.mean(scores))}


@pytest.fixture
def qa_task(vocab, clean_registry):
    source = tt.InMemoryDataSource({"validation": [{"inputs": a, "targets": b} for a, b in PAIRS]})
    return tt.TaskRegistry.add(
        "eval_qa",
        source=source,
        output_features={"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)},
        preprocessors=[tt.tokenize, tt.append_eos],
        postprocess_fn=lambda text, example=None, is_target=False: text.upper(),
        metric_fns=[sequence_accuracy, record_predictions, mean_score],
    )


def echo_inputs(calls):
    def predict(batch):
        calls.append({k: v.shape for k, v in batch.items()})
        return batch["inputs"]  # the model "answers" with its input

    return predict


def length_score(batch):
    return -(batch["targets"] > 0).sum(axis=1).astype(np.float32)


def test_order_padding_postprocessing(qa_task):
    calls = []
    ev = Evaluator("eval_qa", PadConverter(), batch_size=4)
    metrics = ev.evaluate(compute_metrics=True, step=3, predict_fn=echo_inputs(calls), score_fn=length_score)
    got = metrics.result()["eval_qa"]
    assert [c["inputs"][0] for c in calls] == [4, 4]  # 7 examples -> two full batches (one padded)
    assert got["all"] == [a.upper() for a, _ in PAIRS]  # postprocessed, in dataset order
    assert ev.cached_targets()["eval_qa"] == [b.upper() for _, b in PAIRS]
    assert got["sequence_accuracy"] == pytest.approx(100 * 3 / 7)  # i = 0, 3, 6 echo their target
    want_scores = [-(len(b) + 1) for _, b in PAIRS]  # bytes + EOS
    assert got["mean_score"] == pytest.approx(np.mean(want_scores))
    assert ev.evaluate(compute_metrics=False, predict_fn=echo_inputs([]), score_fn=length_score) is None
    ev.close()


def test_order_preserved_through_host_sharding(qa_task):
    barrier, lock, pool = threading.Barrier(2), threading.Lock(), []

    def all_gather(pairs):
        # One collective round: contribute, wait for the other host, read all, reset.
        with lock:
            pool.extend(pairs)
        barrier.wait()
        out = list(pool)
        if barrier.wait() == 0:
            pool.clear()
        barrier.wait()
        return out

    results, calls = {}, {0: [], 1: []}

    def host(index):
        ev = Evaluator(
            "eval_qa", PadConverter(), batch_size=2, shard_info=ShardInfo(index, 2), gather_fn=all_gather
        )
        future = ev.evaluate(
            compute_metrics=True, predict_fn=echo_inputs(calls[index]), score_fn=lambda b: np.zeros(2)
        )
        results[index] = future.result()["eval_qa"]["all"]

    threads = [threading.Thread(target=host, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results[0] == results[1] == [a.upper() for a, _ in PAIRS]
    assert len(calls[0]) == len(calls[1]) == 2  # 4 and 3 examples -> 2 calls each (host 1 padded)
    assert all(c["inputs"][0] == 2 for c in calls[0] + calls[1])
    with pytest.raises(ValueError, match="gather_fn"):
        Evaluator("eval_qa", PadConverter(), shard_info=ShardInfo(0, 2))


def test_every_logger_writes(qa_task, tmp_path, caplog):
    ev = Evaluator(
        "eval_qa",
        PadConverter(),
        batch_size=3,
        logger_cls=[JSONLogger, TensorBoardLogger, PyLoggingLogger],
        log_dir=str(tmp_path),
    )
    with caplog.at_level(logging.INFO, logger="t5x.tasks.evaluation"):
        got = ev.evaluate(
            compute_metrics=True, step=5, predict_fn=echo_inputs([]), score_fn=length_score
        ).result()
    # JSON Lines
    lines = [json.loads(x) for x in (tmp_path / "eval_qa-000005.jsonl").read_text().splitlines()]
    assert [x["inputs"] for x in lines] == [a for a, _ in PAIRS]
    assert [x["targets"] for x in lines] == [b for _, b in PAIRS]
    assert [x["prediction"] for x in lines] == [a.upper() for a, _ in PAIRS]
    assert lines[1]["score"] == -(len(PAIRS[1][1]) + 1)
    summary = [json.loads(x) for x in (tmp_path / "eval_qa-metrics.jsonl").read_text().splitlines()]
    assert summary[0]["step"] == 5 and summary[0]["sequence_accuracy"] == pytest.approx(100 * 3 / 7)
    # TensorBoard
    events = glob.glob(str(tmp_path / "eval_qa" / "events.out.tfevents.*"))
    assert len(events) == 1
    scalars = {}
    for record in tf.data.TFRecordDataset(events):
        event = tf.compat.v1.Event.FromString(record.numpy())
        for value in event.summary.value:
            scalars[value.tag] = (event.step, float(tf.make_ndarray(value.tensor)))
            assert value.metadata.plugin_data.plugin_name == "scalars"
    assert scalars["eval/sequence_accuracy"] == (5, pytest.approx(got["eval_qa"]["sequence_accuracy"]))
    assert "eval/all" not in scalars  # non-numeric metrics are not scalars
    # console (Python logging)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("eval_qa/sequence_accuracy at step 5: 42.857") for m in messages)
    ev.close()


def test_errors_name_the_problem(qa_task):
    class Packing(PadConverter):
        pack = True

    with pytest.raises(ValueError, match="packs examples"):
        Evaluator("eval_qa", Packing())
    ev = Evaluator("eval_qa", PadConverter(), batch_size=4)
    with pytest.raises(ValueError, match="returned 3 outputs for a batch of 4 rows"):
        ev.evaluate(compute_metrics=True, predict_fn=lambda b: b["inputs"][:3], score_fn=length_score)
    with pytest.raises(ValueError, match="no score_fn"):
        ev.evaluate(compute_metrics=True, predict_fn=echo_inputs([]), score_fn=None)
