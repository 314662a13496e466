"""Packing layout (windows, strategies), seqio's utilities and packing efficiency."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import t5x.feature_converters as fc

WINDOW_EXAMPLES = [
    {"targets": [1, 1]},
    {"targets": [2, 2, 2]},
    {"targets": [3]},
    {"targets": [4]},
    {"targets": [5, 5]},
]


def _rows(convert, conv, examples, lengths, feature="decoder_target_tokens"):
    return [r[feature] for r in convert(conv, examples, lengths)]


def test_greedy_rows_do_not_span_windows(convert):
    # Default window = the row length (4): examples 0-3, then example 4.
    assert _rows(convert, fc.LMFeatureConverter(), WINDOW_EXAMPLES, {"targets": 4}) == [
        [1, 1, 0, 0],
        [2, 2, 2, 3],
        [4, 0, 0, 0],
        [5, 5, 0, 0],
    ]
    assert _rows(convert, fc.LMFeatureConverter(packing_window=8), WINDOW_EXAMPLES, {"targets": 4}) == [
        [1, 1, 0, 0],
        [2, 2, 2, 3],
        [4, 5, 5, 0],
    ]


def test_first_fit_fills_earlier_rows(convert):
    conv = fc.LMFeatureConverter(packing_strategy="first_fit", packing_window=8)
    got = convert(conv, WINDOW_EXAMPLES, {"targets": 4})
    assert [r["decoder_target_tokens"] for r in got] == [[1, 1, 3, 4], [2, 2, 2, 0], [5, 5, 0, 0]]
    assert got[0]["decoder_segment_ids"] == [1, 1, 2, 3]
    assert got[0]["decoder_positions"] == [0, 1, 0, 0]
    assert got[0]["decoder_input_tokens"] == [0, 1, 0, 0]
    # use_custom_packing_ops selects the denser strategy, as in seqio.
    assert fc.LMFeatureConverter(use_custom_packing_ops=True).packing_strategy == "first_fit"


def test_packing_efficiency(convert):
    greedy = fc.LMFeatureConverter(packing_window=8)
    first_fit = fc.LMFeatureConverter(packing_window=8, packing_strategy="first_fit")
    lengths = {"targets": 4}
    ds = lambda: tf.data.Dataset.from_generator(  # noqa: E731
        lambda: (np.asarray(ex["targets"], np.int32) for ex in WINDOW_EXAMPLES),
        output_signature=tf.TensorSpec([None], tf.int32),
    ).map(lambda t: {"targets": t})
    assert fc.packing_efficiency(greedy(ds(), lengths)) == {"decoder_target_tokens": 9 / 12}
    assert fc.packing_efficiency(first_fit(ds(), lengths).batch(2)) == {"decoder_target_tokens": 9 / 12}
    unpacked = fc.LMFeatureConverter(pack=False)(ds(), lengths)
    assert fc.packing_efficiency(unpacked, ["decoder_target_tokens"]) == {"decoder_target_tokens": 9 / 20}
    encdec = [
        {
            "encoder_input_tokens": np.array([1, 0]),
            "decoder_target_tokens": np.array([1, 1, 1, 0]),
            "decoder_input_tokens": np.array([0, 1, 1, 1]),
        }
    ]
    assert fc.packing_efficiency(encdec) == {"encoder_input_tokens": 0.5, "decoder_target_tokens": 0.75}


def test_first_fit_is_denser_on_mixed_lengths(convert):
    rng = np.random.default_rng(1)
    examples = [{"targets": list(range(1, int(n) + 1))} for n in rng.choice([3, 9, 14], size=60)]
    greedy = convert(fc.LMFeatureConverter(), examples, {"targets": 16})
    first_fit = convert(fc.LMFeatureConverter(packing_strategy="first_fit"), examples, {"targets": 16})
    total = sum(len(ex["targets"]) for ex in examples)
    assert sum(np.count_nonzero(r["decoder_target_tokens"]) for r in first_fit) == total
    assert len(first_fit) < len(greedy)


def test_trim_and_pack_dataset_matches_seqio_docstring_layout():
    ds = tf.data.Dataset.from_tensor_slices(
        {"inputs": [[8, 7, 1, 0], [2, 3, 4, 1]], "targets": [[4, 1, 0], [5, 6, 1]], "idx": [0, 1]}
    )
    out = list(fc.trim_and_pack_dataset(ds, {"inputs": 10, "targets": 10}).as_numpy_iterator())
    assert len(out) == 1
    want = {
        "inputs": [8, 7, 1, 2, 3, 4, 1, 0, 0, 0],
        "inputs_segment_ids": [1, 1, 1, 2, 2, 2, 2, 0, 0, 0],
        "inputs_positions": [0, 1, 2, 0, 1, 2, 3, 0, 0, 0],
        "targets": [4, 1, 5, 6, 1, 0, 0, 0, 0, 0],
        "targets_segment_ids": [1, 1, 2, 2, 2, 0, 0, 0, 0, 0],
        "targets_positions": [0, 1, 0, 1, 2, 0, 0, 0, 0, 0],
    }
    assert {k: v.tolist() for k, v in out[0].items()} == want


def test_trim_and_pad_dataset():
    ds = tf.data.Dataset.from_tensors(
        {"targets": tf.constant([1, 2, 3]), "inputs": tf.constant([4]), "id": 7}
    )
    out = next(fc.trim_and_pad_dataset(ds, {"targets": 2, "inputs": 3}).as_numpy_iterator())
    assert out["targets"].tolist() == [1, 2]
    assert out["inputs"].tolist() == [4, 0, 0]
    assert out["id"] == 7


def test_make_autoregressive_inputs():
    targets = tf.constant([3, 8, 1, 9, 1, 5, 4, 1, 0, 0])
    seq = tf.constant([1, 1, 1, 2, 2, 3, 3, 3, 0, 0])
    assert fc.make_autoregressive_inputs(targets, sequence_id=seq).numpy().tolist() == [
        0,
        3,
        8,
        0,
        9,
        0,
        5,
        4,
        0,
        0,
    ]
    assert fc.make_autoregressive_inputs(targets, bos_id=7).numpy().tolist() == [7, 3, 8, 1, 9, 1, 5, 4, 1, 0]
    batched = fc.autoregressive_inputs(
        tf.stack([targets, targets]), sequence_id=tf.stack([seq, seq]), bos_id=2
    )
    assert batched.numpy().tolist() == [[2, 3, 8, 2, 9, 2, 5, 4, 2, 0]] * 2
    assert fc.non_padding_position(targets).numpy().tolist() == [1] * 8 + [0, 0]
