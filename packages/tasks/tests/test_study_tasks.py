"""objective_task: the study's pretraining tasks on one corpus, three objectives."""

from __future__ import annotations

import numpy as np
import pytest

import t5x.tasks
from t5x.vocabularies import ByteVocabulary


def _examples(name, lengths, n=3):
    task = t5x.tasks.get_mixture_or_task(name)
    ds = task.get_dataset(lengths, split="validation", shuffle=False, seed=0)
    return list(ds.take(n).as_numpy_iterator())


def test_full_lm_pieces_fill_targets_and_eos_inputs_are_one_token():
    plain = t5x.tasks.objective_task("full_lm")
    with_inputs = t5x.tasks.objective_task("full_lm", eos_inputs=True)
    assert (plain, with_inputs) == ("study_corpus_full_lm", "study_corpus_full_lm_eos_inputs")
    assert "inputs" not in t5x.tasks.get_mixture_or_task(plain).output_features
    eos = t5x.tasks.builtin_vocabulary().eos_id
    a = _examples(plain, {"targets": 40})
    b = _examples(with_inputs, {"inputs": 1, "targets": 40})
    for x, y in zip(a, b, strict=True):
        assert len(x["targets"]) == 40
        np.testing.assert_array_equal(x["targets"], y["targets"])
        np.testing.assert_array_equal(y["inputs"], [eos])


def test_prefix_lm_splits_one_piece_into_inputs_and_targets():
    name = t5x.tasks.objective_task("prefix_lm")
    eos = t5x.tasks.builtin_vocabulary().eos_id
    for ex in _examples(name, {"inputs": 33, "targets": 34}):
        assert ex["inputs"][-1] == eos and ex["targets"][-1] == eos
        # A piece of inputs-length-less-one tokens (documents end early), split in two.
        assert len(ex["inputs"]) + len(ex["targets"]) - 2 <= 32


def test_span_corruption_uses_sentinels():
    name = t5x.tasks.objective_task("span_corruption")
    vocab = t5x.tasks.builtin_vocabulary()
    first_sentinel = vocab.vocab_size - 1
    for ex in _examples(name, {"inputs": 51, "targets": 13}):
        assert first_sentinel in ex["inputs"] and ex["targets"][0] == first_sentinel


def test_registration_is_idempotent_and_checks_the_vocabulary():
    assert t5x.tasks.objective_task("prefix_lm") == t5x.tasks.objective_task("prefix_lm")
    with pytest.raises(ValueError, match="already registered with vocabulary"):
        t5x.tasks.objective_task("prefix_lm", vocabulary=ByteVocabulary(extra_ids=10))
    name = t5x.tasks.objective_task(
        "prefix_lm",
        vocabulary=ByteVocabulary(extra_ids=10),
        corpus_name="other",
        source=t5x.tasks.builtin_corpus_source(),
    )
    assert name == "other_prefix_lm"


def test_unknown_objective_names_the_known_ones():
    with pytest.raises(ValueError, match="span_corruption"):
        t5x.tasks.objective_task("denoise_everything")
