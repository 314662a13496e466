import collections

import pytest
from tasks_testlib import take, text_task

import t5x.tasks as tt


def _tasks(vocab, sizes):
    return [
        text_task(f"m_{name}", vocab, [(f"{name} {i}", name) for i in range(n)]) for name, n in sizes.items()
    ]


def test_rates_numbers_callables_and_num_examples(vocab):
    a, b, c = _tasks(vocab, {"a": 100, "b": 400, "c": 10000})
    mix = tt.Mixture("m_rates", [(a, 1.0), (b, lambda t: 3.0), (c, 0)])
    assert mix.get_rate(a) == 1.0 and mix.get_rate(b) == 3.0 and mix.get_rate(c) == 0.0
    assert tt.rate_num_examples(b) == 400.0
    assert tt.mixing_rate_num_examples(c, maximum=1000) == 1000.0
    assert tt.mixing_rate_num_examples(b, temperature=2.0) == pytest.approx(20.0)
    assert tt.mixing_rate_num_examples(b, scale=0.5) == 200.0
    by_size = tt.Mixture("m_size", [a, b], default_rate=tt.rate_num_examples)
    assert by_size.get_rate(b) / by_size.get_rate(a) == 4.0


def test_sampling_follows_rates_and_seed(vocab):
    a, b = _tasks(vocab, {"a": 50, "b": 50})
    mix = tt.Mixture("m_sample", [(a, 1.0), (b, 3.0)])
    pa, pb = vocab.encode("a"), vocab.encode("b")
    rows = take(mix.get_dataset(None, seed=7), 2000)
    kinds = collections.Counter(r["targets"][0] for r in rows)
    assert kinds[pb[0]] / 2000 == pytest.approx(0.75, abs=0.04)
    assert kinds[pa[0]] + kinds[pb[0]] == 2000
    again = take(mix.get_dataset(None, seed=7), 200)
    assert [r["inputs"].tolist() for r in rows[:200]] == [r["inputs"].tolist() for r in again]


def test_nested_mixture_rates(vocab):
    a, b, c = _tasks(vocab, {"a": 5, "b": 5, "c": 5})
    inner = tt.Mixture("m_inner", [(a, 1.0), (b, 3.0)])
    outer = tt.Mixture("m_outer", [(inner, 2.0), (c, 2.0)])
    assert [t.name for t in outer.tasks] == ["m_a", "m_b", "m_c"]
    assert outer.get_rate(a) == pytest.approx(0.5)
    assert outer.get_rate(b) == pytest.approx(1.5)
    assert outer.get_rate(c) == pytest.approx(2.0)
    assert outer.num_input_examples("train") == 15


def test_registry_mixture_by_name_and_errors(vocab, clean_registry):
    for task in _tasks(vocab, {"x": 3, "y": 3}):
        tt.TaskRegistry.add_provider(task.name, task)
    mix = tt.MixtureRegistry.add("m_named", ["m_x", ("m_y", 2.0)], default_rate=1.0)
    assert tt.get_mixture_or_task("m_named") is mix
    with pytest.raises(KeyError, match="m_x"):
        tt.MixtureRegistry.add("m_bad", ["m_xx"], default_rate=1.0)
    with pytest.raises(ValueError, match="no rate"):
        tt.MixtureRegistry.add("m_norate", ["m_x"])
    with pytest.raises(ValueError, match="more than once"):
        tt.MixtureRegistry.add("m_dup", ["m_x", "m_x"], default_rate=1.0)


def test_incompatible_vocabularies_rejected(vocab):
    from t5x.vocabularies import ByteVocabulary

    (a,) = _tasks(vocab, {"a": 2})
    other = text_task("m_other", ByteVocabulary(extra_ids=3), [("a", "b")])
    with pytest.raises(ValueError, match="different vocabulary"):
        tt.Mixture("m_incompat", [a, other], default_rate=1.0)
