"""Conformance check for the FeatureConverter contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from t5x.interfaces._feature_converter import FeatureConverter
from t5x.interfaces.testing._common import require, require_members


def check_feature_converter(
    converter: FeatureConverter,
    examples: Sequence[Mapping[str, Sequence[int]]],
    task_feature_lengths: Mapping[str, int],
) -> list[dict[str, np.ndarray]]:
    """Checks ``converter`` on ``examples`` against the FeatureConverter contract.

    The contract is about converters that produce fixed-length model features;
    a pass-through converter, which returns its input unchanged, is outside it.

    Args:
      converter: the converter under test.
      examples: task examples, each a dict of non-empty 1-D int sequences, all
        within ``task_feature_lengths``.
      task_feature_lengths: the task lengths to convert with.

    Returns:
      The converted model examples, as numpy, for further checks by the caller.

    Raises:
      ConformanceError: naming the broken rule.
    """
    import tensorflow as tf  # the converter contract is about tf.data

    require_members(converter, FeatureConverter)
    require(isinstance(converter.pack, bool), f"pack must be a bool, got {converter.pack!r}")
    lengths = converter.get_model_feature_lengths(task_feature_lengths)
    require(
        isinstance(lengths, Mapping) and all(isinstance(v, int) for v in lengths.values()),
        f"get_model_feature_lengths must return a dict of ints, got {lengths!r}",
    )
    names = sorted(examples[0])
    ds = tf.data.Dataset.from_generator(
        lambda: ({k: np.asarray(ex[k], np.int32) for k in names} for ex in examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in names},
    )
    out = converter(ds, task_feature_lengths)
    require(
        isinstance(out, tf.data.Dataset),
        f"the converter must return a tf.data.Dataset, got {type(out).__name__}",
    )
    spec = out.element_spec
    require(
        set(spec) == set(lengths),
        f"output features {sorted(spec)} differ from get_model_feature_lengths {sorted(lengths)}",
    )
    for name, feature_spec in spec.items():
        require(
            feature_spec.dtype == tf.int32, f"model feature {name!r} must be int32, got {feature_spec.dtype}"
        )
        require(
            feature_spec.shape.as_list() == [lengths[name]],
            f"model feature {name!r} must have static shape [{lengths[name]}], got {feature_spec.shape}",
        )
    converted = list(out.as_numpy_iterator())
    require(len(converted) > 0, "the converter returned no examples for a non-empty input")
    if not converter.pack:
        require(
            len(converted) == len(examples),
            f"unpacked conversion changed {len(examples)} examples into {len(converted)}",
        )
    again = list(converter(ds, task_feature_lengths).as_numpy_iterator())
    require(
        len(again) == len(converted) and all(_same(a, b) for a, b in zip(again, converted, strict=True)),
        "converting the same input twice gave different outputs",
    )
    return converted


def _same(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
