import functools

import numpy as np
import pytest
import tensorflow as tf
from tasks_testlib import make_docs, take

import t5x.tasks as tt


def test_random_spans_helper_t5_defaults():
    assert tt.random_spans_helper(512, 0.15, 3.0) == (568, 114)
    assert tt.random_spans_helper(626, 0.15, 3.0)[0] > 626
    _, targets = tt.random_spans_helper(128, 0.5, 3.0)
    assert targets <= 128


def _tokens_ds(vocab, docs):
    ds = tf.data.Dataset.from_tensor_slices({"text": docs})
    ds = tt.rekey(ds, key_map={"inputs": None, "targets": "text"})
    return tt.tokenize(ds, {"targets": tt.Feature(vocab)}, copy_pretokenized=False)


def _run(fn, ds, seed=0):
    from t5x.tasks._utils import preprocessor_seed_scope

    with preprocessor_seed_scope(seed):
        return take(fn(ds))


def _spans(sentinel_ids_and_tokens, top):
    """Splits an id list at sentinels: returns [(sentinel, [tokens...]), ...]."""
    out = []
    for t in sentinel_ids_and_tokens:
        if t > top - 100:
            out.append((t, []))
        else:
            out[-1][1].append(t)
    return out


def test_span_corruption_statistics(vocab):
    features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)}
    lengths = {"inputs": 128, "targets": 32}
    docs = make_docs(200, seed=3)
    fn = functools.partial(tt.span_corruption, sequence_length=lengths, output_features=features)
    examples = _run(fn, _tokens_ds(vocab, docs), seed=1)
    top = vocab.vocab_size - 1
    tokens_length, targets_length = tt.random_spans_helper(128, 0.15, 3.0)
    noise = total = 0
    span_lengths = []
    full = [t for d in docs for t in vocab.encode(d)]
    rebuilt = []
    for ex in examples:
        inputs, targets = ex["inputs"].tolist(), ex["targets"].tolist()
        assert len(inputs) <= 127 and len(targets) <= targets_length - 1
        input_sentinels = [t for t in inputs if t > top - 100]
        target_sentinels = [t for t in targets if t > top - 100]
        # unique sentinels counting down from the top of the vocabulary, same order in both
        assert input_sentinels == list(range(top, top - len(input_sentinels), -1))
        assert target_sentinels == input_sentinels[: len(target_sentinels)]
        # Interleaving the kept and the removed spans restores the original chunk.
        noise_spans = dict(_spans(targets, top))
        chunk = []
        for t in inputs:
            chunk.extend(noise_spans.get(t, [t]))
        rebuilt.extend(chunk)
        n_noise = sum(len(v) for v in noise_spans.values())
        if len(chunk) == tokens_length:
            noise += n_noise
            total += len(chunk)
            span_lengths.extend(len(v) for v in noise_spans.values())
    assert rebuilt == full  # every token exactly once, in order (one concat group)
    assert total > 5000
    assert noise / total == pytest.approx(0.15, abs=0.01)
    assert np.mean(span_lengths) == pytest.approx(3.0, abs=0.15)


def test_span_corruption_t5_lengths(vocab):
    features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)}
    fn = functools.partial(
        tt.span_corruption, sequence_length={"inputs": 512, "targets": 114}, output_features=features
    )
    ds = tt.append_eos_after_trim(fn(_tokens_ds(vocab, make_docs(60, seed=1))), features)
    from t5x.tasks._utils import preprocessor_seed_scope

    with preprocessor_seed_scope(0):
        examples = take(ds)
    full = [ex for ex in examples[:-1]]
    assert {len(ex["inputs"]) for ex in full} == {512}
    assert {len(ex["targets"]) for ex in full} == {114}
    assert all(ex["inputs"][-1] == 1 and ex["targets"][-1] == 1 for ex in examples)


def test_span_corruption_is_seeded(vocab):
    features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)}
    fn = functools.partial(
        tt.span_corruption, sequence_length={"inputs": 64, "targets": 16}, output_features=features
    )
    docs = make_docs(20)
    a, b, c = (_run(fn, _tokens_ds(vocab, docs), seed=s) for s in (5, 5, 6))
    assert all(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, b, strict=True))
    assert any(not np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, c, strict=False))


def test_span_corruption_refuses_too_few_sentinels(vocab):
    from t5x.vocabularies import ByteVocabulary

    small = ByteVocabulary(extra_ids=10)
    features = {"inputs": tt.Feature(small), "targets": tt.Feature(small)}
    with pytest.raises(ValueError, match=r"needs up to 28 sentinel ids .* extra_ids=10"):
        tt.span_corruption(
            _tokens_ds(small, ["x"]),
            sequence_length={"inputs": 512, "targets": 114},
            output_features=features,
        )
    features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)}
    too_short = {"inputs": 512, "targets": 100}
    with pytest.raises(ValueError, match=r"targets of 114 tokens .* is 100"):
        tt.span_corruption(_tokens_ds(vocab, ["x"]), sequence_length=too_short, output_features=features)


def test_noise_mask_exact_counts():
    seeds = tf.constant([[1, 2], [3, 4]], tf.int64)
    for length in (2, 10, 100, 568):
        mask = tt.random_spans_noise_mask(length, 0.15, seeds).numpy()
        assert mask.shape == (length,)
        num_noise = min(max(round(length * 0.15), 1), length - 1)
        assert mask.sum() == num_noise
        assert not mask[0]  # spans start with non-noise
        starts = np.sum(mask[1:] & ~mask[:-1]) + int(mask[0])
        assert starts == max(round(num_noise / 3.0), 1)


def test_iid_denoising_and_prefix_lm(vocab):
    features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)}
    lengths = {"inputs": 64, "targets": 64}
    docs = make_docs(30, seed=2)
    iid = _run(
        functools.partial(tt.iid_denoising, sequence_length=lengths, output_features=features),
        _tokens_ds(vocab, docs),
    )
    top = vocab.vocab_size - 1
    assert all(len(ex["inputs"]) <= 63 for ex in iid)
    sentinels = [t for ex in iid for t in ex["inputs"].tolist() if t > top - 100]
    assert sentinels and max(sentinels) == top

    prefix = _run(
        functools.partial(tt.prefix_lm, sequence_length=lengths, output_features=features),
        _tokens_ds(vocab, docs),
    )
    joined = [t for ex in prefix for t in ex["inputs"].tolist() + ex["targets"].tolist()]
    for ex in prefix:
        n = len(ex["inputs"]) + len(ex["targets"])
        assert len(ex["targets"]) >= 1
        assert len(ex["inputs"]) >= 1 or n == 1  # a 1-token chunk has no room for a prefix
        assert n <= 63
    # No concatenation across documents in prefix_lm: every document appears in order.
    assert joined == [t for d in docs for t in vocab.encode(d)]


def test_full_lm_concatenates_with_eos(vocab):
    features = {"targets": tt.Feature(vocab)}
    docs = ["ab", "cde", "f"]
    out = _run(
        functools.partial(tt.full_lm, sequence_length={"targets": 4}, output_features=features),
        _tokens_ds(vocab, docs),
    )
    flat = [t for ex in out for t in ex["targets"].tolist()]
    assert flat == [*vocab.encode("ab"), 1, *vocab.encode("cde"), 1, *vocab.encode("f"), 1]
    assert [len(ex["targets"]) for ex in out] == [4, 4, 1]


def test_split_tokens_and_select_random_chunk():
    ds = tf.data.Dataset.from_tensor_slices({"targets": tf.ragged.constant([[1, 2, 3, 4, 5], [], [6, 7]])})
    ds = ds.map(lambda x: {"targets": x["targets"]})
    out = _run(functools.partial(tt.split_tokens, max_tokens_per_segment=2), ds)
    assert [x["targets"].tolist() for x in out] == [[1, 2], [3, 4], [5], [6, 7]]
    out = _run(functools.partial(tt.select_random_chunk, output_features={}, max_length=2), ds)
    assert len(out) == 2  # the empty example is dropped
    assert out[0]["targets"].tolist() in ([1, 2], [3, 4], [5])
    rand = _run(functools.partial(tt.split_tokens, min_tokens_per_segment=1, max_tokens_per_segment=4), ds)
    assert [t for x in rand for t in x["targets"].tolist()] == [1, 2, 3, 4, 5, 6, 7]


def test_reduce_concat_tokens():
    ds = tf.data.Dataset.from_tensor_slices(
        {"targets": tf.ragged.constant([[1, 2], [3], [4, 5, 6]]), "x": [1, 2, 3]}
    )
    out = take(tt.reduce_concat_tokens(ds, batch_size=2))
    assert [x["targets"].tolist() for x in out] == [[1, 2, 3], [4, 5, 6]]
    assert set(out[0]) == {"targets"}


def test_random_split_text():
    text = " ".join(f"w{i}" for i in range(100))
    ds = tf.data.Dataset.from_tensor_slices({"text": [text]})
    out = _run(functools.partial(tt.random_split_text, min_words_per_segment=4, max_words_per_segment=8), ds)
    pieces = [x["text"].decode() for x in out]
    assert " ".join(pieces) == text
    assert all(len(p.split()) < 8 for p in pieces)
    assert len({len(p.split()) for p in pieces[:-1]}) == 1
