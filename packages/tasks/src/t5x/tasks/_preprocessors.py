"""General preprocessors: rekey, tokenize, EOS handling, translate / summarize."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from t5x.tasks._feature import Feature
from t5x.tasks._lazy_tf import tf
from t5x.tasks._utils import AUTOTUNE, map_over_dataset

OutputFeatures = Mapping[str, Feature]
TOKENIZE_BATCH_SIZE = 64

# English names of common language codes, for `translate` prompts (the T5
# library looks them up with babel; a table keeps this package dependency free).
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "et": "Estonian", "fi": "Finnish", "fr": "French", "gu": "Gujarati", "hi": "Hindi",
    "it": "Italian", "ja": "Japanese", "kk": "Kazakh", "ko": "Korean", "lt": "Lithuanian",
    "lv": "Latvian", "my": "Burmese", "ne": "Nepali", "nl": "Dutch", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "si": "Sinhala", "tr": "Turkish", "vi": "Vietnamese",
    "zh": "Chinese",
}  # fmt: skip


@map_over_dataset
def rekey(x: Mapping[str, Any], key_map: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """Renames features: ``{new_key: old_key}``; an empty/None old key gives ``""``.

    Called on a dataset: ``functools.partial(rekey, key_map={...})`` is a
    preprocessor. Features not named as an old key are dropped.
    """
    if not key_map:
        return dict(x)
    missing = [old for old in key_map.values() if old and old not in x]
    if missing:
        raise KeyError(f"rekey: features {missing} are not in the example; it has {sorted(x)}")
    return {new: x[old] if old else tf.constant("") for new, old in key_map.items()}


def _append_eos_to_last_axis(value: Any, eos_id: int) -> Any:
    if isinstance(value, tf.RaggedTensor):
        if value.shape.rank > 2:
            return value.with_values(_append_eos_to_last_axis(value.values, eos_id))
        return tf.concat([value, tf.fill([value.nrows(), 1], tf.cast(eos_id, value.dtype))], axis=1)
    paddings = tf.concat([tf.zeros([tf.rank(value) - 1, 2], tf.int32), [[0, 1]]], axis=0)
    return tf.pad(value, paddings, constant_values=tf.cast(eos_id, value.dtype))


def _eos_id(key: str, feature: Feature) -> int:
    eos = feature.vocabulary.eos_id
    if eos is None:
        raise ValueError(f"feature {key!r} has add_eos=True but its vocabulary has no eos_id")
    return eos


def tokenize_example(
    features: Mapping[str, Any],
    output_features: OutputFeatures,
    copy_pretokenized: bool = True,
    with_eos: bool = False,
) -> dict[str, Any]:
    """Encodes each string feature named in ``output_features`` with its vocabulary.

    Args:
      features: one example.
      output_features: feature name -> Feature.
      copy_pretokenized: keep the text as ``<name>_pretokenized``.
      with_eos: append EOS to features whose Feature has ``add_eos``.

    Returns:
      the example with token ids (int32, ``[length]`` for a scalar string).
    """
    out: dict[str, Any] = {}
    for key, value in features.items():
        feature = output_features.get(key)
        if feature is not None and value.dtype == tf.string:
            if copy_pretokenized:
                out[f"{key}_pretokenized"] = value
            value = feature.vocabulary.encode_tf(value)
            if with_eos and feature.add_eos:
                value = _append_eos_to_last_axis(value, _eos_id(key, feature))
        out[key] = value
    return out


def tokenize(
    dataset: tf.data.Dataset,
    output_features: OutputFeatures,
    copy_pretokenized: bool = True,
    with_eos: bool = False,
) -> tf.data.Dataset:
    """Tokenizes the string features named in ``output_features`` (seqio's ``tokenize``).

    Scalar strings are encoded ``TOKENIZE_BATCH_SIZE`` examples at a time (one
    vocabulary call per batch, far cheaper for Python-backed tokenizers); the
    result is the same as encoding each example alone.
    """
    spec = dataset.element_spec
    scalar_text = all(
        spec[k].shape.rank == 0 for k in output_features if k in spec and spec[k].dtype == tf.string
    )
    if not scalar_text:
        return dataset.map(
            lambda x: tokenize_example(x, output_features, copy_pretokenized, with_eos),
            num_parallel_calls=AUTOTUNE,
        )
    batched = dataset.ragged_batch(TOKENIZE_BATCH_SIZE).map(
        lambda x: tokenize_example(x, output_features, copy_pretokenized, with_eos),
        num_parallel_calls=AUTOTUNE,
    )
    return batched.unbatch().map(_as_dense)


def _as_dense(x: Mapping[str, Any]) -> dict[str, Any]:
    # Unbatched rows of ragged batches are typed ragged with ragged_rank 0; a
    # map hands them over as plain tensors, which downstream code expects.
    return {k: v.to_tensor() if isinstance(v, tf.RaggedTensor) else v for k, v in x.items()}


def tokenize_and_append_eos(
    dataset: tf.data.Dataset, output_features: OutputFeatures, copy_pretokenized: bool = True
) -> tf.data.Dataset:
    """``tokenize`` then EOS on the features whose Feature has ``add_eos``."""
    return tokenize(dataset, output_features, copy_pretokenized, with_eos=True)


def append_eos(dataset: tf.data.Dataset, output_features: OutputFeatures) -> tf.data.Dataset:
    """Appends EOS to every feature whose Feature has ``add_eos`` (no trimming)."""

    def fn(x: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(x)
        for key, value in x.items():
            feature = output_features.get(key)
            if feature is not None and feature.add_eos:
                out[key] = _append_eos_to_last_axis(value, _eos_id(key, feature))
        return out

    return dataset.map(fn, num_parallel_calls=AUTOTUNE)


def append_eos_after_trim(
    dataset: tf.data.Dataset,
    output_features: OutputFeatures,
    sequence_length: Mapping[str, int | None] | None = None,
) -> tf.data.Dataset:
    """Trims features with ``add_eos`` to ``sequence_length - 1`` and appends EOS.

    Features without ``add_eos`` are left alone (the task trims them later).
    """

    def fn(x: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(x)
        for key, value in x.items():
            feature = output_features.get(key)
            if feature is None or not feature.add_eos:
                continue
            limit = sequence_length.get(key) if sequence_length is not None else None
            if limit is not None:
                value = value[..., : limit - 1]
            out[key] = _append_eos_to_last_axis(value, _eos_id(key, feature))
        return out

    return dataset.map(fn, num_parallel_calls=AUTOTUNE)


@map_over_dataset
def translate(x: Mapping[str, Any], source_language: str, target_language: str) -> dict[str, Any]:
    """Makes ``"translate English to German: <source>"`` -> ``<target>`` examples.

    Args:
      x: an example holding a string feature per language code.
      source_language / target_language: codes such as "en", "de" (the first two
        letters choose the language name).
    """
    names = []
    for code in (source_language, target_language):
        if code[:2] not in LANGUAGE_NAMES:
            raise ValueError(
                f"translate: unknown language code {code!r}; known: {', '.join(sorted(LANGUAGE_NAMES))}"
            )
        names.append(LANGUAGE_NAMES[code[:2]])
    prefix = f"translate {names[0]} to {names[1]}: "
    return {"inputs": tf.strings.join([prefix, x[source_language]]), "targets": x[target_language]}


@map_over_dataset
def summarize(x: Mapping[str, Any], article_key: str, summary_key: str) -> dict[str, Any]:
    """Makes ``"summarize: <article>"`` -> ``<summary>`` examples."""
    return {"inputs": tf.strings.join(["summarize: ", x[article_key]]), "targets": x[summary_key]}


def filter_by_string_length(
    dataset: tf.data.Dataset, feature_key: str = "targets", min_length: int = 1, max_length: int = 1_000_000
) -> tf.data.Dataset:
    """Keeps examples whose string ``feature_key`` has a length in [min, max]."""

    def keep(x: Mapping[str, Any]) -> tf.Tensor:
        n = tf.strings.length(x[feature_key])
        return tf.logical_and(n >= min_length, n <= max_length)

    return dataset.filter(keep)
