"""t5x.test_utils' model and data helpers: the fake tokenized dataset, the tiny T5 model, train states."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from t5x import adafactor, test_utils


def test_fake_tokenized_dataset_splits():
    validation = list(test_utils.get_fake_tokenized_dataset(split="validation").as_numpy_iterator())
    assert len(validation) == 8 and validation[0]["inputs_pretokenized"] == b"complete: this"
    assert all(
        (v["targets"] == validation[0]["targets"]).all() for v in validation[:4]
    )  # each repeated 4 times
    assert validation[0]["inputs"].dtype == np.int32
    test = list(test_utils.get_fake_tokenized_dataset("any task", split="test").as_numpy_iterator())
    assert [t["targets_pretokenized"] for t in test] == [v["targets_pretokenized"] for v in validation]
    train = test_utils.get_fake_tokenized_dataset(split="train").take(7)
    assert [t["targets_pretokenized"] for t in train.as_numpy_iterator()][3] == b"is a test"  # repeats
    with pytest.raises(ValueError, match="split must be"):
        test_utils.get_fake_tokenized_dataset(split="dev")


def test_t5_test_model_and_its_train_state():
    model = test_utils.get_t5_test_model(vocab_size=64, emb_dim=12)
    assert isinstance(model.optimizer_def, adafactor.Adafactor)
    variables = model.get_initial_variables(
        jax.random.PRNGKey(0), {"encoder_input_tokens": (2, 4), "decoder_input_tokens": (2, 4)}
    )
    assert variables["params"]["token_embedder"]["embedding"].shape == (64, 12)
    state = test_utils.get_train_state_from_variables(variables)
    assert int(state.step) == 0
    test_utils.assert_same(state.params, variables["params"])
