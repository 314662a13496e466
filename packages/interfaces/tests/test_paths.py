import pytest

from t5x.interfaces import unflatten


def test_string_paths_nest_at_the_separator():
    assert unflatten({"a/b": 1, "a/c": 2, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}
    assert unflatten({"a.b": 1}, sep=".") == {"a": {"b": 1}}


def test_tuple_paths_nest_key_by_key():
    flat = {("target", "encoder", "kernel"): 1, ("target", "decoder"): 2, ("step",): 3}
    assert unflatten(flat, sep=None) == {"target": {"encoder": {"kernel": 1}, "decoder": 2}, "step": 3}
    # With a separator, tuples still nest by element and their strings are not split.
    assert unflatten({("a/b", "c"): 1}) == {"a/b": {"c": 1}}


def test_a_path_under_a_value_is_refused():
    with pytest.raises(ValueError, match="'a/b/c' lies under 'b'"):
        unflatten({"a/b": 1, "a/b/c": 2})
    with pytest.raises(ValueError, match="'a' holds a value and is also the parent"):
        unflatten({"a/b": 1, "a": 2})
