import functools

import pytest
import tensorflow as tf
from tasks_testlib import take

import t5x.tasks as tt


def _ds(rows):
    return tf.data.Dataset.from_tensor_slices({k: [r[k] for r in rows] for k in rows[0]})


def test_rekey_renames_and_fills_empty():
    out = take(tt.rekey(_ds([{"text": "hi", "other": "x"}]), key_map={"inputs": None, "targets": "text"}))
    assert out == [{"inputs": b"", "targets": b"hi"}]
    with pytest.raises(KeyError, match="missing"):
        tt.rekey(_ds([{"text": "hi"}]), key_map={"targets": "missing"})


def test_tokenize_copies_text_and_encodes(vocab):
    features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab, add_eos=False)}
    (ex,) = take(tt.tokenize(_ds([{"inputs": "ab", "targets": "c", "id": "7"}]), features))
    assert ex["inputs"].tolist() == vocab.encode("ab")
    assert ex["inputs_pretokenized"] == b"ab"
    assert ex["id"] == b"7"
    (ex,) = take(tt.tokenize_and_append_eos(_ds([{"inputs": "ab", "targets": "c"}]), features))
    assert ex["inputs"].tolist() == [*vocab.encode("ab"), vocab.eos_id]
    assert ex["targets"].tolist() == vocab.encode("c")  # add_eos=False


def test_append_eos_and_after_trim(vocab):
    features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab, add_eos=False)}
    ds = tt.tokenize(_ds([{"inputs": "abcdef", "targets": "xyz"}]), features, copy_pretokenized=False)
    (plain,) = take(tt.append_eos(ds, features))
    assert plain["inputs"].tolist() == [*vocab.encode("abcdef"), 1]
    (trimmed,) = take(tt.append_eos_after_trim(ds, features, sequence_length={"inputs": 4, "targets": 2}))
    assert trimmed["inputs"].tolist() == [*vocab.encode("abc"), 1]
    assert trimmed["targets"].tolist() == vocab.encode("xyz")  # left for the task to trim


def test_translate_and_summarize():
    (ex,) = take(
        tt.translate(_ds([{"en": "Hello", "de": "Hallo"}]), source_language="en", target_language="de")
    )
    assert ex == {"inputs": b"translate English to German: Hello", "targets": b"Hallo"}
    (ex,) = take(
        tt.summarize(_ds([{"article": "Long text", "highlights": "Short"}]), "article", "highlights")
    )
    assert ex == {"inputs": b"summarize: Long text", "targets": b"Short"}
    with pytest.raises(ValueError, match="unknown language code 'xx'"):
        tt.translate(_ds([{"en": "a", "xx": "b"}]), source_language="en", target_language="xx")


def test_filter_by_string_length():
    ds = _ds([{"targets": "a"}, {"targets": "abcd"}, {"targets": ""}])
    assert [x["targets"] for x in take(tt.filter_by_string_length(ds, min_length=1, max_length=3))] == [b"a"]


def test_map_over_dataset_seeds_are_deterministic():
    @tt.map_over_dataset(num_seeds=2)
    def draw(x, seeds):
        return {"r": tf.random.stateless_uniform([], seed=seeds[1], maxval=1000, dtype=tf.int32)}

    def run(seed):
        from t5x.tasks._utils import preprocessor_seed_scope

        with preprocessor_seed_scope(seed):
            ds = draw(tf.data.Dataset.range(20).map(lambda i: {"i": i}))
        return [int(x["r"]) for x in ds.as_numpy_iterator()]

    assert run(3) == run(3)
    assert run(3) != run(4)
    assert len(set(run(3))) > 10  # examples get different seeds


def test_preprocessor_kwargs_follow_signature(vocab, clean_registry):
    seen = {}

    def wants_both(ds, sequence_length, output_features):
        seen["both"] = (dict(sequence_length), sorted(output_features))
        return ds

    def wants_none(ds):
        seen["none"] = True
        return ds

    source = tt.InMemoryDataSource({"train": [{"targets": "abc"}]})
    task = tt.Task(
        "kw_task",
        source,
        {"targets": tt.Feature(vocab)},
        preprocessors=[wants_none, functools.partial(tt.tokenize, copy_pretokenized=False), wants_both],
    )
    take(task.get_dataset({"targets": 8}, shuffle=False))
    assert seen == {"none": True, "both": ({"targets": 8}, ["targets"])}
