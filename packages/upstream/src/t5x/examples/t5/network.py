"""Upstream's ``t5x.examples.t5.network`` names on ``t5x.models``.

The classes are subclasses of t5x.models' own, so that gin registers the
upstream names apart from t5x-launch's (``models.T5Config``) while the models
take them as their own. Parameter names and shapes are upstream's.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from t5x import models
from t5x.models import Decoder, DecoderLayer, Encoder, EncoderLayer


@dataclasses.dataclass(frozen=True)
class T5Config(models.T5Config):
    """Upstream's ``network.T5Config`` (same fields and defaults as ``t5x.models.T5Config``)."""


class Transformer(models.EncoderDecoderTransformer):
    """Upstream's ``network.Transformer(config)``: the encoder-decoder network."""

    # The model initialises it from the whole key, as upstream's models do (the same key
    # then draws upstream's initial parameters).
    params_from_whole_key: ClassVar[bool] = True


__all__ = ["Decoder", "DecoderLayer", "Encoder", "EncoderLayer", "T5Config", "Transformer"]
