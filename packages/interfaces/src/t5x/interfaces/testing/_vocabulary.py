"""Conformance check for the Vocabulary contract."""

from __future__ import annotations

from collections.abc import Sequence

from t5x.interfaces._vocabulary import Vocabulary
from t5x.interfaces.testing._common import require, require_members

DEFAULT_TEXTS = ("", "hello world", "  two  spaces  ", "Grüße, 世界!", "a\nb\tc", "12345 67.8")


def check_vocabulary(
    vocab: Vocabulary, texts: Sequence[str] = DEFAULT_TEXTS, *, check_tf: bool = True
) -> None:
    """Checks ``vocab`` against the Vocabulary contract.

    Args:
      vocab: the vocabulary under test.
      texts: texts to encode; each must survive encode -> decode unchanged up to
        the vocabulary's own normalisation (checked as: decoding is stable,
        ``encode(decode(encode(t))) == encode(t)``).
      check_tf: also check that the tf.data methods agree with the Python ones.

    Raises:
      ConformanceError: naming the broken rule.
    """
    require_members(vocab, Vocabulary)
    size = vocab.vocab_size
    require(isinstance(size, int) and size > 0, f"vocab_size must be a positive int, got {size!r}")
    require(vocab.pad_id == 0, f"pad_id must be 0, got {vocab.pad_id!r}")
    require(
        isinstance(vocab.extra_ids, int) and 0 <= vocab.extra_ids < size,
        f"extra_ids must be an int in [0, vocab_size={size}), got {vocab.extra_ids!r}",
    )
    for name in ("eos_id", "unk_id"):
        value = getattr(vocab, name)
        require(value is None or 0 <= value < size, f"{name} must be None or in [0, {size}), got {value!r}")
    require(vocab == vocab, "a vocabulary must compare equal to itself")

    encoded = []
    for text in texts:
        ids = vocab.encode(text)
        require(isinstance(ids, list), f"encode({text!r}) must return a list, got {type(ids).__name__}")
        require(all(isinstance(i, int) for i in ids), f"encode({text!r}) must return ints, got {ids!r}")
        require(all(0 < i < size for i in ids), f"encode({text!r}) gave ids outside (0, {size}): {ids!r}")
        require(vocab.eos_id is None or vocab.eos_id not in ids, f"encode({text!r}) must not append EOS")
        decoded = vocab.decode(ids)
        require(isinstance(decoded, str), f"decode must return str, got {type(decoded).__name__}")
        require(
            vocab.encode(decoded) == ids, f"encode(decode(encode({text!r}))) differs from encode({text!r})"
        )
        if vocab.eos_id is not None and ids:
            cut = vocab.decode([*ids, vocab.eos_id, *ids])
            require(cut == decoded, f"decode must stop at EOS: got {cut!r}, expected {decoded!r}")
        encoded.append(ids)

    if check_tf:
        _check_tf(vocab, texts, encoded)


def _check_tf(vocab: Vocabulary, texts: Sequence[str], encoded: list[list[int]]) -> None:
    import tensorflow as tf  # only the tf path needs it

    for text, ids in zip(texts, encoded, strict=True):
        tf_ids = vocab.encode_tf(tf.constant(text))
        require(tf_ids.dtype == tf.int32, f"encode_tf must return int32, got {tf_ids.dtype}")
        require(
            tf_ids.numpy().tolist() == ids,
            f"encode_tf({text!r}) != encode: {tf_ids.numpy().tolist()} vs {ids}",
        )
        tf_text = vocab.decode_tf(tf.constant(ids, tf.int32)).numpy().decode("utf-8")
        require(
            tf_text == vocab.decode(ids), f"decode_tf({ids}) != decode: {tf_text!r} vs {vocab.decode(ids)!r}"
        )

    ds = tf.data.Dataset.from_tensor_slices(list(texts)).map(
        vocab.encode_tf, num_parallel_calls=tf.data.AUTOTUNE
    )
    got = [x.tolist() for x in ds.as_numpy_iterator()]
    require(got == encoded, "encode_tf inside tf.data Dataset.map disagrees with encode")
