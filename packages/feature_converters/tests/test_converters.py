"""Hand-computed outputs for every converter, packed and unpacked, plus the contract check."""

from __future__ import annotations

import pytest

import t5x.feature_converters as fc
from t5x.interfaces import FeatureConverter as FeatureConverterProtocol
from t5x.interfaces.testing import check_feature_converter

PAIR_EXAMPLES = [
    {"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]},
    {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]},
]


def test_encdec_packed(convert):
    got = convert(fc.EncDecFeatureConverter(pack=True), PAIR_EXAMPLES, {"inputs": 10, "targets": 7})
    assert got == [
        {
            "encoder_input_tokens": [7, 8, 5, 1, 8, 4, 9, 3, 1, 0],
            "encoder_segment_ids": [1, 1, 1, 1, 2, 2, 2, 2, 2, 0],
            "encoder_positions": [0, 1, 2, 3, 0, 1, 2, 3, 4, 0],
            "decoder_target_tokens": [3, 9, 1, 4, 1, 0, 0],
            "decoder_input_tokens": [0, 3, 9, 0, 4, 0, 0],
            "decoder_loss_weights": [1, 1, 1, 1, 1, 0, 0],
            "decoder_segment_ids": [1, 1, 1, 2, 2, 0, 0],
            "decoder_positions": [0, 1, 2, 0, 1, 0, 0],
        }
    ]


def test_encdec_packed_overflow_and_bos(convert):
    examples = [*PAIR_EXAMPLES, {"inputs": [2, 2, 1], "targets": [6, 6, 6, 1]}]
    got = convert(fc.EncDecFeatureConverter(bos_id=5), examples, {"inputs": 10, "targets": 7})
    assert len(got) == 2
    # bos at each segment start and (seqio's rule) at the first padding position.
    assert got[0]["decoder_input_tokens"] == [5, 3, 9, 5, 4, 5, 0]
    assert got[1]["encoder_input_tokens"] == [2, 2, 1, 0, 0, 0, 0, 0, 0, 0]
    assert got[1]["encoder_segment_ids"] == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert got[1]["decoder_target_tokens"] == [6, 6, 6, 1, 0, 0, 0]
    assert got[1]["decoder_input_tokens"] == [5, 6, 6, 6, 5, 0, 0]
    assert got[1]["decoder_positions"] == [0, 1, 2, 3, 0, 0, 0]


def test_encdec_unpacked(convert):
    got = convert(fc.EncDecFeatureConverter(pack=False), PAIR_EXAMPLES, {"inputs": 6, "targets": 4})
    assert got == [
        {
            "encoder_input_tokens": [7, 8, 5, 1, 0, 0],
            "decoder_target_tokens": [3, 9, 1, 0],
            "decoder_input_tokens": [0, 3, 9, 1],
            "decoder_loss_weights": [1, 1, 1, 0],
        },
        {
            "encoder_input_tokens": [8, 4, 9, 3, 1, 0],
            "decoder_target_tokens": [4, 1, 0, 0],
            "decoder_input_tokens": [0, 4, 1, 0],
            "decoder_loss_weights": [1, 1, 0, 0],
        },
    ]


def test_lm_packed_and_unpacked(convert):
    examples = [{"targets": [3, 9, 1]}, {"targets": [4, 1]}]
    assert convert(fc.LMFeatureConverter(), examples, {"targets": 6}) == [
        {
            "decoder_target_tokens": [3, 9, 1, 4, 1, 0],
            "decoder_input_tokens": [0, 3, 9, 0, 4, 0],
            "decoder_loss_weights": [1, 1, 1, 1, 1, 0],
            "decoder_positions": [0, 1, 2, 0, 1, 0],
            "decoder_segment_ids": [1, 1, 1, 2, 2, 0],
        }
    ]
    assert convert(fc.LMFeatureConverter(pack=False), examples, {"targets": 5}) == [
        {
            "decoder_target_tokens": [3, 9, 1, 0, 0],
            "decoder_input_tokens": [0, 3, 9, 1, 0],
            "decoder_loss_weights": [1, 1, 1, 0, 0],
        },
        {
            "decoder_target_tokens": [4, 1, 0, 0, 0],
            "decoder_input_tokens": [0, 4, 1, 0, 0],
            "decoder_loss_weights": [1, 1, 0, 0, 0],
        },
    ]


def test_prefix_lm_packed(convert):
    got = convert(fc.PrefixLMFeatureConverter(), PAIR_EXAMPLES, {"inputs": 7, "targets": 8})
    assert got == [
        {
            "decoder_target_tokens": [7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1, 0],
            "decoder_input_tokens": [0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4, 0],
            "decoder_loss_weights": [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0],
            "decoder_positions": [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0],
            "decoder_segment_ids": [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0],
            # The prefix covers the inputs plus one position (reads the last input).
            "decoder_causal_attention": [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0],
        }
    ]


def test_prefix_lm_unpacked(convert):
    examples = [{"inputs": [9, 4, 6, 1], "targets": [3, 9, 1]}]
    got = convert(fc.PrefixLMFeatureConverter(pack=False), examples, {"inputs": 6, "targets": 4})
    assert got == [
        {
            "decoder_target_tokens": [9, 4, 6, 1, 3, 9, 1, 0, 0, 0],
            "decoder_input_tokens": [0, 9, 4, 6, 1, 3, 9, 1, 0, 0],
            "decoder_loss_weights": [0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
            "decoder_causal_attention": [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
        }
    ]
    all_loss = convert(
        fc.PrefixLMFeatureConverter(pack=False, loss_on_targets_only=False),
        examples,
        {"inputs": 6, "targets": 4},
    )
    assert all_loss[0]["decoder_loss_weights"] == [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]


def test_prefix_lm_empty_targets_get_one_zero_target(convert):
    got = convert(
        fc.PrefixLMFeatureConverter(pack=False),
        [{"inputs": [5, 1], "targets": []}],
        {"inputs": 3, "targets": 2},
    )
    assert got == [
        {
            "decoder_target_tokens": [5, 1, 0, 0, 0],
            "decoder_input_tokens": [0, 5, 1, 0, 0],
            "decoder_loss_weights": [0, 0, 0, 0, 0],
            "decoder_causal_attention": [1, 1, 1, 0, 0],
        }
    ]


def test_decoder_converter_chooses_by_features(convert):
    conv = fc.DecoderFeatureConverter(pack=False)
    lm = convert(conv, [{"targets": [3, 1]}], {"targets": 3})
    assert lm == [
        {
            "decoder_target_tokens": [3, 1, 0],
            "decoder_input_tokens": [0, 3, 1],
            "decoder_loss_weights": [1, 1, 0],
        }
    ]
    prefix = convert(conv, [{"inputs": [4], "targets": [3, 1]}], {"inputs": 1, "targets": 2})
    assert prefix == [
        {
            "decoder_target_tokens": [4, 3, 1],
            "decoder_input_tokens": [0, 4, 3],
            "decoder_loss_weights": [0, 1, 1],
            "decoder_causal_attention": [1, 1, 0],
        }
    ]
    assert set(conv.get_model_feature_lengths({"targets": 3})) == {
        "decoder_target_tokens",
        "decoder_input_tokens",
        "decoder_loss_weights",
    }


def test_encoder_packed_and_unpacked(convert):
    examples = [
        {"inputs": [8, 9, 9, 3, 4, 1], "targets": [8, 7, 4, 3, 4, 1]},
        {"inputs": [8, 3, 9, 1], "targets": [8, 3, 6, 1]},
    ]
    lengths = {"inputs": 11, "targets": 11}
    assert convert(fc.EncoderFeatureConverter(mask_id=9), examples, lengths) == [
        {
            "encoder_input_tokens": [8, 9, 9, 3, 4, 1, 8, 3, 9, 1, 0],
            "encoder_target_tokens": [8, 7, 4, 3, 4, 1, 8, 3, 6, 1, 0],
            "encoder_segment_ids": [1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0],
            "encoder_positions": [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 0],
            "encoder_loss_weights": [0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0],
        }
    ]
    unpacked = convert(
        fc.EncoderFeatureConverter(mask_id=9, pack=False), examples, {"inputs": 6, "targets": 6}
    )
    assert unpacked[1] == {
        "encoder_input_tokens": [8, 3, 9, 1, 0, 0],
        "encoder_target_tokens": [8, 3, 6, 1, 0, 0],
        "encoder_loss_weights": [0, 0, 1, 0, 0, 0],
    }


def test_pass_through_returns_the_dataset(dataset):
    conv = fc.PassThroughFeatureConverter(pack=True, bos_id=3)
    ds = dataset([{"targets": [1, 2]}])
    assert conv(ds, {"targets": 2}) is ds
    assert conv.get_model_feature_lengths({"targets": 2}) == {"targets": 2}


def test_model_lengths():
    assert fc.EncDecFeatureConverter(pack=False).get_model_feature_lengths({"inputs": 5, "targets": 3}) == {
        "encoder_input_tokens": 5,
        "decoder_target_tokens": 3,
        "decoder_input_tokens": 3,
        "decoder_loss_weights": 3,
    }
    prefix = fc.PrefixLMFeatureConverter().get_model_feature_lengths({"inputs": 5, "targets": 3})
    assert prefix == dict.fromkeys(
        [
            "decoder_target_tokens",
            "decoder_input_tokens",
            "decoder_loss_weights",
            "decoder_segment_ids",
            "decoder_positions",
            "decoder_causal_attention",
        ],
        8,
    )
    assert set(fc.EncDecFeatureConverter.TASK_FEATURES) == {"inputs", "targets"}
    assert "decoder_causal_attention" in fc.PrefixLMFeatureConverter.MODEL_FEATURES


CONTRACT_CASES = [
    (lambda pack, s: fc.EncDecFeatureConverter(pack=pack, packing_strategy=s), {"inputs": 8, "targets": 5}),
    (lambda pack, s: fc.LMFeatureConverter(pack=pack, packing_strategy=s), {"targets": 8}),
    (lambda pack, s: fc.PrefixLMFeatureConverter(pack=pack, packing_strategy=s), {"inputs": 5, "targets": 4}),
    (lambda pack, s: fc.DecoderFeatureConverter(pack=pack, packing_strategy=s), {"inputs": 5, "targets": 4}),
    (
        lambda pack, s: fc.EncoderFeatureConverter(mask_id=3, pack=pack, packing_strategy=s),
        {"inputs": 7, "targets": 7},
    ),
]


@pytest.mark.parametrize("make, lengths", CONTRACT_CASES)
@pytest.mark.parametrize("pack, strategy", [(False, None), (True, "greedy"), (True, "first_fit")])
def test_contract(make, lengths, pack, strategy):
    conv = make(pack, strategy)
    assert isinstance(conv, FeatureConverterProtocol)
    examples = [{k: list(range(2, 2 + (i % n) + 1)) for k, n in lengths.items()} for i in range(9)]
    out = check_feature_converter(conv, examples, lengths)
    # Every task token reaches exactly one model token feature (decoder inputs are a shifted copy).
    want = sum(len(ex[k]) for ex in examples for k in lengths)
    got = sum(
        sum(1 for v in row[k] if v)
        for row in out
        for k in row
        if k.endswith("_tokens") and k != "decoder_input_tokens"
    )
    assert got == want
    if pack:
        assert len(out) < len(examples)
