"""Upstream t5x's ``t5x.checkpoints`` names that gin files refer to.

``Checkpointer`` is t5x.checkpointing's (the format is upstream's). Upstream's
``SaveBestCheckpointer`` is named so that a gin file using it parses, and is
then refused by the train script with what to use instead.
"""

from __future__ import annotations

from typing import Any

from t5x.checkpointing import Checkpointer, load_t5x_checkpoint


class SaveBestCheckpointer(Checkpointer):
    """Upstream's keep-the-best-by-metric checkpointer: not supported by t5x-launch.

    Accepts upstream's keywords so that gin can bind them; t5x-upstream's ``train``
    refuses a run configured with it (``SaveCheckpointConfig.keep`` keeps the newest).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "checkpoints.SaveBestCheckpointer is not supported: t5x-launch keeps the newest "
            "checkpoints (utils.SaveCheckpointConfig.keep) and every multiple of a step period"
        )


__all__ = ["Checkpointer", "SaveBestCheckpointer", "load_t5x_checkpoint"]
