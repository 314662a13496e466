"""Helpers shared by the t5x.tasks tests (imported via conftest's sys.path entry)."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import tensorflow as tf

import t5x.tasks as tt


class PadConverter:
    """A tiny FeatureConverter: trims and pads each task feature, no packing."""

    pack = False
    apply_length_check = False

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        def fn(x):
            return {
                k: tf.pad(x[k][:n], [[0, n - tf.minimum(tf.size(x[k]), n)]])
                for k, n in task_feature_lengths.items()
            }

        return ds.map(fn).map(
            lambda x: {k: tf.ensure_shape(v, [task_feature_lengths[k]]) for k, v in x.items()}
        )

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        return dict(task_feature_lengths)


def make_docs(n: int, seed: int = 0) -> list[str]:
    return tt.generate_corpus(n, seed=seed, min_sentences=1, max_sentences=12)


def span_task(name: str, vocab, examples: list[str], extra_preprocessors=()) -> tt.Task:
    source = tt.InMemoryDataSource({"train": [{"text": t} for t in examples]})
    return tt.Task(
        name,
        source,
        {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)},
        preprocessors=[
            functools.partial(tt.rekey, key_map={"inputs": None, "targets": "text"}),
            tt.tokenize,
            tt.span_corruption,
            tt.append_eos_after_trim,
            *extra_preprocessors,
        ],
    )


def text_task(name: str, vocab, pairs: list[tuple[str, str]], split: str = "train") -> tt.Task:
    source = tt.InMemoryDataSource({split: [{"inputs": a, "targets": b} for a, b in pairs]})
    return tt.Task(
        name,
        source,
        {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)},
        preprocessors=[tt.tokenize, tt.append_eos_after_trim],
    )


def take(ds: tf.data.Dataset, n: int | None = None) -> list[dict]:
    if n is not None:
        ds = ds.take(n)
    return list(ds.as_numpy_iterator())
