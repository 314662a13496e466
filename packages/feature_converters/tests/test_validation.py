"""Errors for bad input: missing features, dtypes, ranks, lengths; trimming when unchecked."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import t5x.feature_converters as fc


def test_missing_feature_names_converter_and_feature(dataset):
    with pytest.raises(ValueError, match=r"EncDecFeatureConverter: the dataset has no feature 'targets'"):
        fc.EncDecFeatureConverter()(dataset([{"inputs": [1]}]), {"inputs": 4, "targets": 4})


def test_wrong_dtype():
    ds = tf.data.Dataset.from_tensors({"targets": tf.constant([1, 2], tf.int64)})
    with pytest.raises(
        ValueError, match=r"LMFeatureConverter: feature 'targets' has dtype int64, expected int32"
    ):
        fc.LMFeatureConverter()(ds, {"targets": 4})


def test_wrong_rank():
    ds = tf.data.Dataset.from_tensors({"inputs": tf.constant([[1, 2]]), "targets": tf.constant([1])})
    with pytest.raises(
        ValueError, match=r"PrefixLMFeatureConverter: feature 'inputs' has rank 2, expected 1"
    ):
        fc.PrefixLMFeatureConverter()(ds, {"inputs": 4, "targets": 4})


def test_task_feature_lengths_must_match(dataset):
    ds = dataset([{"inputs": [1], "targets": [1]}])
    with pytest.raises(
        ValueError, match=r"LMFeatureConverter: task_feature_lengths has features \['inputs'\]"
    ):
        fc.LMFeatureConverter()(ds, {"inputs": 3, "targets": 3})
    with pytest.raises(
        ValueError, match=r"EncDecFeatureConverter: task_feature_lengths is missing features \['inputs'\]"
    ):
        fc.EncDecFeatureConverter()(ds, {"targets": 3})
    with pytest.raises(ValueError, match=r"task feature length of 'targets' must be a positive int, got 0"):
        fc.LMFeatureConverter()(ds, {"targets": 0})


def test_encoder_needs_equal_lengths(dataset):
    with pytest.raises(ValueError, match=r"EncoderFeatureConverter: .* inputs=4, targets=5"):
        fc.EncoderFeatureConverter(mask_id=1)(
            dataset([{"inputs": [1], "targets": [1]}]), {"inputs": 4, "targets": 5}
        )


def test_unknown_packing_strategy():
    with pytest.raises(ValueError, match=r"packing_strategy must be one of .* got 'best'"):
        fc.LMFeatureConverter(packing_strategy="best")


@pytest.mark.parametrize(
    "conv, examples, lengths, feature",
    [
        (
            fc.LMFeatureConverter(),
            [{"targets": [1, 2]}, {"targets": [1, 2, 3, 4, 5, 6]}],
            {"targets": 5},
            "targets",
        ),
        (fc.LMFeatureConverter(pack=False), [{"targets": [1, 2, 3, 4, 5, 6]}], {"targets": 5}, "targets"),
        (
            fc.EncDecFeatureConverter(),
            [{"inputs": [1, 2, 3, 4, 5, 6], "targets": [1]}],
            {"inputs": 5, "targets": 5},
            "inputs",
        ),
        (
            fc.PrefixLMFeatureConverter(),
            [{"inputs": [1], "targets": [1, 2, 3, 4, 5, 6]}],
            {"inputs": 5, "targets": 5},
            "targets",
        ),
    ],
)
def test_too_long_raises_with_converter_feature_length_and_limit(convert, conv, examples, lengths, feature):
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        convert(conv, examples, lengths)
    message = str(err.value)
    assert type(conv).__name__ in message
    # seqio's wording (TF escapes the quotes), then the actual length.
    assert (
        f"Feature \\'{feature}\\' has length not less than or equal to the expected length of 5 "
        "during input_validation" in message
    )
    assert "got length] [6]" in message
    assert "apply_length_check=False" in message


def test_length_check_off_trims(convert):
    examples = [{"targets": [1, 2, 3, 4, 5]}]
    unpacked = convert(fc.LMFeatureConverter(pack=False, apply_length_check=False), examples, {"targets": 3})
    assert unpacked[0]["decoder_target_tokens"] == [1, 2, 3]
    packed = convert(
        fc.LMFeatureConverter(apply_length_check=False), [*examples, {"targets": [7]}], {"targets": 3}
    )
    assert [r["decoder_target_tokens"] for r in packed] == [[1, 2, 3], [7, 0, 0]]


def test_prefix_lm_length_check_off_trims_the_concatenation(convert):
    # seqio concatenates the untrimmed features and trims the result, so the
    # whole row is prefix here.
    conv = fc.PrefixLMFeatureConverter(pack=False, apply_length_check=False)
    got = convert(conv, [{"inputs": [1, 2, 3, 4], "targets": [5, 6]}], {"inputs": 2, "targets": 2})
    assert got == [
        {
            "decoder_target_tokens": [1, 2, 3, 4],
            "decoder_input_tokens": [0, 1, 2, 3],
            "decoder_loss_weights": [0, 0, 0, 0],
            "decoder_causal_attention": [1, 1, 1, 1],
        }
    ]


def test_extra_features_are_dropped_and_strings_allowed():
    ds = tf.data.Dataset.from_tensor_slices(
        {"targets": tf.ragged.constant([[3, 1], [4, 4, 1]]).to_tensor(), "text": ["ab", "c"]}
    ).map(lambda ex: {"targets": tf.boolean_mask(ex["targets"], ex["targets"] > 0), "text": ex["text"]})
    out = list(fc.LMFeatureConverter()(ds, {"targets": 6}).as_numpy_iterator())
    assert len(out) == 1
    np.testing.assert_array_equal(out[0]["decoder_target_tokens"], [3, 1, 4, 4, 1, 0])
    assert "text" not in out[0]
