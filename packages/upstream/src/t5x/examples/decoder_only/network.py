"""Upstream's ``t5x.examples.decoder_only.network`` names on ``t5x.models``.

Subclasses of t5x.models' own (see ``t5x.examples.t5.network`` for why).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from t5x import models
from t5x.models import Decoder, DecoderLayer


@dataclasses.dataclass(frozen=True)
class TransformerConfig(models.DecoderOnlyConfig):
    """Upstream's ``network.TransformerConfig`` (``num_layers`` deep; as ``t5x.models.DecoderOnlyConfig``)."""


class DecoderWrapper(models.DecoderOnlyTransformer):
    """Upstream's ``network.DecoderWrapper(config)``: the decoder-only network."""

    # The model initialises it from the whole key, as upstream's models do (the same key
    # then draws upstream's initial parameters).
    params_from_whole_key: ClassVar[bool] = True


__all__ = ["Decoder", "DecoderLayer", "DecoderWrapper", "TransformerConfig"]
