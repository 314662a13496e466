"""Upstream's ``t5x.examples.scalable_t5.network`` names on ``t5x.models``.

Scalable T5 is T5.1.1 with its layers stacked by ``lax.scan`` (the layer axis
at position 1 of every parameter) and optional rematerialisation; t5x.models
builds both layouts from the same config. Unlike upstream's ``t5`` network,
every layer has its own relative-position table, ``<layer>/relative_posemb``
(the architecture UMT5 was trained with).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from t5x import models
from t5x.models import Decoder, DecoderLayer, Encoder, EncoderLayer


@dataclasses.dataclass(frozen=True)
class T5Config(models.T5Config):
    """Upstream's scalable ``network.T5Config``: layers scanned by default.

    Attributes:
      param_scan_axis: the axis of the stacked layers in each parameter; only
        upstream's default, 1, is built.
    """

    scan_layers: bool = True
    param_scan_axis: int = 1
    per_layer_relpos_bias: bool = True
    layer_relpos_name: str = "relative_posemb"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.param_scan_axis != 1:
            raise ValueError(
                f"scalable_t5 T5Config.param_scan_axis: only 1 (upstream's default) is supported, got {self.param_scan_axis!r}"
            )


class Transformer(models.EncoderDecoderTransformer):
    """Upstream's scalable ``network.Transformer(config)``."""

    # The model initialises it from the whole key, as upstream's models do (the same key
    # then draws upstream's initial parameters).
    params_from_whole_key: ClassVar[bool] = True


__all__ = ["Decoder", "DecoderLayer", "Encoder", "EncoderLayer", "T5Config", "Transformer"]
