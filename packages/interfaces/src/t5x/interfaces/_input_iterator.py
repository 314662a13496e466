"""The InputIterator contract: numpy batches with a small resumable state."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from t5x.interfaces._values import ArraySpec, JSONValue


@runtime_checkable
class InputIterator(Protocol):
    """An iterator of batches for one process, that can be saved and resumed.

    Each element is a ``dict[str, np.ndarray]`` whose keys and shapes follow
    ``element_spec`` (a dimension given as None may vary). A finite iterator
    raises ``StopIteration`` when done.

    ``get_state()`` describes the position *after* the last batch returned: a
    fresh iterator over the same data given that state with ``set_state`` yields
    exactly the batches the original would have yielded next. The state is a
    small JSON-serialisable dict (indices, epochs, seeds; a few KiB at most,
    never a dump of buffered data) so that it can live inside a checkpoint.
    """

    @property
    def element_spec(self) -> Mapping[str, ArraySpec]:
        """Shape and dtype of each feature of a batch."""
        ...

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]: ...

    def __next__(self) -> dict[str, np.ndarray]: ...

    def get_state(self) -> dict[str, JSONValue]:
        """Returns the position after the last batch returned."""
        ...

    def set_state(self, state: Mapping[str, JSONValue]) -> None:
        """Moves to the position ``state`` describes.

        Raises:
          ValueError: ``state`` does not come from an iterator over the same data
            (the message says which field disagrees).
        """
        ...
