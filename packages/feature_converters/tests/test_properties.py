"""Property tests over random example sets (hypothesis).

Each converter pipeline is built once over a generator that reads the examples
of the current hypothesis case, so cases do not re-trace TensorFlow functions.
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import t5x.feature_converters as fc

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LM_LEN, IN_LEN, TG_LEN = 12, 9, 6


class _Source:
    """A dataset whose contents are swapped between hypothesis cases."""

    def __init__(self, names):
        self.examples = []
        self.names = names
        self.ds = tf.data.Dataset.from_generator(
            lambda: ({k: np.asarray(ex[k], np.int32) for k in names} for ex in self.examples),
            output_signature={k: tf.TensorSpec([None], tf.int32) for k in names},
        )


@functools.cache
def _pipeline(kind, pack, strategy, bos_id):
    if kind == "lm":
        src, lengths = _Source(["targets"]), {"targets": LM_LEN}
        conv = fc.LMFeatureConverter(pack=pack, packing_strategy=strategy, bos_id=bos_id, packing_window=7)
    elif kind == "encdec":
        src, lengths = _Source(["inputs", "targets"]), {"inputs": IN_LEN, "targets": TG_LEN}
        conv = fc.EncDecFeatureConverter(pack=pack, packing_strategy=strategy, bos_id=bos_id)
    else:
        src, lengths = _Source(["inputs", "targets"]), {"inputs": IN_LEN, "targets": TG_LEN}
        conv = fc.PrefixLMFeatureConverter(pack=pack, packing_strategy=strategy, bos_id=bos_id)
    return src, conv(src.ds, lengths)


def _run(kind, examples, pack=True, strategy="greedy", bos_id=0):
    src, ds = _pipeline(kind, pack, strategy, bos_id)
    src.examples = examples
    return [{k: v.tolist() for k, v in row.items()} for row in ds.as_numpy_iterator()]


def _tokens(max_len, min_len=1):
    return st.lists(st.integers(1, 50), min_size=min_len, max_size=max_len)


def _segments(row, tokens_name):
    """Splits a packed row into its segments: list of (tokens, positions, indices)."""
    side = tokens_name.split("_")[0]
    tokens, seg, pos = row[tokens_name], row[side + "_segment_ids"], row[side + "_positions"]
    out = []
    for s in range(1, max(seg) + 1):
        idx = [i for i, v in enumerate(seg) if v == s]
        out.append(([tokens[i] for i in idx], [pos[i] for i in idx], idx))
    return out


def _check_row_structure(row, tokens_name, seg_name, pos_name):
    tokens, seg, pos = row[tokens_name], row[seg_name], row[pos_name]
    # Padding exactly where segment id is 0 (all real tokens are >= 1), and it is a suffix.
    assert [t == 0 for t in tokens] == [s == 0 for s in seg]
    n = sum(1 for s in seg if s)
    assert all(s == 0 for s in seg[n:])
    # Segment ids count up by one from 1; positions restart at 0 per segment.
    for i in range(n):
        if i == 0 or seg[i] != seg[i - 1]:
            assert seg[i] == (1 if i == 0 else seg[i - 1] + 1)
            assert pos[i] == 0
        else:
            assert pos[i] == pos[i - 1] + 1
    assert all(p == 0 for p in pos[n:])


def _check_decoder(row, bos_id):
    targets, seg, inputs = (
        row["decoder_target_tokens"],
        row["decoder_segment_ids"],
        row["decoder_input_tokens"],
    )
    for i in range(len(targets)):
        first = i == 0 or seg[i] != seg[i - 1]
        assert inputs[i] == (bos_id if first else targets[i - 1])
    assert row["decoder_loss_weights"] == [int(t != 0) for t in targets]


@SETTINGS
@given(
    st.lists(st.fixed_dictionaries({"targets": _tokens(LM_LEN)}), min_size=1, max_size=25),
    st.sampled_from([0, 3]),
)
def test_lm_packed_greedy_keeps_every_token_in_order(examples, bos_id):
    rows = _run("lm", examples, bos_id=bos_id)
    for row in rows:
        _check_row_structure(row, "decoder_target_tokens", "decoder_segment_ids", "decoder_positions")
        _check_decoder(row, bos_id)
    segments = [s[0] for row in rows for s in _segments(row, "decoder_target_tokens")]
    assert segments == [ex["targets"] for ex in examples]


@SETTINGS
@given(st.lists(st.fixed_dictionaries({"targets": _tokens(LM_LEN)}), min_size=1, max_size=25))
def test_lm_first_fit_keeps_every_example(examples):
    rows = _run("lm", examples, strategy="first_fit")
    greedy_rows = _run("lm", examples)
    for row in rows:
        _check_row_structure(row, "decoder_target_tokens", "decoder_segment_ids", "decoder_positions")
        _check_decoder(row, 0)
    segments = [s[0] for row in rows for s in _segments(row, "decoder_target_tokens")]
    assert sorted(segments) == sorted(ex["targets"] for ex in examples)
    assert len(rows) <= len(greedy_rows)


@SETTINGS
@given(
    st.lists(
        st.fixed_dictionaries({"inputs": _tokens(IN_LEN), "targets": _tokens(TG_LEN)}),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from(["greedy", "first_fit"]),
)
def test_encdec_packed_pairs_stay_aligned(examples, strategy):
    rows = _run("encdec", examples, strategy=strategy)
    pairs = []
    for row in rows:
        _check_row_structure(row, "encoder_input_tokens", "encoder_segment_ids", "encoder_positions")
        _check_row_structure(row, "decoder_target_tokens", "decoder_segment_ids", "decoder_positions")
        _check_decoder(row, 0)
        enc, dec = _segments(row, "encoder_input_tokens"), _segments(row, "decoder_target_tokens")
        assert len(enc) == len(dec)
        pairs += [(e[0], d[0]) for e, d in zip(enc, dec)]
    want = [(ex["inputs"], ex["targets"]) for ex in examples]
    assert (pairs if strategy == "greedy" else sorted(pairs)) == (
        want if strategy == "greedy" else sorted(want)
    )


@SETTINGS
@given(
    st.lists(
        st.fixed_dictionaries({"inputs": _tokens(IN_LEN, 0), "targets": _tokens(TG_LEN)}),
        min_size=1,
        max_size=20,
    )
)
def test_prefix_lm_packed_masks(examples):
    rows = _run("prefix", examples)
    got = []
    for row in rows:
        _check_row_structure(row, "decoder_target_tokens", "decoder_segment_ids", "decoder_positions")
        targets, seg = row["decoder_target_tokens"], row["decoder_segment_ids"]
        assert row["decoder_input_tokens"] == [
            0 if i == 0 or seg[i] != seg[i - 1] else targets[i - 1] for i in range(len(targets))
        ]
        for tokens, positions, idx in _segments(row, "decoder_target_tokens"):
            got.append(
                (
                    tokens,
                    positions,
                    [row["decoder_loss_weights"][i] for i in idx],
                    [row["decoder_causal_attention"][i] for i in idx],
                )
            )
        pad = [i for i, s in enumerate(seg) if s == 0]
        assert all(
            row["decoder_loss_weights"][i] == 0 and row["decoder_causal_attention"][i] == 0 for i in pad
        )
    assert len(got) == len(examples)
    for (tokens, _, loss, causal), ex in zip(got, examples):
        n_in = len(ex["inputs"])
        assert tokens == ex["inputs"] + ex["targets"]
        assert loss == [int(p >= n_in) for p in range(len(tokens))]
        assert causal == [int(p <= n_in) for p in range(len(tokens))]


@SETTINGS
@given(
    st.lists(
        st.fixed_dictionaries({"inputs": _tokens(IN_LEN, 0), "targets": _tokens(TG_LEN, 0)}),
        min_size=1,
        max_size=10,
    ),
    st.sampled_from([0, 4]),
)
def test_encdec_unpacked_rows_are_padded_examples(examples, bos_id):
    rows = _run("encdec", examples, pack=False, bos_id=bos_id)
    assert len(rows) == len(examples)
    for row, ex in zip(rows, examples):
        t = ex["targets"] + [0] * (TG_LEN - len(ex["targets"]))
        assert row["encoder_input_tokens"] == ex["inputs"] + [0] * (IN_LEN - len(ex["inputs"]))
        assert row["decoder_target_tokens"] == t
        assert row["decoder_input_tokens"] == [bos_id, *t[:-1]]
        assert row["decoder_loss_weights"] == [int(v != 0) for v in t]
