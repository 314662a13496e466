"""One task's split as numpy batches of model features, each row also holding its raw example.

What inference needs to write a line per example: the model's features to run
on, and the example's own fields (its text, before tokenization) to write next
to the output.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from t5x.tasks._lazy_tf import tf
from t5x.tasks._sources import data_source_error

# The object-dtype field of each batch that holds every row's example (a dict of numpy values).
EXAMPLE_FIELD = "_t5x_example"


class ExampleBatches:
    """One shard of a task's split as batches of model features, each row also holding its example.

    The examples come from ``task.get_dataset`` in order (no shuffling) and the
    model features from the model's feature converter applied to the same
    examples; ``EXAMPLE_FIELD`` holds each row's example as a dict of numpy
    values. ``get_state`` / ``set_state`` count the examples served, so that a
    resumed inference skips what it wrote.

    Args:
      task: a Task.
      converter: maps the task's examples one to one onto model features of
        fixed shapes (a feature converter with ``pack=False``).
      lengths: the task feature lengths.
      split: the split to read.
      rows: examples per batch (the last batch may be short).
      shard_info: the shard of the split to read (None: all of it).
      use_cached: read the task's offline cache.
      seed: the task's preprocessing seed.
    """

    def __init__(
        self,
        task: Any,
        converter: Any,
        lengths: Mapping[str, int],
        *,
        split: str,
        rows: int,
        shard_info: Any,
        use_cached: bool = False,
        seed: int | None = None,
    ):
        self._task, self._converter, self._lengths = task, converter, dict(lengths)
        self._split, self._rows, self._shard = split, rows, shard_info
        self._use_cached, self._seed = use_cached, seed
        self._skip = self._served = 0
        self._examples: Any = None

    def get_state(self) -> dict[str, int]:
        return {"examples": self._served}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._skip = self._served = int(state["examples"])
        self._examples = None

    def __iter__(self) -> ExampleBatches:
        return self

    def _open(self) -> Any:
        ds = self._task.get_dataset(
            self._lengths,
            split=self._split,
            shuffle=False,
            num_epochs=1,
            shard_info=self._shard,
            use_cached=self._use_cached,
            seed=self._seed,
        )
        # Without packing the converter maps example to example, so zipping keeps rows aligned.
        both = tf.data.Dataset.zip((ds, self._converter(ds, self._lengths)))
        return both.skip(self._skip).as_numpy_iterator() if self._skip else both.as_numpy_iterator()

    def __next__(self) -> dict[str, np.ndarray]:
        if self._examples is None:
            self._examples = self._open()
        failure = None
        try:
            pairs = list(itertools.islice(self._examples, self._rows))
        except tf.errors.OpError as error:
            failure = data_source_error(error, [(self._task.name, self._task.source, self._split)])
            if failure is None:
                raise
        if failure is not None:  # raised outside the handler, which holds TensorFlow's iterator
            self._examples = None
            raise failure
        if not pairs:
            raise StopIteration
        self._served += len(pairs)
        batch = {k: np.stack([features[k] for _, features in pairs]) for k in pairs[0][1]}
        column = np.empty(len(pairs), dtype=object)
        column[:] = [example for example, _ in pairs]
        batch[EXAMPLE_FIELD] = column
        return batch
