"""Upstream t5x's ``t5x.checkpoints`` names that gin files refer to.

``Checkpointer`` is t5x.checkpointing's (the format is upstream's). Upstream's
``SaveBestCheckpointer`` carries the keywords gin binds for keeping the best
checkpoint by a metric (read by the train script).
"""

from __future__ import annotations

from typing import Any, ClassVar

from t5x.checkpointing import Checkpointer, load_t5x_checkpoint


class SaveBestCheckpointer(Checkpointer):
    """Upstream's keep-the-best-by-metric checkpointer, as a name gin binds keywords to.

    ``utils.SaveCheckpointConfig.checkpointer_cls = @checkpoints.SaveBestCheckpointer``
    with ``metric_name_to_monitor``, ``metric_mode`` and
    ``keep_checkpoints_without_metrics`` bound: t5x-upstream's ``train`` reads
    those bindings into ``t5x.launch.SaveCheckpointConfig`` (the newest ``keep``
    checkpoints plus the best one are kept). It is never built itself.
    """

    # Upstream's defaults for the keywords gin may bind.
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "metric_name_to_monitor": "train/accuracy",
        "metric_mode": "max",
        "keep_checkpoints_without_metrics": True,
        "force_keep_period": None,
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "checkpoints.SaveBestCheckpointer is a gin name here: set it as "
            "utils.SaveCheckpointConfig.checkpointer_cls and t5x-upstream's train keeps the best "
            "checkpoint by its metric_name_to_monitor"
        )


class CheckpointManager:
    """Upstream's Orbax-backed checkpoint manager, as a name to subclass or refer to.

    ``t5x.utils.restore`` and ``TrainStateInitializer`` call a subclass's
    ``restore(path=..., fallback_state=..., state_transformation_fns=...)``. This
    base is not built here: t5x-launch saves and restores with ``Checkpointer``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "checkpoints.CheckpointManager (upstream's Orbax manager) is not implemented here: "
            "t5x-launch saves and restores checkpoints with t5x.checkpointing.Checkpointer"
        )

    def restore(self, path: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.restore is not implemented (asked for {path})")


__all__ = ["CheckpointManager", "Checkpointer", "SaveBestCheckpointer", "load_t5x_checkpoint"]
