"""TF Serving warm-up records (``PredictionLog``s of predict requests), written without tensorflow-serving-api."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _message_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (a string, bytes or sub-message)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def prediction_log(model_name: str, signature_name: str, input_name: str, tensor_proto: bytes) -> bytes:
    """TF Serving's ``PredictionLog`` holding one ``PredictRequest``, encoded by field number.

    ``PredictionLog.predict_log`` (6) -> ``PredictLog.request`` (1) ->
    ``PredictRequest{model_spec (1): ModelSpec{name (1), signature_name (3)},
    inputs (2): map entry{key (1), value (2): TensorProto}}``.
    """
    spec = _message_field(1, model_name.encode()) + _message_field(3, signature_name.encode())
    entry = _message_field(1, input_name.encode()) + _message_field(2, tensor_proto)
    request = _message_field(1, spec) + _message_field(2, entry)
    return _message_field(6, _message_field(1, request))


WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def write_warmup_requests(
    path: str,
    batches: Sequence[Sequence[Any]],
    batch_sizes: Sequence[int | None],
    model_name: str,
    signature_name: str,
    input_name: str,
) -> None:
    """Writes TF Serving warm-up requests for a SavedModel to ``path`` (its ``WARMUP_FILE``).

    One record per batch and batch size: the batch repeated or cut to the size
    (None: as it is); strings go in as ``tf.string``, ids as ``tf.int32``.
    """
    import tensorflow as tf

    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for batch in batches:
            rows = list(batch)
            dtype = tf.string if rows and isinstance(rows[0], str | bytes) else tf.int32
            for size in batch_sizes:
                sized = rows if size is None else list(itertools.islice(itertools.cycle(rows), size))
                tensor = tf.make_tensor_proto(sized, dtype=dtype).SerializeToString()
                writer.write(prediction_log(model_name, signature_name, input_name, tensor))
