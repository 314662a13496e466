"""seqio.utils and seqio.preprocessors against seqio's documented behaviour."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import tensorflow as tf

import t5x.seqio as seqio
from t5x.seqio import preprocessors as prep
from t5x.seqio import test_utils as tu
from t5x.seqio import utils

VOCAB = seqio.ByteVocabulary()


def test_tfexample_round_trip_dense_ragged_sparse():
    sparse = tf.sparse.SparseTensor([[0, 1], [2, 0]], [7, 8], [3, 2])
    values = {
        "ints": [1, 2, 3],
        "floats": np.array([0.5, 1.5], np.float32),
        "text": ["a", "bc"],
        "matrix": [[1, 2], [3, 4], [5, 6]],
        "ragged": tf.ragged.constant([[[1], [2, 3]], [[4, 5, 6]]]),
        "sparse": sparse,
    }
    example = seqio.dict_to_tfexample(values, store_shapes=True)
    keys = set(example.features.feature)
    assert {
        "_rl:0:ragged",
        "_rl:1:ragged",
        "_sp:0:sparse",
        "_sp:1:sparse",
        "_sh:sparse",
        "_sh:matrix",
    } <= keys
    assert utils.tfexample_ragged_length_key("k", 1) == "_rl:1:k"
    assert utils.tfexample_sparse_indices_key("k", 0) == "_sp:0:k"
    back = seqio.tfexample_to_dict(example.SerializeToString())
    np.testing.assert_array_equal(back["ints"], [1, 2, 3])
    assert back["ints"].dtype == tf.int64
    np.testing.assert_allclose(back["floats"], [0.5, 1.5])
    assert back["text"].numpy().tolist() == [b"a", b"bc"]
    np.testing.assert_array_equal(back["matrix"], [[1, 2], [3, 4], [5, 6]])
    assert back["ragged"].to_list() == [[[1], [2, 3]], [[4, 5, 6]]]
    np.testing.assert_array_equal(tf.sparse.to_dense(back["sparse"]), tf.sparse.to_dense(sparse))


def test_tfexample_to_dict_refuses_sparse_without_shape():
    sparse = tf.sparse.SparseTensor([[0]], [1], [2])
    with pytest.raises(ValueError, match="no stored shape"):
        seqio.tfexample_to_dict(seqio.dict_to_tfexample({"s": sparse}))


def test_flatten_and_unflatten_dict():
    nested = {"a": {"b": 1, "c": {"d": 2}}, "e": 3}
    flat = seqio.flatten_dict(nested)
    assert flat == {"a/b": 1, "a/c/d": 2, "e": 3}
    assert seqio.unflatten_dict(flat) == nested
    assert seqio.flatten_dict(nested, delimiter=".") == {"a.b": 1, "a.c.d": 2, "e": 3}


def test_map_seed_manager_advances_two_seeds_per_seeded_call():
    ds = tf.data.Dataset.range(2).map(lambda i: {"x": i})
    seen = []

    def spy(ex, seeds):
        return {"s": tf.stack([tf.stack(pair) for pair in seeds])}

    with seqio.map_seed_manager(100):
        two = seqio.map_over_dataset(spy, num_seeds=2)(ds)
        one = seqio.map_over_dataset(lambda ex, seed: {"s": tf.stack(seed)}, num_seeds=1)(ds)
        assert utils._NEXT_MAP_SEED == 106  # 100..103 for the first call, 104..105 for the second
    expected_first = [int(v) for v in tf.data.Dataset.random(104).take(1)]
    seen = [ex["s"] for ex in one.as_numpy_iterator()]
    assert int(seen[0][0]) == expected_first[0]
    assert next(two.as_numpy_iterator())["s"].shape == (2, 2)
    assert utils._NEXT_MAP_SEED is None


def test_add_kwargs_to_transform_functions_and_dataclasses():
    def fn(ds, sequence_length=None):
        return sequence_length

    bound = seqio.add_kwargs_to_transform(fn, sequence_length={"a": 1}, output_features={})
    assert isinstance(bound, functools.partial) and bound(None) == {"a": 1}
    assert seqio.add_kwargs_to_transform(fn, other=1) is fn

    @dataclasses.dataclass
    class Transform:
        output_features: object = None

    assert (
        seqio.add_kwargs_to_transform(Transform(), output_features="f", sequence_length=3).output_features
        == "f"
    )


def test_trim_and_pad_with_per_dimension_lengths():
    ds = tf.data.Dataset.from_tensors({"m": tf.constant([[1, 2, 3], [4, 5, 6]]), "v": tf.constant([1, 2, 3])})
    out = next(iter(seqio.trim_and_pad_dataset(ds, {"m": [3, 2], "v": 5})))
    np.testing.assert_array_equal(out["m"], [[1, 2], [4, 5], [0, 0]])
    np.testing.assert_array_equal(out["v"], [1, 2, 3, 0, 0])
    assert out["m"].shape == (3, 2)
    trimmed = next(iter(seqio.trim_dataset(ds, {"m": [1, 2]}, {"m": None})))
    np.testing.assert_array_equal(trimmed["m"], [[1, 2]])


def test_list_files(tmp_path):
    for name in ("b.txt", "a.txt", "c.json"):
        (tmp_path / name).write_text("x")
    assert seqio.list_files(str(tmp_path / "*.txt")) == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert (
        len(seqio.list_files([str(tmp_path / "*.txt"), str(tmp_path / "c.*"), str(tmp_path / "a.*")])) == 3
    )  # deduplicated


def test_tokenize_with_eos_on_a_list_of_strings_ends_only_the_last():
    ds = tf.data.Dataset.from_tensors({"targets": tf.constant(["ab", "c"]), "other": tf.constant(1)})
    ex = next(iter(prep.tokenize(ds, {"targets": seqio.Feature(VOCAB)}, with_eos=True)))
    assert ex["targets"].to_list() == [[100, 101], [102, 1]]
    assert ex["targets_pretokenized"].numpy().tolist() == [b"ab", b"c"]
    assert int(ex["other"]) == 1
    plain = next(
        iter(
            prep.tokenize_and_append_eos(
                tf.data.Dataset.from_tensors({"targets": "ab"}), {"targets": seqio.Feature(VOCAB)}
            )
        )
    )
    np.testing.assert_array_equal(plain["targets"], [100, 101, 1])


def test_rekey_append_eos_and_truncation():
    ds = tf.data.Dataset.from_tensors({"q": "x", "a": "y"})
    tu.assert_dataset(
        prep.rekey(ds, {"inputs": "q", "targets": "a", "empty": None}),
        {"inputs": "x", "targets": "y", "empty": ""},
    )
    tokens = tf.data.Dataset.from_tensors({"inputs": [5, 6, 7, 8], "targets": [9, 10, 11]})
    feats = {"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB, add_eos=False)}
    tu.assert_dataset(
        prep.append_eos_after_trim(tokens, feats, {"inputs": 3, "targets": 2}),
        {"inputs": [5, 6, 1], "targets": [9, 10, 11]},
    )
    tu.assert_dataset(prep.append_eos(tokens, feats), {"inputs": [5, 6, 7, 8, 1], "targets": [9, 10, 11]})
    tu.assert_dataset(
        prep.truncate_inputs_left(tokens, {"inputs": 2}), {"inputs": [7, 8], "targets": [9, 10, 11]}
    )
    tu.assert_dataset(
        prep.truncate_inputs_left(tokens, None), {"inputs": [5, 6, 7, 8], "targets": [9, 10, 11]}
    )


def test_preprocess_tensorflow_examples_and_apply_feature_converter():
    ds = tf.data.Dataset.from_tensors({"q": "why", "a": "because", "n": "unused"})
    out = prep.preprocess_tensorflow_examples(ds, "question: {q} {missing}", "{a}!")
    tu.assert_dataset(out, {"inputs": "question: why {missing}", "targets": "because!"})
    tokens = tu.create_default_dataset(
        [{"inputs": [3, 4, 1], "targets": [5, 1]}, {"inputs": [6, 1], "targets": [7, 8, 1]}]
    )
    packed = prep.apply_feature_converter(
        tokens, {"inputs": 6, "targets": 6}, seqio.EncDecFeatureConverter(pack=True)
    )
    ex = next(packed.as_numpy_iterator())
    np.testing.assert_array_equal(ex["encoder_input_tokens"], [3, 4, 1, 6, 1, 0])
    np.testing.assert_array_equal(ex["encoder_segment_ids"], [1, 1, 1, 2, 2, 0])
