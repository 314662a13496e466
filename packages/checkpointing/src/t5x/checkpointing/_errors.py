"""The error a damaged or tampered-with checkpoint raises."""

from __future__ import annotations


class CheckpointIntegrityError(ValueError):
    """A checkpoint on disk is not what was written.

    Raised for a changed chunk (its checksum differs, or it no longer decodes), a
    missing chunk file or array folder, a changed ``.zarray``, an index whose shape
    or dtype disagrees with its array, and a path that leaves the step folder. The
    message names the parameter (dotted state path), the file, and what was
    expected against what was found.

    Attributes:
      name: the parameter's dotted state path, or None for a step-level problem.
      path: the file or folder at fault, when there is one.
      problems: for :func:`verify_checkpoint`, every problem found (each a
        ``CheckpointIntegrityError``); otherwise just this error.
    """

    def __init__(self, message: str, *, name: str | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.path = path
        self.problems: list[CheckpointIntegrityError] = [self]
