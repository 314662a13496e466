"""seqio's private converter/utils helpers kept under their names, and seqio's length-check text."""

from __future__ import annotations

import pytest
import tensorflow as tf

import t5x.seqio as seqio
from t5x.seqio import feature_converters as fc
from t5x.seqio import utils


def _ds(rows):
    return tf.data.Dataset.from_generator(
        lambda: iter(rows), output_signature={k: tf.TensorSpec([None], tf.int32) for k in rows[0]}
    )


def test_check_lengths_strict_and_not_strict():
    ds = _ds([{"inputs": [1, 2, 3], "targets": [4]}])
    axes = {"inputs": 0, "targets": 0}
    list(fc._check_lengths(ds, {"inputs": 3, "targets": 1}, axes, strict=True, error_label="x"))
    list(fc._check_lengths(ds, {"inputs": 5}, axes, strict=False, error_label="x"))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="not equal to the expected length of 4 during x"
    ):
        list(fc._check_lengths(ds, {"inputs": 4}, axes, strict=True, error_label="x"))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="not less than or equal to the expected length of 2"
    ):
        list(fc._check_lengths(ds, {"inputs": 2}, axes, strict=False, error_label="x"))


def test_check_lengths_ragged_strict_needs_equal_rows():
    equal = tf.RaggedTensor.from_row_limits([1, 2, 3, 4], [2, 4])
    unequal = tf.RaggedTensor.from_row_limits([1, 2, 3, 4, 5], [2, 5])
    ok = tf.data.Dataset.from_tensors({"inputs": equal})
    next(iter(fc._check_lengths(ok, {"inputs": 2}, {"inputs": 1}, strict=True, error_label="x")))
    bad = tf.data.Dataset.from_tensors({"inputs": unequal})
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="requires all RaggedTensor dimensions to be equal"
    ):
        next(iter(fc._check_lengths(bad, {"inputs": 3}, {"inputs": 1}, strict=True, error_label="x")))


def test_check_exact_match_names_the_sets():
    with pytest.raises(ValueError, match=r"The b contains extra features not specified in the a: \{'y'\}"):
        fc._check_exact_match(["x"], ["x", "y"], "a", "b")
    with pytest.raises(ValueError, match=r"The b is missing features specified in the a: \{'y'\}"):
        fc._check_exact_match(["x", "y"], ["x"], "a", "b")
    fc._check_exact_match(["x", "y"], ["y", "x"], "a", "b")


@pytest.mark.parametrize("pack", [False, True])
def test_too_long_inputs_raise_seqios_text(pack):
    ds = _ds([{"inputs": [1, 2, 3, 4, 5, 6], "targets": [7]}])
    conv = seqio.EncDecFeatureConverter(pack=pack)
    want = r"Feature \\'inputs\\' has length not less than or equal to the expected length of 5 during input_validation"
    with pytest.raises(tf.errors.InvalidArgumentError, match=want):
        list(conv(ds, {"inputs": 5, "targets": 3}))


def test_prefix_lm_convert_example():
    conv = seqio.PrefixLMFeatureConverter(pack=False)
    got = conv._convert_example(
        {
            "targets": tf.constant([5, 6, 1, 7, 1, 0]),
            "inputs_width": tf.constant([3, 3, 3, 3, 3, 0]),
            "inputs_width_add_pos": tf.constant([4, 4, 4, 4, 4, 0]),
        }
    )
    got = {k: v.numpy().tolist() for k, v in got.items()}
    assert got == {
        "decoder_target_tokens": [5, 6, 1, 7, 1, 0],
        "decoder_input_tokens": [0, 5, 6, 1, 7, 1],
        "decoder_loss_weights": [0, 0, 0, 1, 1, 0],
        "decoder_causal_attention": [1, 1, 1, 1, 0, 0],
    }


def test_shift_right_by_one():
    x = tf.constant([3, 8, 2, 0])
    assert utils._shift_right_by_one(x).numpy().tolist() == [0, 3, 8, 2]
    assert utils._shift_right_by_one(x, bos_id=9).numpy().tolist() == [9, 3, 8, 2]
    rows = utils._shift_right_by_one(tf.constant([[1, 2], [3, 4]]))
    assert rows.numpy().tolist() == [[0, 0], [1, 2]]
    with pytest.raises(ValueError, match="numeric"):
        utils._shift_right_by_one(tf.constant(["a"]))


def test_file_sources_list_through_list_files_for_glob(monkeypatch, tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(f"{name}\n")
    calls = []

    def fake_glob(pattern):
        calls.append(pattern)
        return [str(tmp_path / "b.txt")]

    monkeypatch.setattr(utils, "_list_files_for_glob", fake_glob)
    source = seqio.TextLineDataSource({"train": str(tmp_path / "*.txt")})
    assert [x.decode() for x in source.get_dataset("train", shuffle=False).as_numpy_iterator()] == ["b.txt"]
    assert calls == [str(tmp_path / "*.txt")]
    monkeypatch.setattr(utils, "_list_files_for_glob", lambda pattern: [])
    with pytest.raises(ValueError, match="No file is found for the file pattern"):
        source.get_dataset("train")


def test_cache_placeholder_required_is_seqios_private_flag():
    placeholder = seqio.CacheDatasetPlaceholder(required=True)
    assert placeholder.required and placeholder._required
    placeholder._required = False
    assert not placeholder.required
