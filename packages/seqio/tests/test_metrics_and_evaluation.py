"""seqio.metrics' metric objects, seqio.evaluation's Evaluator / MetricManager and provenance tracking."""

from __future__ import annotations

import dataclasses
import inspect
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import t5x.seqio as seqio
import t5x.tasks as core
from t5x.seqio import evaluation, metrics
from t5x.seqio import task_registry_provenance_tracking as provenance

PT = metrics.ModelOutputType
VOCAB = seqio.PassThroughVocabulary(size=50)


class WordVocab(seqio.PassThroughVocabulary):
    """Decodes ids as words ``w<id>`` (so decoded predictions are readable strings)."""

    def decode(self, ids):
        return " ".join(f"w{int(i)}" for i in ids if int(i) > 1)


WORDS = {"targets": seqio.Feature(WordVocab(size=50))}


def accuracy(targets, predictions):
    return {"accuracy": 100 * float(np.mean([t == p for t, p in zip(targets, predictions, strict=True)]))}


def first_score(targets, scores):
    return {"first_score": float(scores[0]), "n": len(targets)}


def aux_sum(targets, predictions, aux_values):
    return {"aux_sum": float(np.sum(aux_values["conf"]))}


# ---- metric functions and metric objects ----------------------------------------------------


def test_metric_fn_output_type_reads_required_positional_parameters():
    assert metrics.metric_fn_output_type(accuracy) is PT.PREDICTION
    assert metrics.metric_fn_output_type(first_score) is PT.SCORE
    assert metrics.metric_fn_output_type(aux_sum) is PT.PREDICTION_WITH_AUX
    assert metrics.metric_fn_output_type(lambda targets, predictions, k=3: {}) is PT.PREDICTION
    with pytest.raises(ValueError, match=r"Got: \('predictions', 'targets'\)$"):
        metrics.metric_fn_output_type(lambda predictions, targets: {})


def test_legacy_metric_decodes_postprocesses_and_keeps_targets_once():
    post = mock.Mock(side_effect=lambda x, example, is_target: x.upper() if is_target else x)
    metric = metrics.LegacyMetric.empty(accuracy, post)
    assert metric.model_output_type is PT.PREDICTION
    inputs = [{"targets_pretokenized": b"w5 w6"}, {"targets": np.array([7])}]
    out = metric.from_model_output(inputs, np.array([[5, 6], [7, 0]]), WORDS)
    assert out is metric  # seqio's LegacyMetric fills itself in
    assert metric.targets_and_inferences == {
        "targets": ["W5 W6", "W7"],
        "output": ["w5 w6", "w7"],
        "prediction": ["w5 w6", "w7"],
    }
    assert metric.compute() == {"accuracy": 0.0}  # targets upper-cased by the postprocessor
    calls = post.call_count
    metric.from_model_output(inputs, np.array([[5, 6], [7, 0]]), WORDS)
    assert post.call_count == calls + 2  # only the two predictions: targets were kept
    scored = metrics.LegacyMetric.empty(first_score, None).from_model_output(
        inputs, np.array([0.5, 2.0]), WORDS
    )
    assert scored.compute() == {"first_score": 0.5, "n": 2}
    assert scored.targets_and_inferences["score"].tolist() == [0.5, 2.0]


def test_passthrough_metric_collects_merges_then_drops_padding_and_restores_order():
    cls = metrics.PassthroughLegacyMetric.from_metric_fn(accuracy)
    assert cls.model_output_type is PT.PREDICTION and cls.__name__ == "FromMetricFun"
    empty = cls.empty()
    assert empty.values == {} and isinstance(empty, metrics.CollectingMetric)
    # Two batches from two shards, out of order, the second with one padding row.
    b1 = cls.from_model_output(
        None, np.array([[6, 0], [5, 0]]), WORDS, mask=np.array([1, 1]), indices_2d=np.array([[1, 0], [0, 1]])
    )
    b2 = cls.from_model_output(
        None, np.array([[4, 0], [9, 9]]), WORDS, mask=np.array([1, 0]), indices_2d=np.array([[0, 0], [0, 0]])
    )
    merged = empty.merge(b1).merge(b2).merge(cls.empty())
    assert merged.values["model_output"].shape == (4, 2)
    np.testing.assert_array_equal(merged.values["mask"], [1, 1, 1, 0])
    examples = [{"targets_pretokenized": t} for t in (b"w4", b"w5", b"w6")]  # (0,0), (0,1), (1,0)
    value, record = merged.actual_compute(examples, WORDS)
    assert value == {"accuracy": 100.0}
    assert record["output"] == ["w4", "w5", "w6"] and record["targets"] == ["w4", "w5", "w6"]
    with pytest.raises(ValueError, match="3 model outputs .* for 2 targets"):
        merged.actual_compute(examples[:2], WORDS)


def test_passthrough_metric_scores_and_aux_values_follow_the_same_order():
    scored = metrics.PassthroughLegacyMetric.from_metric_fn(first_score).empty()
    batch = scored.from_model_output(None, np.array([2.0, 1.0]), WORDS, indices_2d=np.array([[0, 1], [0, 0]]))
    examples = [{"targets_pretokenized": b"a"}, {"targets_pretokenized": b"b"}]
    assert batch.actual_compute(examples, WORDS)[0] == {"first_score": 1.0, "n": 2}
    aux = metrics.PassthroughLegacyMetric.from_metric_fn(aux_sum)
    assert aux.model_output_type is PT.PREDICTION_WITH_AUX
    out = (np.array([[5], [6], [7]]), {"conf": np.array([0.5, 0.25, 8.0])})
    got = aux.from_model_output(None, out, WORDS, mask=np.array([1, 1, 0]))
    value, record = got.actual_compute(examples, WORDS)
    assert value == {"aux_sum": 0.75} and record["output"] == ["w5", "w6"]


def test_padding_and_sorting_helpers_treat_tuples_and_dicts_as_structure():
    out = (np.array([10, 11, 12]), {"s": [0.1, 0.2, 0.3]})
    indices, kept = metrics.remove_padding_examples(
        out, np.array([[0, 2], [1, 0], [0, 1]]), np.array([1, 0, 1])
    )
    np.testing.assert_array_equal(indices, [[0, 2], [0, 1]])
    np.testing.assert_array_equal(kept[0], [10, 12])
    assert kept[1] == {"s": [0.1, 0.3]}  # a list stays a list, rows picked
    ordered = metrics.globally_sort_model_output(kept, indices)
    np.testing.assert_array_equal(ordered[0], [12, 10])
    assert ordered[1] == {"s": [0.3, 0.1]}


@dataclasses.dataclass(frozen=True)
class Count(metrics.Metric):
    """A batch-updatable metric written against seqio.Metric (counts unmasked examples)."""

    model_output_type: metrics.ModelOutputType = PT.PREDICTION
    count: int = 0

    @classmethod
    def empty(cls):
        return cls(count=0)

    @classmethod
    def from_model_output(
        cls, inputs, model_output, features, target_field_name="targets", mask=None, indices_2d=None
    ):
        return cls(count=int(np.sum(mask)) if mask is not None else len(inputs))

    def merge(self, other):
        return type(self)(count=self.count + other.count)

    def compute(self):
        return {"count": self.count}


def test_metric_manager_accumulates_batches_per_task_and_output_type():
    task = mock.Mock()
    task.name = "mm"
    task.metric_objs = [metrics.PassthroughLegacyMetric.from_metric_fn(accuracy).empty(), Count.empty()]
    manager = evaluation.MetricManager([task])
    manager.initialize_metrics("mm", PT.PREDICTION)
    batch = manager.from_model_output(
        "mm", PT.PREDICTION, [{}, {}, {}], np.array([[5], [6], [7]]), WORDS, mask=np.array([1, 1, 0])
    )
    manager.merge(batch, "mm", PT.PREDICTION)
    manager.merge(batch, "mm", PT.PREDICTION)
    manager.host_gather_and_reduce("mm", PT.PREDICTION)
    current = manager.output_metrics_collections["mm"][PT.PREDICTION]
    assert current.Count_1.count == 4
    assert current.FromMetricFun_0.values["model_output"].shape == (6, 1)
    assert current.compute()["Count_1"] == {"count": 4}
    with pytest.raises(ValueError, match="no metrics of type SCORE for task 'mm'"):
        manager.initialize_metrics("mm", PT.SCORE)


# ---- Task.metric_objs -------------------------------------------------------------------------


def test_task_metric_objs_are_the_given_objects_then_the_wrapped_functions(clean_registry):
    given = metrics.LegacyMetric.empty(first_score, None)
    task = seqio.TaskRegistry.add(
        "objs_task",
        source=core.InMemoryDataSource({"validation": [{"targets": "a"}]}),
        output_features={"targets": seqio.Feature(VOCAB)},
        metric_fns=[accuracy, aux_sum],
        metric_objs=[given],
    )
    objs = task.metric_objs
    assert objs[0] is given
    assert [o.model_output_type for o in objs[1:]] == [PT.PREDICTION, PT.PREDICTION_WITH_AUX]
    assert task.predict_with_aux_metric_fns == [aux_sum]
    assert task.replace(metric_objs=[]).metric_objs[0].model_output_type is PT.PREDICTION
    bad = seqio.Task(
        "bad_metric",
        core.InMemoryDataSource({"validation": [{"targets": "a"}]}),
        {},
        metric_fns=[lambda x: {}],
    )
    with pytest.raises(ValueError, match=r"Metric functions must have positional arguments .* Got: \('x',\)"):
        bad.metric_objs  # noqa: B018 (validated on first access, as seqio)


# ---- Evaluator --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eval_task():
    """A registered seqio Task with predict, score and aux metrics over three examples."""
    rows = [([5, 6], "w5 w6"), ([7], "w7"), ([8, 9, 5], "w8 w9 w5")]

    def dataset_fn(split, shuffle_files, seed=None):
        return tf.data.Dataset.from_generator(
            lambda: (
                {
                    "inputs": np.arange(1 + i, dtype=np.int32) + 3,
                    "targets": np.array(t, np.int32),
                    "targets_pretokenized": s,
                }
                for i, (t, s) in enumerate(rows)
            ),
            output_signature={
                "inputs": tf.TensorSpec([None], tf.int32),
                "targets": tf.TensorSpec([None], tf.int32),
                "targets_pretokenized": tf.TensorSpec([], tf.string),
            },
        )

    feature = seqio.Feature(WordVocab(size=50), add_eos=False)
    task = seqio.TaskRegistry.add(
        "h1_eval_task",
        source=seqio.FunctionDataSource(dataset_fn, splits="validation"),
        output_features={"inputs": feature, "targets": feature},
        metric_fns=[accuracy, first_score, aux_sum],
    )
    yield task
    core.TaskRegistry.remove("h1_eval_task")


def _targets_by_index(ds):
    return [(int(i), ex["decoder_target_tokens"]) for i, ex in ds.as_numpy_iterator()]


def test_evaluator_caches_examples_runs_each_callable_once_and_logs_seqio_style(eval_task, tmp_path):
    logger_cls = mock.Mock()
    evaluator = seqio.Evaluator(
        "h1_eval_task",
        feature_converter=seqio.EncDecFeatureConverter(pack=False),
        logger_cls=[logger_cls],
        log_dir=str(tmp_path),
    )
    logger_cls.assert_called_once_with(output_dir=str(tmp_path))
    assert [t.name for t in evaluator.eval_tasks] == ["h1_eval_task"]
    # Lengths measured from the longest example: inputs 3, targets 3.
    assert evaluator.model_feature_shapes["encoder_input_tokens"] == (3,)
    assert evaluator.model_feature_shapes["decoder_target_tokens"] == (3,)
    assert len(list(evaluator.cached_task_datasets["h1_eval_task"])) == 3
    assert evaluator.cached_targets == {"h1_eval_task": ["w5 w6", "w7", "w8 w9 w5"]}
    calls = []

    def predict_fn(ds):
        calls.append("predict")
        assert ds is evaluator.cached_model_datasets["h1_eval_task"]
        pairs = _targets_by_index(ds)
        pairs[1] = (1, np.array([6, 0, 0], np.int32))  # one wrong prediction
        return list(reversed(pairs))  # any order: the index puts them back

    def score_fn(ds):
        calls.append("score")
        return [(i, float(10 - i)) for i, _ in _targets_by_index(ds)][::-1]

    def predict_with_aux_fn(ds):
        calls.append("aux")
        pairs = _targets_by_index(ds)
        return pairs[::-1], {"conf": [3.0, 2.0, 1.0]}

    future, outputs = evaluator.evaluate(
        compute_metrics=True,
        step=7,
        predict_fn=predict_fn,
        score_fn=score_fn,
        predict_with_aux_fn=predict_with_aux_fn,
    )
    assert sorted(calls) == ["aux", "predict", "score"]
    result = future.result()["h1_eval_task"]
    assert result == {"accuracy": pytest.approx(200 / 3), "first_score": 10.0, "n": 3, "aux_sum": 6.0}
    assert outputs["h1_eval_task"][PT.SCORE] == [10.0, 9.0, 8.0]
    tokens, aux = outputs["h1_eval_task"][PT.PREDICTION_WITH_AUX]
    assert aux == {"conf": [1.0, 2.0, 3.0]} and list(tokens[0]) == [5, 6, 0]
    logger = logger_cls.return_value
    logger.assert_called_once()
    kwargs = logger.call_args.kwargs
    assert kwargs["task_name"] == "h1_eval_task" and kwargs["step"] == 7
    assert kwargs["metrics"]["accuracy"] == metrics.Scalar(pytest.approx(200 / 3))
    assert kwargs["dataset"] is evaluator.cached_task_datasets["h1_eval_task"]
    assert kwargs["targets"] == ["w5 w6", "w7", "w8 w9 w5"]
    # Each metric's inferences by kind; a later metric's replace an earlier one's (seqio's rule):
    # "prediction" is the aux metric's here, whose model output was right.
    assert set(kwargs["inferences"]) == {"output", "prediction", "score", "aux_value"}
    assert kwargs["inferences"]["prediction"] == ["w5 w6", "w7", "w8 w9 w5"]
    assert kwargs["inferences"]["score"] == [10.0, 9.0, 8.0]
    # compute_metrics=False still runs the model, and the future holds None.
    future, outputs = evaluator.evaluate(
        compute_metrics=False,
        predict_fn=predict_fn,
        score_fn=score_fn,
        predict_with_aux_fn=predict_with_aux_fn,
    )
    assert future.result() is None and set(outputs["h1_eval_task"]) == {
        PT.PREDICTION,
        PT.SCORE,
        PT.PREDICTION_WITH_AUX,
    }
    with pytest.raises(ValueError, match="'h1_eval_task' has SCORE metrics but no score_fn was given"):
        evaluator.evaluate(
            compute_metrics=False, predict_fn=predict_fn, predict_with_aux_fn=predict_with_aux_fn
        )
    evaluator.close()


def test_evaluator_given_lengths_win_and_missing_ones_are_measured(eval_task):
    evaluator = seqio.Evaluator(
        "h1_eval_task", seqio.EncDecFeatureConverter(pack=False), sequence_length={"targets": 6}
    )
    assert evaluator.model_feature_shapes["decoder_target_tokens"] == (6,)
    assert evaluator.model_feature_shapes["encoder_input_tokens"] == (3,)
    first = next(iter(evaluator.cached_model_datasets["h1_eval_task"].as_numpy_iterator()))
    assert first[0] == 0 and list(first[1]["decoder_target_tokens"]) == [5, 6, 0, 0, 0, 0]
    limited = seqio.Evaluator("h1_eval_task", seqio.EncDecFeatureConverter(pack=False), num_examples=2)
    assert limited.model_feature_shapes["decoder_target_tokens"] == (2,)


def test_evaluator_refusals_name_the_problem(eval_task, clean_registry):
    with pytest.raises(
        ValueError, match="^'log_dir' must be provided to `Evaluator` if `logger_cls` is non-empty.$"
    ):
        seqio.Evaluator("h1_eval_task", seqio.EncDecFeatureConverter(pack=False), logger_cls=[mock.Mock()])
    with pytest.raises(ValueError, match="During evaluation, packing can't be used"):
        seqio.Evaluator("h1_eval_task", seqio.EncDecFeatureConverter(pack=True))

    def needs_lengths(ds, sequence_length):
        return ds

    seqio.TaskRegistry.add(
        "h1_needs_lengths",
        source=core.InMemoryDataSource({"validation": [{"targets": "a"}]}),
        preprocessors=[needs_lengths],
        output_features={"targets": seqio.Feature(VOCAB)},
        metric_fns=[accuracy],
    )
    with pytest.raises(
        ValueError, match="Preprocessor 'needs_lengths' in task 'h1_needs_lengths' has a `sequence_length`"
    ):
        seqio.Evaluator("h1_needs_lengths", mock.Mock(pack=False))
    # No task with metrics: nothing is read, a packing converter is fine, evaluate gives ({}, {}).
    seqio.TaskRegistry.add(
        "h1_no_metrics",
        source=core.InMemoryDataSource({"validation": [{"targets": "a"}]}),
        output_features={"targets": seqio.Feature(VOCAB)},
    )
    idle = seqio.Evaluator("h1_no_metrics", seqio.EncDecFeatureConverter(pack=True))
    future, outputs = idle.evaluate(compute_metrics=True, predict_fn=mock.Mock())
    assert future.result() == {} and outputs == {}


def test_duplicate_metric_names_fail_the_task_with_its_name():
    task = mock.Mock(output_features=WORDS, metric_objs=[metrics.LegacyMetric.empty(accuracy, None)] * 2)
    task.name = "dup_task"
    ds = tf.data.Dataset.from_tensor_slices({"targets_pretokenized": [b"w5"]})

    def init(self):
        self._eval_tasks, self._cached_task_datasets = [task], {"dup_task": ds}
        self._cached_model_datasets = {"dup_task": ds.enumerate()}
        self._loggers, self._metrics_future, self._target_field_name = (), None, "targets"
        self._metrics_executor = None

    with mock.patch.object(evaluation.Evaluator, "__init__", init):
        evaluator = evaluation.Evaluator()
    # Without a metrics thread (async_compute_metrics=False) the error comes out of evaluate itself.
    with pytest.raises(ValueError, match="Failed to evaluate task dup_task: Duplicate metric key 'accuracy'"):
        evaluator.evaluate(compute_metrics=True, predict_fn=lambda ds: [(0, [5])])


def test_core_tasks_get_their_metric_functions_wrapped(clean_registry):
    core.TaskRegistry.add(
        "h1_core_task",
        source=core.InMemoryDataSource({"validation": [{"inputs": "a", "targets": "b"}] * 2}),
        preprocessors=[core.tokenize],
        output_features={
            "inputs": core.Feature(seqio.ByteVocabulary()),
            "targets": core.Feature(seqio.ByteVocabulary()),
        },
        metric_fns=[accuracy],
    )
    evaluator = seqio.Evaluator("h1_core_task", seqio.EncDecFeatureConverter(pack=False))
    future, _ = evaluator.evaluate(
        compute_metrics=True,
        predict_fn=lambda ds: [(int(i), ex["decoder_target_tokens"]) for i, ex in ds.as_numpy_iterator()],
    )
    assert future.result() == {"h1_core_task": {"accuracy": 100.0}}


def test_cache_and_measure_examples_measures_along_each_features_sequence_dim():
    task = mock.Mock(output_features={"inputs": None, "targets": None})
    task.name = "m"
    ds = tf.data.Dataset.from_tensor_slices({"inputs": [[[1, 2, 3]], [[4, 5, 6]]], "targets": [[1], [2]]})
    datasets, longest = evaluation._cache_and_measure_examples([task], lambda t: ds, {}, num_examples=1)
    assert longest == {"inputs": 1, "targets": 1}  # axis 0 of each [1, 3] inputs
    assert datasets["m"].cardinality().numpy() == 1
    _, longest = evaluation._cache_and_measure_examples([task], lambda t: ds, {"inputs": 1})
    assert longest == {"inputs": 3, "targets": 1}


# ---- provenance -------------------------------------------------------------------------------


def test_provenance_tracking_records_the_registering_call_site(clean_registry):
    provenance.turn_on_tracking()
    try:
        task = seqio.Task("h1_tracked", core.InMemoryDataSource({"train": [{"targets": "a"}]}), {})
        line = inspect.currentframe().f_lineno + 1
        seqio.TaskRegistry.add_provider("h1_tracked", task)
        kind, sites = provenance.view_provenances()["h1_tracked"]
        assert kind == "Task"
        assert sites[0] == f"{__file__}:{line}" and len(sites) <= 5
        provenance.view_provenances().clear()  # a copy: the record stays
        assert "h1_tracked" in provenance.view_provenances()
    finally:
        provenance._PROVIDER_PROVENANCE_LOOKUP = None
    assert not provenance.registration_provenance_tracking_is_on() and provenance.view_provenances() == {}


def test_file_source_without_splits_core_refuses_facade_accepts():
    """docs/differences.md row 15."""
    with pytest.raises(ValueError, match="TextLineDataSource needs at least one split"):
        core.TextLineDataSource({})
    assert seqio.TextLineDataSource({}).splits == ()
    assert seqio.FunctionDataSource(lambda split, shuffle_files: None, splits="validation").splits == (
        "validation",
    )


def test_core_evaluator_runs_a_seqio_tasks_metric_objects(eval_task, clean_registry):
    """t5x-launch evaluates with the core Evaluator: metric_objs= count there too."""
    task = seqio.TaskRegistry.add(
        "h1_objs_core",
        source=eval_task.source,
        output_features=eval_task.output_features,
        metric_fns=[accuracy],
        metric_objs=[Count.empty(), metrics.LegacyMetric.empty(first_score, None)],
    )
    assert [type(o).__name__ for o in task.extra_metric_objs] == ["Count", "LegacyMetric"]

    def predict(batch):
        return batch["decoder_target_tokens"]

    def score(batch):
        return np.arange(len(batch["decoder_target_tokens"]), dtype=np.float32) + 0.5

    ev = core.Evaluator("h1_objs_core", seqio.EncDecFeatureConverter(pack=False), batch_size=2)
    got = ev.evaluate(compute_metrics=True, predict_fn=predict, score_fn=score).result()["h1_objs_core"]
    assert got == {"accuracy": 100.0, "count": 3, "first_score": 0.5, "n": 3}
    assert "tokens" in ev.last_inferences["h1_objs_core"]  # raw ids kept for the objects
    ev.close()
