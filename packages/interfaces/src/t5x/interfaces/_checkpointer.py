"""The Checkpointer contract: saving and restoring train states by step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from t5x.interfaces._values import JSONValue, PyTree, RestoredCheckpoint


@runtime_checkable
class Checkpointer(Protocol):
    """Saves train states under a model folder, one checkpoint per step.

    States are T5X state dicts: ``{"target": params, "state": {"step": int array,
    "param_states": optimizer slots}}``. A checkpoint becomes visible (listed by
    ``all_steps``) only once complete; a failed save leaves earlier ones intact.
    """

    def save(
        self, step: int, train_state: Mapping[str, PyTree], input_state: Mapping[str, JSONValue] | None = None
    ) -> None:
        """Starts saving ``train_state`` (and the input iterator's state) as ``step``.

        May return before the data is on disk; it blocks only while device arrays
        are copied to host memory. A failure in the background is raised by the
        next call to ``save``, ``wait_until_finished`` or ``close``.
        """
        ...

    def restore(
        self, step: int | None = None, target: PyTree = None, shardings: PyTree = None
    ) -> RestoredCheckpoint:
        """Loads checkpoint ``step`` (the latest when None).

        Args:
          step: which checkpoint.
          target: a state dict of the expected structure (arrays or objects with
            ``shape`` and ``dtype``); shapes and dtypes are checked against it.
          shardings: a tree like ``target`` of ``jax.sharding.Sharding``s to place
            the restored arrays with.

        Raises:
          FileNotFoundError: there is no such checkpoint (names the folder).
          ValueError: a shape or dtype does not fit ``target`` (names the
            parameter, the expected and the found value).
        """
        ...

    def all_steps(self) -> Sequence[int]:
        """The steps of all complete checkpoints, ascending."""
        ...

    def latest_step(self) -> int | None:
        """The newest complete step, or None when there is none."""
        ...

    def wait_until_finished(self) -> None:
        """Blocks until pending saves are on disk; raises their errors."""
        ...

    def close(self) -> None:
        """Waits for pending saves and releases resources."""
        ...
