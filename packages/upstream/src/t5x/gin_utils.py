"""Upstream t5x's ``t5x.gin_utils`` names that run gin files refer to."""

from __future__ import annotations

from typing import Any


def summarize_gin_config(model_dir: str, summary_writer: Any = None, step: int = 0) -> None:
    """Upstream writes the operative config to the model folder; t5x-launch always does.

    Named in upstream run files as ``summarize_config_fn``; the launcher writes
    ``config.gin`` into the model folder itself, so this does nothing.
    """
    del model_dir, summary_writer, step


__all__ = ["summarize_gin_config"]
