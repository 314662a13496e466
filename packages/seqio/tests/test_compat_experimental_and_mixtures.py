"""seqio.experimental, seqio's mixture sampling and PyGlove-style rates, BertWordPieceVocabulary."""

from __future__ import annotations

import functools
import re

import pytest
import tensorflow as tf

import t5x.seqio as seqio
import t5x.tasks as core
from t5x.seqio import experimental

VOCAB = seqio.PassThroughVocabulary(100)


def _source(values=(0, 1)):
    def dataset_fn(split, shuffle_files, seed=None):
        return tf.data.Dataset.from_tensor_slices(list(values))

    return seqio.FunctionDataSource(dataset_fn, splits=["train", "validation"])


def _to_features(ds, output_features):
    return ds.map(lambda x: {k: [tf.cast(x, tf.int32) + 1] for k in output_features})


def _add_constant_task(name, value, features=("inputs", "targets")):
    @seqio.map_over_dataset
    def constant(unused_x):
        return {k: tf.constant([value], tf.int32) for k in features}

    return seqio.TaskRegistry.add(
        name,
        source=_source(),
        preprocessors=[constant],
        output_features={k: seqio.Feature(VOCAB) for k in features},
    )


@pytest.fixture
def empty_registries(monkeypatch):
    # disable_registry needs empty registries and replaces class attributes:
    # empty them for the test, then put back the contents and the methods.
    saved = [(registry, dict(registry._REGISTRY)) for registry in (seqio.TaskRegistry, seqio.MixtureRegistry)]
    for registry, _ in saved:
        for attr in ("add", "add_provider", "get"):
            monkeypatch.setattr(registry, attr, registry.__dict__[attr])
        registry._REGISTRY.clear()
    yield
    for registry, contents in saved:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(contents)


def test_disable_registry(empty_registries):
    seqio.TaskRegistry.add(
        "compat_dr_task", source=_source(), output_features={"targets": seqio.Feature(VOCAB)}
    )
    with pytest.raises(ValueError, match="The TaskRegistry is non-empty"):
        experimental.disable_registry()
    seqio.TaskRegistry.remove("compat_dr_task")
    experimental.disable_registry()
    seqio.TaskRegistry.add(
        "compat_dr_task", source=_source(), output_features={"targets": seqio.Feature(VOCAB)}
    )
    assert seqio.TaskRegistry.names() == []
    with pytest.raises(ValueError, match="Disabled TaskRegistry.get call: compat_dr_task"):
        seqio.TaskRegistry.get("compat_dr_task")
    with pytest.raises(ValueError, match="Disabled MixtureRegistry.get call: m"):
        seqio.MixtureRegistry.get("m")


def test_add_fully_cached_task(clean_registry):
    seqio.TaskRegistry.add(
        "compat_fc_task",
        source=_source(),
        preprocessors=[_to_features],
        output_features={"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)},
    )
    task = experimental.add_fully_cached_task("compat_fc_task", {"inputs": 4, "targets": 3})
    assert task.name == "compat_fc_task_i4_t3"
    assert experimental.add_fully_cached_task("compat_fc_task", {"inputs": 4, "targets": 3}) is task
    assert isinstance(task.preprocessors[-2], seqio.CacheDatasetPlaceholder)
    assert task.preprocessors[-2].required
    with pytest.raises(ValueError, match="requires caching"):
        task.get_dataset(None)
    task.preprocessors[-2]._required = False
    with pytest.raises(
        ValueError, match=r"can only be loaded with `sequence_length=\{'inputs': 4, 'targets': 3\}`"
    ):
        task.get_dataset({"inputs": 5, "targets": 3})
    rows = list(task.get_dataset(None, shuffle=False).as_numpy_iterator())
    assert [r["inputs"].tolist() for r in rows] == [[1], [2]]


def test_fully_cached_names_use_the_shortest_distinct_prefix():
    assert experimental._fully_cached_name("t", {"target": 5, "targets": 6}) == "t_target5_targets6"
    assert experimental._fully_cached_name("t", {"tar": 1, "tbr": 2}) == "t_ta1_tb2"


def test_add_task_with_sentinels(clean_registry):
    seqio.TaskRegistry.add(
        "compat_st_task_train",
        source=_source(),
        preprocessors=[_to_features],
        output_features={"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)},
    )
    experimental.add_task_with_sentinels("compat_st_task_train", num_sentinels=2)
    task = seqio.TaskRegistry.get("compat_st_task_2_sentinel_train")
    rows = list(task.get_dataset(None, shuffle=False).as_numpy_iterator())
    assert [r["inputs"].tolist() for r in rows] == [[1, 99, 98], [2, 99, 98]]
    assert [r["targets"].tolist() for r in rows] == [[99, 98, 1], [99, 98, 2]]


def test_fewshot_source_and_preprocessor():
    def dataset_fn(split, shuffle_files, seed=None):
        texts = {"train": ["q1", "q2", "q3"], "validation": ["v1"]}[split]
        return tf.data.Dataset.from_tensor_slices({"inputs": texts, "targets": [t.upper() for t in texts]})

    source = experimental.FewshotDataSource(
        seqio.FunctionDataSource(dataset_fn, splits=["train", "validation"]), num_shots=2
    )
    ds = source.get_dataset("validation", shuffle=False)
    example = next(ds.as_numpy_iterator())
    assert example["eval"]["inputs"] == b"v1"
    assert example["train"]["inputs"].shape == (2,)
    shots = [s.decode() for s in example["train"]["inputs"]]
    assert set(shots) <= {"q1", "q2", "q3"}
    joined = next(experimental.fewshot_preprocessor(ds, "Q: ", " A: ", "|").as_numpy_iterator())
    # The train side reshuffles on every pass, so check the layout, not which shots.
    assert re.fullmatch(r"(Q: q(\d) A: Q\2\|){2}Q: v1 A:", joined["inputs"].decode())
    assert joined["targets"] == b"V1"
    with pytest.raises(ValueError, match="Train split 'dev'"):
        experimental.FewshotDataSource(source, 1, train_split="dev").get_dataset("validation")


def test_mixture_samples_as_seqio_in_task_name_order(clean_registry):
    _add_constant_task("compat_mix_b", 2)
    _add_constant_task("compat_mix_a", 3)
    mix = seqio.MixtureRegistry.add("compat_mix", [("compat_mix_b", 1), ["compat_mix_a", 1]])
    assert [t.name for t in mix.tasks] == ["compat_mix_a", "compat_mix_b"]
    got = [int(x["inputs"][0]) for x in mix.get_dataset({"inputs": 2, "targets": 2}, seed=13).take(200)]
    # seqio: sample_from_datasets over the name-sorted tasks, the raw rates, the given seed.
    constant = [tf.data.Dataset.from_tensors(v).repeat() for v in (3, 2)]
    want = tf.data.Dataset.sample_from_datasets(constant, [1.0, 1.0], seed=13, stop_on_empty_dataset=True)
    assert got == [int(x) for x in want.take(200).as_numpy_iterator()]
    # The core keeps the listed order (docs/differences.md, row 16).
    listed = core.Mixture(
        "compat_mix_core", [seqio.get_mixture_or_task("compat_mix_b"), (mix.tasks[0], 1)], 1
    )
    assert [t.name for t in listed.tasks] == ["compat_mix_b", "compat_mix_a"]
    got_core = [
        int(x["inputs"][0]) for x in listed.get_dataset({"inputs": 2, "targets": 2}, seed=13).take(200)
    ]
    assert got_core == [5 - v for v in got]  # the same draws, the other dataset first


def test_mixture_sample_fn_and_feature_checks(clean_registry):
    _add_constant_task("compat_sf_a", 1)
    _add_constant_task("compat_sf_b", 2)

    def concatenate(datasets, rates, seed):
        assert rates == [1.0, 1.0] and seed == 42
        return datasets[0].take(2).concatenate(datasets[1].take(1))

    mix = seqio.Mixture("compat_sf", [("compat_sf_a", 1), ("compat_sf_b", 1)], sample_fn=concatenate)
    got = [int(x["inputs"][0]) for x in mix.get_dataset(None, shuffle=False).as_numpy_iterator()]
    assert got == [1, 1, 2]
    _add_constant_task("compat_sf_c", 3, features=("targets",))
    with pytest.raises(ValueError, match="contains Tasks with different output features"):
        seqio.Mixture("compat_sf_bad", [("compat_sf_a", 1), ("compat_sf_c", 1)])


class _FakeHyper:
    """Stands in for a PyGlove hyper primitive: symbolic init args, from a pyglove module."""

    def __init__(self, value, name=None):
        self.sym_init_args = {"value": value, "name": name}
        self.value = value

    def __float__(self):
        return float(self.value)


_FakeHyper.__module__ = "pyglove.core.fake"


def test_pyglove_tunable_mixture_reads_hyper_rates(clean_registry):
    _add_constant_task("compat_pg_a", 1)
    _add_constant_task("compat_pg_b", 2)
    mix = seqio.dataset_providers.PyGloveTunableMixture(
        "compat_pg", [("compat_pg_a", _FakeHyper(3.0)), ("compat_pg_b", 1.0)]
    )
    rate = mix._task_to_rate["compat_pg_a"]
    assert callable(rate)
    assert rate(None).sym_init_args["name"] == "compat_pg_a"  # named after the task when unnamed
    assert [mix.get_rate(t) for t in mix.tasks] == [3.0, 1.0]


def test_bert_wordpiece_vocabulary(tmp_path):
    pytest.importorskip("tensorflow_text")
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "this", "is", "a", "test", "##s"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(pieces) + "\n")
    vocab = seqio.vocabularies.BertWordPieceVocabulary(
        str(path), start_of_sequence_id=2, end_of_sequence_id=3
    )
    # tensorflow-text's lookup table adds one out-of-vocabulary bucket (seqio reports it too).
    assert vocab.vocab_size == len(pieces) + 1
    assert (vocab.unk_id, vocab.eos_id, vocab.pad_id) == (1, 3, 0)
    assert list(vocab.encode("this is a tests")) == [5, 6, 7, 8, 9]
    assert list(vocab.encode_tf(tf.constant("this is a test")).numpy()) == [5, 6, 7, 8]
    assert vocab.decode([5, 6, 7, 8]) == "this is a test"
    assert vocab.decode_tf(tf.constant([2, 4, 1])).numpy() == b"[CLS] [MASK] [UNK]"
    same = functools.partial(seqio.vocabularies.BertWordPieceVocabulary, str(path))
    assert same(start_of_sequence_id=2) == vocab
    assert same(start_of_sequence_id=5) != vocab
