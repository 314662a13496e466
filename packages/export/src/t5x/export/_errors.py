"""The export's one error type."""

from __future__ import annotations


class ExportError(ValueError):
    """An export that cannot be made as asked: no serving signature is possible for this model,
    vocabulary or mode, or the output folder cannot take it. The message names the part and
    what would work instead."""
