"""Model features from raw text, in the graph (TF) and in Python (the reference predictions).

Both follow the unpacked encoder-decoder feature conversion: a text's ids are
trimmed to leave room for EOS, EOS appended (``add_eos``), then zero-padded to the
task feature length; the decoder's inputs are its targets shifted right by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from t5x.export._text import GraphTokenizer


def padded_ids_tf(tokenizer: GraphTokenizer, texts: tf.Tensor, length: int, add_eos: bool) -> tf.Tensor:
    """``[batch]`` strings -> ``[batch, length]`` int32 ids (trimmed, EOS, zero padding)."""
    ids = tokenizer.encode(texts)
    if add_eos:
        rows = ids.nrows()
        eos = tf.RaggedTensor.from_tensor(
            tf.fill(tf.stack([rows, 1]), tf.constant(tokenizer.eos_id, tf.int32))
        )
        ids = tf.concat([ids[:, : length - 1], eos], axis=1)
    else:
        ids = ids[:, :length]
    return ids.to_tensor(default_value=0, shape=[None, length])


def shift_right_tf(targets: tf.Tensor) -> tf.Tensor:
    """Decoder inputs: each row's targets one position later, 0 (BOS) first."""
    return tf.pad(targets[:, :-1], [[0, 0], [1, 0]])


def padded_ids_np(vocabulary: Any, texts: Sequence[str], length: int, add_eos: bool) -> np.ndarray:
    """The Python twin of ``padded_ids_tf``, through the vocabulary's own ``encode``."""
    out = np.zeros((len(texts), length), np.int32)
    for row, text in enumerate(texts):
        ids = list(vocabulary.encode(text))
        ids = [*ids[: length - 1], int(vocabulary.eos_id)] if add_eos else ids[:length]
        out[row, : len(ids)] = ids
    return out


def shift_right_np(targets: np.ndarray) -> np.ndarray:
    return np.pad(targets[:, :-1], ((0, 0), (1, 0)))
