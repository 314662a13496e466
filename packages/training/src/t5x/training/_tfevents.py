"""TensorBoard event files written without TensorFlow.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length,
payload, masked CRC-32C of the payload), each payload an ``Event`` protocol
buffer. Only the few fields TensorBoard needs for scalars and text are encoded.
"""

from __future__ import annotations

import struct

_CRC_TABLE: list[int] = []
for _byte in range(256):
    _crc = _byte
    for _ in range(8):
        _crc = (_crc >> 1) ^ 0x82F63B78 if _crc & 1 else _crc >> 1
    _CRC_TABLE.append(_crc)


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The CRC as TFRecord stores it (rotated and offset)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(payload: bytes) -> bytes:
    """Frames one record."""
    length = struct.pack("<Q", len(payload))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint((field << 3) | wire_type)


def _bytes_field(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _scalar_value(tag: str, value: float) -> bytes:
    return _bytes_field(1, tag.encode()) + _key(2, 5) + struct.pack("<f", value)


def _text_value(tag: str, text: str) -> bytes:
    plugin_data = _bytes_field(1, b"text")
    metadata = _bytes_field(1, plugin_data)
    dt_string = 7
    tensor = _key(1, 0) + _varint(dt_string) + _bytes_field(2, b"") + _bytes_field(8, text.encode())
    return _bytes_field(1, tag.encode()) + _bytes_field(9, metadata) + _bytes_field(8, tensor)


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    return _key(1, 1) + struct.pack("<d", wall_time) + _key(2, 0) + _varint(step) + body


def file_version_event(wall_time: float) -> bytes:
    """The first event of every file."""
    return _event(wall_time, 0, _bytes_field(3, b"brain.Event:2"))


def scalars_event(wall_time: float, step: int, scalars: dict[str, float]) -> bytes:
    """One Event whose Summary holds a ``simple_value`` per tag."""
    summary = b"".join(_bytes_field(1, _scalar_value(tag, value)) for tag, value in scalars.items())
    return _event(wall_time, step, _bytes_field(5, summary))


def texts_event(wall_time: float, step: int, texts: dict[str, str]) -> bytes:
    """One Event with a text-plugin string tensor per tag."""
    summary = b"".join(_bytes_field(1, _text_value(tag, text)) for tag, text in texts.items())
    return _event(wall_time, step, _bytes_field(5, summary))
