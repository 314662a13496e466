"""seqio.feature_converters extras, seqio.test_utils and seqio.metrics."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import t5x.seqio as seqio
import t5x.tasks as core
from t5x.seqio import feature_converters as fc
from t5x.seqio import metrics
from t5x.seqio import test_utils as tu

INT = fc.FeatureConverter.FeatureSpec(dtype=tf.int32)


def test_prefix_suffix_lm_matches_seqios_example():
    ds = tu.create_default_dataset(
        [
            {"inputs": [9, 4, 6], "targets": [3, 9], "suffixes": [2, 1]},
            {"inputs": [3, 2], "targets": [4], "suffixes": []},
        ],
        feature_names=("inputs", "targets", "suffixes"),
    )
    lengths = {"inputs": 7, "targets": 5, "suffixes": 3}
    ex = next(fc.PrefixSuffixLMFeatureConverter(pack=True)(ds, lengths).as_numpy_iterator())
    np.testing.assert_array_equal(ex["decoder_target_tokens"][:10], [9, 4, 6, 3, 9, 2, 1, 3, 2, 4])
    np.testing.assert_array_equal(ex["decoder_loss_weights"][:10], [0, 0, 0, 1, 1, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(ex["target_suffix_weights"][:10], [0, 0, 0, 0, 0, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(ex["decoder_segment_ids"][:11], [1] * 7 + [2] * 3 + [0])
    assert (
        fc.PrefixSuffixLMFeatureConverter().get_model_feature_lengths(lengths)["target_suffix_weights"] == 15
    )
    via_decoder = fc.DecoderFeatureConverter(pack=False)(ds, lengths)
    assert "target_suffix_weights" in via_decoder.element_spec


def test_passthrough_features_are_padded_and_copied():
    ds = tu.create_default_dataset(
        [{"inputs": [7, 8, 1], "targets": [3, 1], "idx": [5]}], feature_names=("inputs", "targets", "idx")
    )
    conv = fc.EncDecFeatureConverter(pack=False, passthrough_features={"idx": INT})
    ex = next(conv(ds, {"inputs": 4, "targets": 3, "idx": 2}).as_numpy_iterator())
    np.testing.assert_array_equal(ex["idx"], [5, 0])
    np.testing.assert_array_equal(ex["encoder_input_tokens"], [7, 8, 1, 0])
    assert conv.get_model_feature_lengths({"inputs": 4, "targets": 3, "idx": 2})["idx"] == 2
    prefix = fc.PrefixLMFeatureConverter(pack=False, passthrough_features={"idx": INT})
    assert next(prefix(ds, {"inputs": 4, "targets": 3, "idx": 1}).as_numpy_iterator())["idx"].tolist() == [5]
    with pytest.raises(ValueError, match="Packing is incompatible with pass-through features."):
        fc.EncDecFeatureConverter(pack=True, passthrough_features={"idx": INT})
    with pytest.raises(ValueError, match="missing features"):
        conv(ds, {"inputs": 4, "targets": 3})


def test_pre_packed_converters():
    names = (
        "inputs",
        "targets",
        "inputs_segment_ids",
        "inputs_positions",
        "targets_segment_ids",
        "targets_positions",
    )
    row = {"inputs": [7, 8, 4], "targets": [3, 9, 5], "inputs_segment_ids": [1, 1, 2], "inputs_positions": [0, 1, 0],
           "targets_segment_ids": [1, 1, 2], "targets_positions": [0, 1, 0]}  # fmt: skip
    ds = tu.create_default_dataset([row], feature_names=names)
    lengths = {"inputs": 4, "targets": 4, "inputs_segment_ids": 4, "inputs_positions": 4,
               "targets_segment_ids": 4, "targets_positions": 4}  # fmt: skip
    ex = next(fc.PrePackedEncDecFeatureConverter(pack=False)(ds, lengths).as_numpy_iterator())
    np.testing.assert_array_equal(ex["decoder_input_tokens"], [0, 3, 0, 0])  # restarts at each segment
    np.testing.assert_array_equal(ex["encoder_segment_ids"], [1, 1, 2, 0])
    with pytest.raises(ValueError, match="pack=True"):
        fc.PrePackedEncDecFeatureConverter(pack=True)
    lm_names = fc.PrePackedLMFeatureConverter.BATCH_FEATURES
    lm = tu.create_default_dataset(
        [{k: [1, 2, 3] for k in (*lm_names, "extra")}], feature_names=(*lm_names, "extra")
    )
    out = fc.PrePackedLMFeatureConverter()(lm, {"targets": 3})
    assert set(out.element_spec) == set(lm_names) and out.element_spec["decoder_target_tokens"].shape == (3,)
    with pytest.raises(ValueError, match="decoder_causal_attention"):
        fc.PrePackedPrefixLMFeatureConverter()(lm, {"inputs": 1, "targets": 2})


def test_assert_dataset_and_create_default_dataset():
    ds = tu.create_default_dataset([{"inputs": [1, 2], "targets": [3]}])
    tu.assert_dataset(ds, [{"inputs": [1, 2], "targets": [3]}], expected_dtypes={"inputs": tf.int32})
    with pytest.raises(AssertionError):
        tu.assert_dataset(ds, [{"inputs": [1, 9], "targets": [3]}])
    with pytest.raises(AssertionError, match="examples"):
        tu.assert_dataset(ds, [])
    tu.assert_datasets_eq(ds, ds)
    tu.assert_datasets_neq(ds, tu.create_default_dataset([{"inputs": [2], "targets": [3]}]))
    text = tf.data.Dataset.from_tensors({"prefix": "this", "suffix": "is"})
    tu.assert_dataset(tu.test_text_preprocessor(text), {"inputs": "complete: this", "targets": "is"})


def _accuracy(targets, predictions):
    return {"accuracy": 100.0 * np.mean([t == p for t, p in zip(targets, predictions)])}


def test_data_injector_and_task_testing_helpers(clean_registry):
    vocab = seqio.ByteVocabulary()
    seqio.TaskRegistry.add(
        "injected",
        source=core.InMemoryDataSource({"validation": [{"inputs": "q", "targets": "zz"}]}),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features={"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)},
        metric_fns=[_accuracy],
    )
    raw = {"validation": {"inputs": "hi", "targets": "ok"}}
    out = tu.test_preprocessing_single("injected", raw)
    np.testing.assert_array_equal(out["targets"], [114, 110, 1])
    task = seqio.get_mixture_or_task("injected")
    assert isinstance(task.source, core.InMemoryDataSource)  # restored after the block
    metrics_out = tu.test_postprocessing("injected", raw, predict_output=["ok"])
    assert metrics_out == {"accuracy": 100.0}
    assert tu.test_postprocessing("injected", raw, predict_output=["no"]) == {"accuracy": 0.0}
    assert tu.encode_str("injected", "ok") == [114, 110]


class _Fake(tu.FakeTaskTest):
    __test__ = False  # driven by the test below

    def runTest(self):
        self.add_task(
            "fake_added", seqio.FunctionDataSource(lambda split, shuffle_files: None, splits=["train"])
        )


def test_fake_task_test_registers_only_its_tasks_and_restores(clean_registry):
    seqio.TaskRegistry.add("kept", source=core.InMemoryDataSource({"train": [{"inputs": "a", "targets": "b"}]}),
                           output_features={"inputs": seqio.Feature(seqio.ByteVocabulary())})  # fmt: skip
    case = _Fake()
    case.setUp()
    assert "kept" not in seqio.TaskRegistry.names() and "function_task" in seqio.TaskRegistry.names()
    case.runTest()
    assert "fake_added" in seqio.TaskRegistry.names()
    case.doCleanups()
    assert "kept" in seqio.TaskRegistry.names()
    assert not {"fake_added", "function_task"} & set(seqio.TaskRegistry.names())


def test_mock_vocabulary():
    vocab = tu.MockVocabulary({"hi": [5, 6]}, vocab_size=10)
    assert vocab.encode("hi") == [5, 6] and vocab.eos_id == 1 and vocab.vocab_size == 10
    np.testing.assert_array_equal(vocab.encode_tf(tf.constant("hi")), [5, 6])


def test_metric_values_and_helpers():
    assert metrics.Scalar(1.5).value == 1.5 and metrics.Text("x").textdata == "x"
    assert metrics.ModelOutputType.to_str(metrics.ModelOutputType.SCORE) == "score"
    indices, outputs = metrics.remove_padding_examples(
        np.array([10, 11, 12]), np.array([[0, 1], [0, 0], [0, 2]]), np.array([1, 1, 0])
    )
    np.testing.assert_array_equal(outputs, [10, 11])
    np.testing.assert_array_equal(metrics.globally_sort_model_output(outputs, indices), [11, 10])


def test_evaluator_calls_seqio_style_functions_once_with_indexed_examples(clean_registry):
    vocab = seqio.ByteVocabulary()

    def score_metric(targets, scores):
        return {"total": float(sum(scores))}

    seqio.TaskRegistry.add(
        "eval_style",
        source=core.InMemoryDataSource(
            {"validation": [{"inputs": "a", "targets": "b"}, {"inputs": "c", "targets": "d"}]}
        ),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features={"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)},
        metric_fns=[_accuracy, score_metric],
    )
    calls = []

    def predict_fn(ds, model_feature_lengths=None):
        calls.append(len(list(ds)))
        # Echo each target, returned in reverse order: the Evaluator sorts by index.
        return [(int(i), ex["decoder_target_tokens"]) for i, ex in reversed(list(ds.as_numpy_iterator()))]

    def score_fn(ds):
        return [(int(i), 0.5) for i, _ in ds.as_numpy_iterator()]

    evaluator = seqio.Evaluator("eval_style", feature_converter=seqio.EncDecFeatureConverter(pack=False))
    future, outputs = evaluator.evaluate(compute_metrics=True, predict_fn=predict_fn, score_fn=score_fn)
    assert calls == [2]
    assert future.result()["eval_style"] == {"accuracy": 100.0, "total": 1.0}
    by_type = outputs["eval_style"]
    assert [list(t) for t in by_type[metrics.ModelOutputType.PREDICTION]] == [[101, 1], [103, 1]]
    assert by_type[metrics.ModelOutputType.SCORE] == [0.5, 0.5]
    # Without metrics the future still comes back (holding None), as seqio's does.
    future, _ = evaluator.evaluate(compute_metrics=False, predict_fn=predict_fn, score_fn=score_fn)
    assert future.result() is None
    with pytest.raises(ValueError, match="index, output"):
        evaluator.evaluate(compute_metrics=False, predict_fn=lambda ds: [b"x"], score_fn=score_fn)


class TargetsOnlyConverter(seqio.FeatureConverter):
    """A custom converter written against seqio's hooks (class-level dicts, as seqio users write them)."""

    TASK_FEATURES = {"targets": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32)}  # noqa: RUF012
    MODEL_FEATURES = {"decoder_target_tokens": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32)}  # noqa: RUF012
    PACKING_FEATURE_DTYPES = {"decoder_segment_ids": tf.int32, "decoder_positions": tf.int32}  # noqa: RUF012

    def _convert_features(self, ds, task_feature_lengths):
        ds = self._pack_or_pad(ds, task_feature_lengths)

        def convert(ex):
            out = {"decoder_target_tokens": ex["targets"]}
            if self.pack:
                out["decoder_segment_ids"] = ex["targets_segment_ids"]
                out["decoder_positions"] = ex["targets_positions"]
            return out

        return ds.map(convert)

    def get_model_feature_lengths(self, task_feature_lengths):
        n = task_feature_lengths["targets"]
        out = {"decoder_target_tokens": n}
        if self.pack:
            out.update(decoder_segment_ids=n, decoder_positions=n)
        return out


def test_seqio_style_custom_converter():
    ds = tu.create_default_dataset([{"targets": [3, 9, 1]}, {"targets": [4, 1]}], feature_names=("targets",))
    packed = next(TargetsOnlyConverter(pack=True)(ds, {"targets": 6}).as_numpy_iterator())
    np.testing.assert_array_equal(packed["decoder_target_tokens"], [3, 9, 1, 4, 1, 0])
    np.testing.assert_array_equal(packed["decoder_segment_ids"], [1, 1, 1, 2, 2, 0])
    padded = list(TargetsOnlyConverter(pack=False)(ds, {"targets": 4}).as_numpy_iterator())
    np.testing.assert_array_equal(padded[1]["decoder_target_tokens"], [4, 1, 0, 0])
    with pytest.raises(ValueError, match="extra features"):
        TargetsOnlyConverter(pack=False)(ds, {"targets": 4, "inputs": 2})
    with pytest.raises(tf.errors.InvalidArgumentError, match="less than or equal"):
        list(TargetsOnlyConverter(pack=False)(ds, {"targets": 2}))
    assert isinstance(seqio.EncDecFeatureConverter(), seqio.FeatureConverter)
    assert isinstance(seqio.PassThroughFeatureConverter(), seqio.FeatureConverter)


def test_mark_completed_writes_seqios_marker(tmp_path):
    task_dir = tu.mark_completed(str(tmp_path), "a:b")
    assert (tmp_path / "a" / "b" / "COMPLETED").exists() and task_dir == str(tmp_path / "a" / "b")
