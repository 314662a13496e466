import pytest

from t5x.interfaces import (
    Checkpointer,
    FeatureConverter,
    InputIterator,
    MetricWriter,
    Model,
    Partitioner,
    Vocabulary,
    check_contract,
    contract_members,
    missing_members,
)

from .fakes import ByteLevelVocabulary, CountingIterator


def test_each_contract_lists_its_members():
    assert set(contract_members(Vocabulary)) >= {
        "encode",
        "decode",
        "encode_tf",
        "decode_tf",
        "vocab_size",
        "eos_id",
    }
    assert set(contract_members(InputIterator)) == {
        "__iter__",
        "__next__",
        "element_spec",
        "get_state",
        "set_state",
    }
    assert set(contract_members(FeatureConverter)) == {
        "__call__",
        "pack",
        "apply_length_check",
        "get_model_feature_lengths",
    }
    for protocol in (Model, Partitioner, Checkpointer, MetricWriter):
        assert contract_members(protocol), protocol


def test_a_complete_implementation_has_no_missing_members():
    assert missing_members(ByteLevelVocabulary(), Vocabulary) == []
    assert missing_members(CountingIterator(10, 2), InputIterator) == []
    check_contract(ByteLevelVocabulary(), Vocabulary)


def test_missing_members_are_named():
    class HalfVocabulary:
        vocab_size = 10

        def encode(self, s):
            return []

    missing = missing_members(HalfVocabulary(), Vocabulary)
    assert "decode" in missing and "eos_id" in missing and "vocab_size" not in missing
    with pytest.raises(TypeError, match=r"my vocabulary does not implement the Vocabulary contract.*decode"):
        check_contract(HalfVocabulary(), Vocabulary, component="my vocabulary")


def test_a_non_callable_method_counts_as_missing():
    class Odd(CountingIterator):
        get_state = 3

    assert missing_members(Odd(4, 2), InputIterator) == ["get_state"]
