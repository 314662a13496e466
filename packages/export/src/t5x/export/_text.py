"""Tokenization inside the serving graph.

A SavedModel must hold its tokenizer as TensorFlow ops: a ``tf.numpy_function``
(what the SentencePiece and Hugging Face vocabularies' ``encode_tf`` run) calls back
into Python and is not saved. A vocabulary whose ``encode_tf`` / ``decode_tf``
trace to graph ops only (the byte and pass-through vocabularies) is used as it is;
SentencePiece runs tensorflow-text's SentencePiece op on the same model proto,
sentinels included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from t5x.export._errors import ExportError
from t5x.vocabularies import SentencePieceVocabulary

# Graph ops that call back into the exporting Python process.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


@dataclasses.dataclass(frozen=True)
class GraphTokenizer:
    """A vocabulary's text <-> ids as graph ops.

    Attributes:
      encode: ``[batch]`` strings -> ragged ``[batch, (ids)]`` int32, no EOS added.
      decode: ``[batch, length]`` int ids -> ``[batch]`` strings (cut at EOS, padding dropped).
      eos_id: the vocabulary's EOS id.
      load_imports: modules a loader must import before ``tf.saved_model.load``.
      resources: objects the SavedModel must track for the ops to work.
    """

    encode: Callable[[tf.Tensor], tf.RaggedTensor]
    decode: Callable[[tf.Tensor], tf.Tensor]
    eos_id: int
    load_imports: tuple[str, ...] = ()
    resources: tuple[Any, ...] = ()


def _python_ops(fn: Callable[[tf.Tensor], Any], spec: tf.TensorSpec) -> set[str]:
    graph = tf.function(fn, input_signature=[spec], autograph=False).get_concrete_function().graph
    found = {op.type for op in graph.get_operations() if op.type in _PYTHON_OPS}
    for inner in getattr(graph, "_functions", {}).values():  # tf.map_fn / while bodies
        found |= {node.op for node in inner.definition.node_def if node.op in _PYTHON_OPS}
    return found


def _ragged_int32(ids: Any) -> tf.RaggedTensor:
    if not isinstance(ids, tf.RaggedTensor):
        ids = tf.RaggedTensor.from_tensor(ids)
    return tf.cast(ids, tf.int32)


def _as_is(vocabulary: Any, feature: str) -> GraphTokenizer | None:
    """The vocabulary's own tf methods, when they trace to graph ops only."""
    strings, ids = tf.TensorSpec([None], tf.string), tf.TensorSpec([None, None], tf.int32)
    try:
        called_back = _python_ops(vocabulary.encode_tf, strings) | _python_ops(vocabulary.decode_tf, ids)
    except (AttributeError, NotImplementedError, TypeError) as error:
        raise ExportError(
            f"an export with no serving signature possible: the {feature} vocabulary "
            f"{vocabulary!r} has no usable encode_tf/decode_tf ({error})"
        ) from error
    if called_back:
        return None
    return GraphTokenizer(
        encode=lambda texts: _ragged_int32(vocabulary.encode_tf(texts)),
        decode=vocabulary.decode_tf,
        eos_id=int(vocabulary.eos_id),
    )


def _sentencepiece(vocabulary: Any, feature: str) -> GraphTokenizer:
    try:
        import tensorflow_text
    except ImportError as error:
        raise ExportError(
            f"an export with no serving signature possible: the {feature} vocabulary is SentencePiece, "
            "which tokenizes in the graph with tensorflow-text's op; install it (pip install "
            "'t5x-export[sentencepiece]', the same minor version as tensorflow)"
        ) from error
    tokenizer = tensorflow_text.SentencepieceTokenizer(model=vocabulary.sp_model, out_type=tf.int32)
    eos_id, unk_id, size = int(vocabulary.eos_id), int(vocabulary.unk_id), int(vocabulary.vocab_size)

    def decode(ids: tf.Tensor) -> tf.Tensor:
        ids = tf.cast(ids, tf.int32)
        # The Python vocabulary's rules: cut at the first EOS, drop padding, ids outside -> UNK.
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, eos_id), tf.int32), axis=-1), 0)
        ids = tf.where((ids < 0) | (ids >= size), unk_id, ids)
        return tokenizer.detokenize(tf.ragged.boolean_mask(ids, before_eos & tf.not_equal(ids, 0)))

    return GraphTokenizer(
        encode=lambda texts: tokenizer.tokenize(texts),
        decode=decode,
        eos_id=eos_id,
        load_imports=("tensorflow_text",),
        resources=(tokenizer,),
    )


def graph_tokenizer(vocabulary: Any, feature: str) -> GraphTokenizer:
    """The in-graph tokenizer for ``vocabulary`` (the model's ``feature`` vocabulary).

    Raises:
      ExportError: no graph-only tokenizer exists for this vocabulary (it names the fix).
    """
    if vocabulary is None:
        raise ExportError(
            f"an export with no serving signature possible: the model has no {feature} vocabulary "
            f"(set the model's {feature}_vocabulary, or pass {feature}_vocabulary= to export_saved_model)"
        )
    if vocabulary.eos_id is None:
        raise ExportError(
            f"an export with no serving signature possible: the {feature} vocabulary {vocabulary!r} has no "
            "EOS id, which the serving graph appends to inputs and cuts decodes at"
        )
    if isinstance(vocabulary, SentencePieceVocabulary):
        return _sentencepiece(vocabulary, feature)
    tokenizer = _as_is(vocabulary, feature)
    if tokenizer is None:
        raise ExportError(
            f"an export with no serving signature possible: the {feature} vocabulary {vocabulary!r} "
            "tokenizes through a Python callback (tf.numpy_function), which a SavedModel cannot hold; "
            "exportable vocabularies: ByteVocabulary, PassThroughVocabulary, SentencePieceVocabulary "
            "(with tensorflow-text)"
        )
    return tokenizer
