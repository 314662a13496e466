"""Edits a serialized SentencePiece ``ModelProto`` on the protobuf wire format, without protobuf.

SentencePiece's Python package ships generated protobuf code that only imports
under the protobuf runtime it was generated for, and Apache Beam pins an older
one. Adding sentinel pieces and merging normalizer overrides only needs the wire
format, so this module reads and writes it directly.

The output is what protobuf's own Python runtime (upb) gives for
``ModelProto.FromString(model)``, the edits, then ``SerializeToString()``, byte
for byte (the tests compare the two on trained models and on generated
malformed and non-canonical input):

* fields known to the schema below are written in field-number order, each
  scalar once (the last occurrence wins, re-encoded canonically: an ``int32``
  sign-extended to ten bytes, a ``bool`` as 0 or 1, varints in their shortest
  form), repeated fields in order, every occurrence of a singular message merged
  into one;
* everything else (unknown field numbers, a known number with the wrong wire
  type, an enum value outside its enum) is kept byte for byte, in input order,
  after the known fields of its message;
* input protobuf rejects (truncated data, field number 0 outside groups, wire types 6 and 7,
  unbalanced groups, tags or lengths longer than 5 bytes, other varints longer
  than 10, nesting deeper than 100) raises ``MalformedProto``.

The schema is the one in the ``sentencepiece_model_pb2`` module SentencePiece
ships; it has no ``self_test_data`` (``ModelProto`` field 4, a C++-only field),
so such a field stays unknown and moves after ``denormalizer_spec``, as it does
through that module.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["MalformedProto", "edit_model_proto", "check_normalizer_spec"]

_VARINT, _I64, _LEN, _START_GROUP, _END_GROUP, _I32 = range(6)
_PIECE_RUN = -1  # not a wire type: see _fields
_MASK64 = (1 << 64) - 1
# protobuf's default nesting limit: groups nest up to 100 deep in the outer message,
# one level less in each message inside it.
_DEPTH_LIMIT = 100


class MalformedProto(ValueError):
    """The bytes are not a well-formed protobuf message."""


# -- reading ------------------------------------------------------------------------------


def _varint(buf: bytes, pos: int, end: int, max_bytes: int, what: str) -> tuple[int, int]:
    """Reads a varint at ``pos``; returns (value mod 2**64, position after it)."""
    if pos >= end:
        raise MalformedProto(f"{what} at byte {pos} runs past the end of its message")
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    start, value, shift = pos, byte & 0x7F, 7
    pos += 1
    while True:
        if pos >= end:
            raise MalformedProto(f"{what} at byte {start} runs past the end of its message")
        if pos - start >= max_bytes:
            raise MalformedProto(f"{what} at byte {start} is longer than {max_bytes} bytes")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _MASK64, pos
        shift += 7


class _Field(NamedTuple):
    number: int
    wire_type: int
    start: int  # the tag's first byte
    value: int  # a varint's value; otherwise where the payload (or group body) starts
    end: int  # just past the payload (past the end-group tag for a group)


def _tag(buf: bytes, pos: int, end: int, in_group: bool = False) -> tuple[int, int, int]:
    tag, after = _varint(buf, pos, end, 5, "field tag")
    if tag > 0xFFFFFFFF:
        raise MalformedProto(f"field tag at byte {pos} does not fit 32 bits")
    if tag >> 3 == 0 and not in_group:  # protobuf lets field number 0 pass inside unknown groups
        raise MalformedProto(f"field tag at byte {pos} has field number 0")
    return tag >> 3, tag & 7, after


def _fixed(pos: int, size: int, end: int, start: int) -> int:
    if pos + size > end:
        raise MalformedProto(f"field at byte {start} runs past the end of its message")
    return pos + size


def _length_delimited(buf: bytes, pos: int, end: int, start: int) -> tuple[int, int]:
    size, pos = _varint(buf, pos, end, 5, "length")
    if size > end - pos:
        raise MalformedProto(
            f"field at byte {start} is longer ({size} bytes) than what is left of its message"
        )
    return pos, pos + size


def _skip_group(buf: bytes, pos: int, end: int, number: int, depth: int, start: int) -> int:
    """Returns the position after the end-group tag that closes group ``number``."""
    if depth < 0:
        raise MalformedProto(f"group at byte {start} is nested more than {_DEPTH_LIMIT} levels deep")
    while pos < end:
        field_start = pos
        inner, wire_type, pos = _tag(buf, pos, end, in_group=True)
        if wire_type == _END_GROUP:
            if inner != number:
                raise MalformedProto(
                    f"end-group tag at byte {field_start} closes field {inner}, expected {number}"
                )
            return pos
        pos = _skip_value(buf, pos, end, inner, wire_type, depth, field_start)
    raise MalformedProto(f"group at byte {start} has no end-group tag")


def _skip_value(buf: bytes, pos: int, end: int, number: int, wire_type: int, depth: int, start: int) -> int:
    if wire_type == _VARINT:
        return _varint(buf, pos, end, 10, "varint")[1]
    if wire_type == _I64:
        return _fixed(pos, 8, end, start)
    if wire_type == _LEN:
        return _length_delimited(buf, pos, end, start)[1]
    if wire_type == _I32:
        return _fixed(pos, 4, end, start)
    if wire_type == _START_GROUP:
        return _skip_group(buf, pos, end, number, depth - 1, start)
    if wire_type == _END_GROUP:
        raise MalformedProto(f"end-group tag at byte {start} outside any group")
    raise MalformedProto(f"field at byte {start} has wire type {wire_type}, which does not exist")


def _fields(buf: bytes, start: int, end: int, depth: int, piece_runs: bool = False) -> list[_Field]:
    """Splits ``buf[start:end]`` into its top-level fields, checking the framing.

    With ``piece_runs`` (a ``ModelProto``), a run of ``pieces`` records that
    protobuf would write unchanged comes back as one pseudo-field of wire type
    ``_PIECE_RUN`` spanning them all: a model's pieces are nearly all of it.
    """
    fields = []
    pos = start
    while pos < end:
        if piece_runs:
            stop = _piece_run_end(buf, pos, end)
            if stop > pos:
                fields.append(_Field(1, _PIECE_RUN, pos, pos, stop))
                pos = stop
                continue
        field_start = pos
        number, wire_type, pos = _tag(buf, pos, end)
        if wire_type == _VARINT:
            value, pos = _varint(buf, pos, end, 10, "varint")
        elif wire_type == _LEN:
            value, pos = _length_delimited(buf, pos, end, field_start)
        else:
            value = pos
            pos = _skip_value(buf, pos, end, number, wire_type, depth, field_start)
        fields.append(_Field(number, wire_type, field_start, value, pos))
    return fields


# -- writing ------------------------------------------------------------------------------


def _encode_varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_record(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(payload)) + payload


def _int32(value: int) -> int:
    """The int32 a varint holds (its low 32 bits, signed)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


# -- schema -------------------------------------------------------------------------------

# Kinds of field, each with its wire type.
_INT32, _UINT64, _BOOL, _ENUM, _FLOAT, _STRING, _MESSAGE = (
    "int32",
    "uint64",
    "bool",
    "enum",
    "float",
    "string",
    "message",
)
_WIRE_TYPE = {
    _INT32: _VARINT,
    _UINT64: _VARINT,
    _BOOL: _VARINT,
    _ENUM: _VARINT,
    _FLOAT: _I32,
    _STRING: _LEN,
    _MESSAGE: _LEN,
}


class _Spec(NamedTuple):
    kind: str
    repeated: bool = False
    enum_values: frozenset[int] = frozenset()  # for _ENUM
    message: str = ""  # for _MESSAGE: the schema's name in SCHEMAS


def _specs(kind: str, numbers: Sequence[int], **options) -> dict[int, _Spec]:
    return {number: _Spec(kind, **options) for number in numbers}


# The messages of sentencepiece_model.proto as SentencePiece's Python module knows
# them: {field number: spec}. (`bytes` fields are written like `string` ones.)
SCHEMAS: dict[str, dict[int, _Spec]] = {
    "ModelProto": {
        1: _Spec(_MESSAGE, repeated=True, message="ModelProto.SentencePiece"),
        2: _Spec(_MESSAGE, message="TrainerSpec"),
        3: _Spec(_MESSAGE, message="NormalizerSpec"),
        5: _Spec(_MESSAGE, message="NormalizerSpec"),
    },
    "ModelProto.SentencePiece": {
        1: _Spec(_STRING),  # piece
        2: _Spec(_FLOAT),  # score
        # NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE
        3: _Spec(_ENUM, enum_values=frozenset(range(1, 7))),
    },
    "NormalizerSpec": {
        **_specs(_STRING, (1, 2, 6)),  # name, precompiled_charsmap (bytes), normalization_rule_tsv
        **_specs(_BOOL, (3, 4, 5)),  # add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces
    },
    "TrainerSpec": {
        **_specs(_STRING, (1, 5, 30, 31), repeated=True),
        **_specs(_STRING, (2, 7, 36, 44, 45, 46, 47, 48, 53, 54)),
        3: _Spec(_ENUM, enum_values=frozenset(range(1, 5))),  # model_type
        **_specs(_INT32, (4, 6, 12, 13, 14, 16, 17, 18, 20, 40, 41, 42, 43)),
        **_specs(_FLOAT, (10, 15, 51)),
        **_specs(_UINT64, (11, 52)),
        **_specs(_BOOL, (19, 21, 22, 23, 24, 25, 26, 32, 33, 34, 35, 49, 50, 55)),
    },
}
_USER_DEFINED = 4


def _piece_run_end(buf: bytes, pos: int, end: int) -> int:
    """Where the run of ``ModelProto.pieces`` records at ``pos`` that protobuf would write unchanged ends.

    A quick check of the usual shape only: tag ``0x0A`` and a one-byte length,
    then in the payload a piece shorter than 128 bytes, a score, a valid type,
    each at most once and in order. Anything else stops the run and takes the
    general path, which also reports malformed input.
    """
    while pos + 1 < end and buf[pos] == 0x0A and buf[pos + 1] < 0x80:
        i = pos + 2
        stop = i + buf[pos + 1]
        if stop > end:
            break
        if i < stop and buf[i] == 0x0A:  # piece
            if i + 1 >= stop or buf[i + 1] >= 0x80:
                break
            i += 2 + buf[i + 1]
        if i < stop and buf[i] == 0x15:  # score
            i += 5
        if i < stop and buf[i] == 0x18:  # type
            if i + 1 >= stop or not 1 <= buf[i + 1] <= 6:
                break
            i += 2
        if i != stop:
            break
        pos = stop
    return pos


# A message payload, buf[start:end], and how deep groups may still nest in it.
_Chunk = tuple[bytes, int, int, int]


def _canonical(chunks: Sequence[_Chunk], schema_name: str, additions: dict[int, list] | None = None) -> bytes:
    """Parses the chunks as one message (later ones merge into earlier) and writes it canonically.

    ``additions`` appends to fields after parsing: canonical records (tag
    included) for a repeated message field, chunks to merge for a singular one.
    """
    schema = SCHEMAS[schema_name]
    values: dict[int, list] = {}
    unknown: list[bytes] = []
    for buf, start, end, depth in chunks:
        for field in _fields(buf, start, end, depth, piece_runs=schema_name == "ModelProto"):
            if field.wire_type == _PIECE_RUN:
                values.setdefault(1, []).append(buf[field.start : field.end])
                continue
            spec = schema.get(field.number)
            if spec is None or _WIRE_TYPE[spec.kind] != field.wire_type:
                unknown.append(buf[field.start : field.end])
                continue
            kind = spec.kind
            value: object
            if kind == _MESSAGE:
                if spec.repeated:  # kept as whole records, tag included
                    payload = _canonical([(buf, field.value, field.end, depth - 1)], spec.message)
                    value = _len_record(field.number, payload)
                else:
                    value = (buf, field.value, field.end, depth - 1)  # merged when written
            elif kind in (_STRING, _FLOAT):
                value = buf[field.value : field.end]
            elif kind == _ENUM:
                value = _int32(field.value)
                if value not in spec.enum_values:
                    unknown.append(buf[field.start : field.end])
                    continue
            else:
                value = field.value
            if spec.repeated or kind == _MESSAGE:
                values.setdefault(field.number, []).append(value)
            else:
                values[field.number] = [value]
    for number, extra in (additions or {}).items():
        values.setdefault(number, []).extend(extra)

    out: list[bytes] = []
    for number in sorted(values):
        spec = schema[number]
        tag = _encode_varint(number << 3 | _WIRE_TYPE[spec.kind])
        kind = spec.kind
        items = values[number]
        if kind == _MESSAGE and not spec.repeated:
            items = [_canonical(items, spec.message)]
        if kind == _MESSAGE and spec.repeated:
            out.extend(items)
            continue
        for item in items:
            out.append(tag)
            if kind in (_STRING, _MESSAGE):
                out.append(_encode_varint(len(item)))
                out.append(item)
            elif kind == _FLOAT:
                out.append(item)
            elif kind == _BOOL:
                out.append(b"\x01" if item else b"\x00")
            elif kind == _UINT64:
                out.append(_encode_varint(item))
            else:  # int32 and enums: negative values sign-extended to 64 bits
                out.append(_encode_varint(_int32(item) & _MASK64))
    out.extend(unknown)
    return b"".join(out)


# -- the edits ----------------------------------------------------------------------------


def _user_defined_piece(piece: str) -> bytes:
    """A ``ModelProto.pieces`` record: piece, score 0.0 (written: it is set), type USER_DEFINED."""
    text = piece.encode("utf-8")
    payload = _len_record(1, text) + b"\x15" + struct.pack("<f", 0.0) + bytes((0x18, _USER_DEFINED))
    return _len_record(1, payload)


def check_normalizer_spec(spec: bytes) -> None:
    """Raises ``MalformedProto`` unless ``spec`` parses as a ``NormalizerSpec``."""
    _canonical([(spec, 0, len(spec), _DEPTH_LIMIT)], "NormalizerSpec")


def edit_model_proto(
    model: bytes, user_defined_pieces: Sequence[str], normalizer_overrides: bytes | None
) -> bytes:
    """Appends user-defined pieces (score 0) and merges a ``NormalizerSpec`` into both specs.

    Args:
      model: a serialized ``ModelProto`` (a ``.model`` file's bytes).
      user_defined_pieces: piece texts to append after the model's pieces, in order.
      normalizer_overrides: a serialized ``NormalizerSpec`` merged into the
        model's ``normalizer_spec`` and ``denormalizer_spec`` (set fields replace
        the model's; both specs are created if missing), or None.

    Returns:
      the serialized edited ``ModelProto`` (see the module docstring for its layout).

    Raises:
      MalformedProto: ``model`` or ``normalizer_overrides`` is not well-formed.
    """
    additions: dict[int, list] = {}
    if user_defined_pieces:
        additions[1] = [_user_defined_piece(p) for p in user_defined_pieces]
    if normalizer_overrides is not None:
        check_normalizer_spec(normalizer_overrides)
        # Parsed on its own, as protobuf's MergeFrom does: its groups get the full depth.
        chunk = (normalizer_overrides, 0, len(normalizer_overrides), _DEPTH_LIMIT)
        additions[3] = [chunk]
        additions[5] = [chunk]
    return _canonical([(model, 0, len(model), _DEPTH_LIMIT)], "ModelProto", additions)
