"""The wire-format ModelProto editor (_model_proto) against SentencePiece's generated protobuf module.

The reference is the route SentencePieceVocabulary took before: parse with
``sentencepiece_model_pb2``, add the pieces, ``MergeFrom`` the overrides,
serialize. Those comparisons skip only where that module cannot be imported (a
protobuf runtime older than the one it was generated for, as in Beam's env).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t5x.vocabularies import SentencePieceVocabulary
from t5x.vocabularies._model_proto import SCHEMAS, MalformedProto, edit_model_proto

from .corpora import generate_lines, train_sentencepiece

try:
    from sentencepiece import sentencepiece_model_pb2 as pb2
except Exception as e:  # protobuf's VersionError under an older runtime; ImportError without protobuf
    pb2 = None
    PB2_PROBLEM = f"{type(e).__name__}: {e}"
else:
    PB2_PROBLEM = ""

needs_pb2 = pytest.mark.skipif(
    pb2 is None, reason=f"sentencepiece_model_pb2 cannot be imported ({PB2_PROBLEM})"
)


def reference(model: bytes, pieces: list[str], overrides: bytes | None) -> bytes:
    """The generated-protobuf route: what the vocabulary produced before the wire editor."""
    proto = pb2.ModelProto.FromString(model)
    for piece in pieces:
        proto.pieces.add(piece=piece, score=0.0, type=pb2.ModelProto.SentencePiece.USER_DEFINED)
    if overrides is not None:
        spec = pb2.NormalizerSpec.FromString(overrides)
        proto.normalizer_spec.MergeFrom(spec)
        proto.denormalizer_spec.MergeFrom(spec)
    return proto.SerializeToString()


def sentinels(extra_ids: int, reverse: bool) -> list[str]:
    order = reversed(range(extra_ids)) if reverse else range(extra_ids)
    return [f"▁<extra_id_{k}>" for k in order]


@pytest.fixture(scope="module")
def bpe_model_file(tmp_path_factory) -> os.PathLike:
    """BPE with byte fallback, user-defined and control symbols, and a denormalizer spec."""
    directory = tmp_path_factory.mktemp("spm_bpe")
    rules = directory / "denormalize.tsv"
    rules.write_text("41\t61\n")  # 'A' -> 'a' on decode
    return train_sentencepiece(
        directory,
        "bpe",
        vocab_size=400,
        lines=generate_lines(4, 800),
        model_type="bpe",
        byte_fallback=True,
        user_defined_symbols=["<sep>"],
        control_symbols=["<cls>"],
        denormalization_rule_tsv=str(rules),
    )


# NormalizerSpec fields to override (None: no overrides).
OVERRIDES = {
    "none": None,
    "empty": {},
    "whitespace": {"remove_extra_whitespaces": False},
    "several": {
        "name": "identity",
        "add_dummy_prefix": False,
        "escape_whitespaces": True,
        "precompiled_charsmap": b"",
    },
}


# -- byte identity on trained models ------------------------------------------------------


@needs_pb2
@pytest.mark.parametrize("model_name", ["t5like", "bpe"])
@pytest.mark.parametrize("extra_ids", [0, 1, 100])
@pytest.mark.parametrize("reverse", [True, False])
@pytest.mark.parametrize("overrides_name", sorted(OVERRIDES))
def test_vocabulary_model_equals_pb2_route(
    sp_model_file, bpe_model_file, model_name, extra_ids, reverse, overrides_name
):
    path = sp_model_file if model_name == "t5like" else bpe_model_file
    fields = OVERRIDES[overrides_name]
    overrides = None if fields is None else pb2.NormalizerSpec(**fields)
    model = path.read_bytes()
    vocab = SentencePieceVocabulary(
        path, extra_ids=extra_ids, reverse_extra_ids=reverse, normalizer_spec_overrides=overrides
    )
    serialized = None if overrides is None else overrides.SerializeToString(deterministic=True)
    assert vocab.sp_model == reference(model, sentinels(extra_ids, reverse), serialized)
    # Overrides given as bytes make the same model.
    if serialized is not None:
        same = SentencePieceVocabulary.from_model_proto(
            model, extra_ids=extra_ids, reverse_extra_ids=reverse, normalizer_spec_overrides=serialized
        )
        assert same.sp_model == vocab.sp_model and same == vocab


@needs_pb2
def test_edited_model_loads_with_the_pieces_and_specs_protobuf_sees(bpe_model_file):
    overrides = pb2.NormalizerSpec(remove_extra_whitespaces=False, add_dummy_prefix=False)
    vocab = SentencePieceVocabulary(bpe_model_file, extra_ids=5, normalizer_spec_overrides=overrides)
    proto = pb2.ModelProto.FromString(vocab.sp_model)
    original = pb2.ModelProto.FromString(bpe_model_file.read_bytes())
    assert len(proto.pieces) == len(original.pieces) + 5 == vocab.vocab_size
    for i, piece in enumerate(proto.pieces):
        assert (vocab.tokenizer.IdToPiece(i), vocab.tokenizer.GetScore(i)) == (piece.piece, piece.score)
    assert [(p.piece, p.score, p.type) for p in proto.pieces[-5:]] == [
        (f"▁<extra_id_{k}>", 0.0, pb2.ModelProto.SentencePiece.USER_DEFINED) for k in (4, 3, 2, 1, 0)
    ]
    assert proto.trainer_spec == original.trainer_spec
    for spec, base in (
        (proto.normalizer_spec, original.normalizer_spec),
        (proto.denormalizer_spec, original.denormalizer_spec),
    ):
        assert not spec.add_dummy_prefix and not spec.remove_extra_whitespaces
        assert spec.precompiled_charsmap == base.precompiled_charsmap and spec.name == base.name
    assert vocab.decode(vocab.encode("Ab  c")) == "ab  c"  # the denormalizer still lowercases A


# -- generated input: non-canonical encodings, unknown fields, malformed bytes -------------


def varint(value: int, padding: int = 0) -> bytes:
    """``value`` as a varint, with ``padding`` redundant bytes (a non-canonical encoding)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    if padding:
        out[-1] |= 0x80
        out += b"\x80" * (padding - 1) + b"\x00"
    return bytes(out)


INTERESTING_VARINTS = [0, 1, 2, 3, 4, 5, 6, 7, 127, 128, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 1, 2**32 + 7]
INTERESTING_VARINTS += [2**63, 2**64 - 1, 2**64 - 7]


@st.composite
def padded_varint(draw, value: int, limit: int) -> bytes:
    """Mostly canonical; sometimes padded, up to ``limit`` bytes in all."""
    room = limit - len(varint(value))
    padding = draw(st.integers(0, room)) if room > 0 and draw(st.integers(0, 4)) == 0 else 0
    return varint(value, padding)


@st.composite
def field(draw, schema_name: str | None, depth: int) -> bytes:
    """One field of the named message (None: an unknown message): known or unknown, right or wrong wire type."""
    schema = SCHEMAS.get(schema_name or "", {})
    known = sorted(schema)
    if known and draw(st.integers(0, 3)) > 0:
        number = draw(st.sampled_from(known))
    else:
        # Field number 0 is malformed in a message, but protobuf lets it pass inside a group.
        numbers = [0, 4, 7, 9, 200, 2**29 - 1] if schema_name is None else [4, 7, 9, 200, 2**29 - 1]
        number = draw(st.sampled_from(numbers) | st.integers(1, 2**29 - 1))
    spec = schema.get(number)
    right = {"message": 2, "string": 2, "float": 5}.get(spec.kind, 0) if spec else None
    if right is None or draw(st.integers(0, 9)) == 0:
        wire_type = draw(st.sampled_from([0, 1, 2, 3, 5] if depth < 3 else [0, 1, 2, 5]))
    else:
        wire_type = right
    tag = draw(padded_varint(number << 3 | wire_type, 5))
    if wire_type == 0:
        value = draw(st.sampled_from(INTERESTING_VARINTS) | st.integers(0, 2**64 - 1))
        return tag + draw(padded_varint(value, 10))
    if wire_type == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wire_type == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    if wire_type == 3:
        body = b"".join(draw(st.lists(field(None, depth + 1), max_size=3)))
        return tag + body + varint(number << 3 | 4)
    if spec is not None and spec.kind == "message" and depth < 3:
        payload = draw(message(spec.message, depth + 1))
    elif draw(st.booleans()):
        payload = draw(st.binary(max_size=12))
    else:
        payload = "▁<extra_id_3>ä".encode()[: draw(st.integers(0, 18))]
    return tag + draw(padded_varint(len(payload), 5)) + payload


@st.composite
def message(draw, schema_name: str, depth: int = 0) -> bytes:
    return b"".join(draw(st.lists(field(schema_name, depth), max_size=6 if depth else 10)))


@st.composite
def edit_arguments(draw):
    pieces = draw(st.lists(st.sampled_from(["▁<extra_id_0>", "▁<extra_id_1>", "x", ""]), max_size=3))
    overrides = draw(st.none() | message("NormalizerSpec", 1))
    return pieces, overrides


def outcomes(model: bytes, pieces: list[str], overrides: bytes | None) -> tuple[object, object]:
    try:
        want: object = reference(model, pieces, overrides)
    except Exception as e:
        if type(e).__name__ != "DecodeError":  # google.protobuf.message.DecodeError
            raise
        want = "malformed"
    try:
        got: object = edit_model_proto(model, pieces, overrides)
    except MalformedProto:
        got = "malformed"
    return got, want


@needs_pb2
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message("ModelProto"), edit_arguments())
def test_generated_protos_equal_pb2_route(model, arguments):
    got, want = outcomes(model, *arguments)
    assert got == want


@needs_pb2
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message("ModelProto"), edit_arguments(), st.data())
def test_damaged_protos_fail_or_match_like_pb2(model, arguments, data):
    """Truncated or corrupted bytes: both routes reject, or both give the same model."""
    damage = data.draw(st.sampled_from(["truncate", "replace", "insert"]))
    position = data.draw(st.integers(0, len(model)))
    if damage == "truncate":
        model = model[:position]
    elif damage == "replace" and model:
        position = min(position, len(model) - 1)
        model = model[:position] + data.draw(st.binary(min_size=1, max_size=1)) + model[position + 1 :]
    else:
        model = model[:position] + data.draw(st.binary(min_size=1, max_size=3)) + model[position:]
    got, want = outcomes(model, *arguments)
    assert got == want


MALFORMED = {
    "truncated varint": b"\x08\x80",
    "varint of 11 bytes": b"\x48" + b"\xff" * 10 + b"\x01",
    "tag of 6 bytes": b"\x88\x80\x80\x80\x80\x00\x01",
    "tag over 32 bits": b"\xf8\xff\xff\xff\x7f\x00",
    "field number 0": b"\x00\x01",
    "field number 0 in a normalizer spec": b"\x1a\x02\x00\x00",
    "end-group of field 0 inside a group": b"\x23\x04\x24",
    "wire type 6": b"\x0e",
    "wire type 7": b"\x0f",
    "end-group outside a group": b"\x4c",
    "unterminated group": b"\x4b\x08\x01",
    "mismatched group": b"\x4b\x54",
    "length past the end": b"\x0a\x05abc",
    "length of 6 bytes": b"\x22\x81\x80\x80\x80\x80\x00a",
    "truncated fixed32": b"\x4d\x00\x00",
    "truncated fixed64": b"\x49" + b"\x00" * 7,
    "bad piece": b"\x0a\x02\x0a\x05",
    "bad normalizer spec": b"\x1a\x01\x80",
    "bad trainer spec": b"\x12\x02\x0e\x00",
    "groups 101 deep": b"\x4b" * 101 + b"\x4c" * 101,
    "groups 100 deep in a normalizer spec": b"\x1a\xc8\x01" + b"\x4b" * 100 + b"\x4c" * 100,
}
WELL_FORMED = {
    "empty": b"",
    "groups 100 deep": b"\x4b" * 100 + b"\x4c" * 100,
    "groups 99 deep in a normalizer spec": b"\x1a\xc6\x01" + b"\x4b" * 99 + b"\x4c" * 99,
    "unknown self_test_data after the specs": b"\x22\x00\x2a\x00\x1a\x00\x0a\x00",
    "padded tag of 5 bytes": b"\x8a\x80\x80\x80\x00\x00",
    "varint of 10 bytes": b"\x48" + b"\xff" * 9 + b"\x01",
    "field number 0 inside a group": b"\x23\x00\x00\x03\x02\x00\x04\x24",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_bytes_are_rejected(name):
    with pytest.raises(MalformedProto):
        edit_model_proto(MALFORMED[name], ["▁<extra_id_0>"], None)
    if pb2 is not None:
        assert outcomes(MALFORMED[name], ["▁<extra_id_0>"], None) == ("malformed", "malformed")


def test_overrides_get_the_full_depth():
    # MergeFrom parses the overrides as a message of their own, not nested in the model.
    overrides = b"\x4b" * 100 + b"\x4c" * 100
    edited = edit_model_proto(b"", [], overrides)
    if pb2 is not None:
        assert edited == reference(b"", [], overrides)
    with pytest.raises(MalformedProto):
        edit_model_proto(b"", [], b"\x4b" * 101 + b"\x4c" * 101)


@pytest.mark.parametrize("name", sorted(WELL_FORMED))
def test_edge_cases_that_protobuf_accepts(name):
    edited = edit_model_proto(WELL_FORMED[name], ["▁<extra_id_0>"], b"\x20\x00")
    if pb2 is not None:
        assert edited == reference(WELL_FORMED[name], ["▁<extra_id_0>"], b"\x20\x00")


def test_self_test_data_moves_after_denormalizer_spec():
    # SentencePiece's Python module has no ModelProto field 4: it stays, as an unknown field, at the end.
    edited = edit_model_proto(b"\x0a\x00\x22\x02\x0a\x00\x2a\x00", [], None)
    assert edited == b"\x0a\x00\x2a\x00\x22\x02\x0a\x00"


def test_malformed_overrides_are_rejected(sp_model_file):
    with pytest.raises(MalformedProto):
        edit_model_proto(sp_model_file.read_bytes(), [], b"\x20")
    with pytest.raises(
        ValueError, match="normalizer_spec_overrides is not a valid serialized NormalizerSpec"
    ):
        SentencePieceVocabulary(sp_model_file, normalizer_spec_overrides=b"\x20")


@needs_pb2
def test_schema_matches_sentencepiece_model_pb2():
    """The field table here is the one SentencePiece's generated module was built from."""
    kinds = {
        "TYPE_INT32": "int32",
        "TYPE_UINT64": "uint64",
        "TYPE_BOOL": "bool",
        "TYPE_ENUM": "enum",
        "TYPE_FLOAT": "float",
        "TYPE_STRING": "string",
        "TYPE_BYTES": "string",
        "TYPE_MESSAGE": "message",
    }
    any_field = pb2.ModelProto.DESCRIPTOR.fields[0]
    type_names = {getattr(any_field, name): name for name in kinds}
    descriptors = {
        "ModelProto": pb2.ModelProto.DESCRIPTOR,
        "ModelProto.SentencePiece": pb2.ModelProto.SentencePiece.DESCRIPTOR,
        "NormalizerSpec": pb2.NormalizerSpec.DESCRIPTOR,
        "TrainerSpec": pb2.TrainerSpec.DESCRIPTOR,
    }
    assert set(SCHEMAS) == set(descriptors)
    for name, descriptor in descriptors.items():
        expected = {}
        for f in descriptor.fields:
            entry = (kinds[type_names[f.type]], f.is_repeated)
            if f.enum_type is not None:
                entry += (frozenset(v.number for v in f.enum_type.values),)
            if f.message_type is not None:
                entry += (f.message_type.full_name.removeprefix("sentencepiece."),)
            expected[f.number] = entry
        actual = {}
        for number, spec in SCHEMAS[name].items():
            entry = (spec.kind, spec.repeated)
            if spec.kind == "enum":
                entry += (spec.enum_values,)
            if spec.kind == "message":
                entry += (spec.message,)
            actual[number] = entry
        assert actual == expected, name


# -- no protobuf at all ---------------------------------------------------------------------

NO_PROTOBUF = textwrap.dedent(
    """
    import importlib.abc
    import sys

    assert not any(m == "google.protobuf" or m.startswith("google.protobuf.") for m in sys.modules)


    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.startswith("google.protobuf") or name == "sentencepiece.sentencepiece_model_pb2":
                raise ImportError(f"{name} is blocked in this test")
            return None


    sys.meta_path.insert(0, Blocker())
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("the blocker does not work")

    from t5x.vocabularies import SentencePieceVocabulary

    # remove_extra_whitespaces=False, serialized by hand: field 4, varint 0.
    vocab = SentencePieceVocabulary(sys.argv[1], extra_ids=100, normalizer_spec_overrides=b"\\x20\\x00")
    plain = SentencePieceVocabulary(sys.argv[1])
    assert vocab.vocab_size == plain.vocab_size + 100
    text = "abc  <extra_id_0> def <extra_id_99>"
    ids = vocab.encode(text)
    assert ids[-1] == vocab.vocab_size - 100 and vocab.vocab_size - 1 in ids, ids
    assert vocab.decode(ids) == text
    assert vocab.decode([vocab.vocab_size - 1 - k for k in range(3)]) == "<extra_id_0> <extra_id_1> <extra_id_2>"
    assert not any(m.startswith("google.protobuf") for m in sys.modules)
    print("no protobuf: ok")
    """
)


def test_sentinels_and_overrides_need_no_protobuf(sp_model_file, tmp_path):
    script = tmp_path / "no_protobuf.py"
    script.write_text(NO_PROTOBUF)
    result = subprocess.run(
        [sys.executable, str(script), str(sp_model_file)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no protobuf: ok" in result.stdout
