"""Shared fixtures: build task datasets from Python lists and convert them."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
import tensorflow as tf


def make_ds(examples, names=None):
    """A dataset of dicts of 1-D int32 tensors (variable length) from lists."""
    names = sorted(names or examples[0])
    return tf.data.Dataset.from_generator(
        lambda: ({k: np.asarray(ex[k], np.int32) for k in names} for ex in examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in names},
    )


def run_converter(converter, examples, lengths):
    """Converts ``examples`` and returns a list of dicts of Python lists."""
    out = converter(make_ds(examples, list(lengths)), lengths)
    return [{k: v.tolist() for k, v in ex.items()} for ex in out.as_numpy_iterator()]


@pytest.fixture
def convert():
    return run_converter


@pytest.fixture
def dataset():
    return make_ds
