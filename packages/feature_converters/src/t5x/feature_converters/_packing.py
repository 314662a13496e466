"""Packing of variable-length examples into fixed-length rows, vectorised.

Examples are packed window by window: a window is a padded batch of
consecutive examples and rows never span windows. Two strategies:

* ``"greedy"`` reproduces seqio's default (non-custom-op) packer exactly:
  examples are taken in order and a row is closed as soon as the next example
  does not fit (in every feature). The row boundaries are found without a
  per-example loop: each example's "next row start if a row started here" is a
  ``searchsorted`` over prefix sums, and the chain of row starts from example 0
  is marked by pointer doubling (log2(window) gather/scatter steps).
* ``"first_fit"`` puts each example into the first row of the window that still
  has room for it, which packs denser; it needs one small vector step per
  example (a ``tf.while_loop``), never per token.

Both then lay tokens out with one ragged ``to_tensor`` per feature.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import tensorflow as tf

PACKING_STRATEGIES = ("greedy", "first_fit")


def _effective_lengths(x: tf.Tensor) -> tf.Tensor:
    """seqio counts a packed example's length as its number of non-zero ids."""
    return tf.reduce_sum(tf.cast(tf.not_equal(x, 0), tf.int32), axis=1)


def _greedy_rows(lengths: tf.Tensor, limits: tf.Tensor, window: int) -> tf.Tensor:
    """Row of each example under in-order next-fit packing.

    Args:
      lengths: ``[n, k]`` int32, each example's length in each of k features.
      limits: ``[k]`` int32 row lengths; every length is within its limit.
      window: static upper bound on ``n``.

    Returns:
      ``[n]`` int32 row ids, non-decreasing from 0.
    """
    n = tf.shape(lengths)[0]
    cums = tf.concat([tf.zeros([1, tf.shape(lengths)[1]], tf.int32), tf.cumsum(lengths, axis=0)], axis=0)
    # For a row starting at example i, the examples that fit are i..j-1 where j
    # is the last prefix-sum index still within the limit, in every feature.
    cums_t = tf.transpose(cums)  # [k, n + 1]
    ends = tf.searchsorted(cums_t, cums_t[:, :-1] + limits[:, None], side="right") - 1
    nxt = tf.concat([tf.reduce_min(ends, axis=0), [n]], axis=0)  # [n + 1]; n is the sink
    reached = tf.one_hot(0, n + 1, dtype=tf.int32)
    jump = nxt
    for _ in range(max(1, math.ceil(math.log2(window + 1)))):
        reached = tf.maximum(reached, tf.math.unsorted_segment_max(reached, jump, n + 1))
        jump = tf.gather(jump, jump)
    return tf.cumsum(reached[:n]) - 1


def _first_fit_rows(lengths: tf.Tensor, limits: tf.Tensor) -> tf.Tensor:
    """Row of each example when each goes into the first row with room.

    Args:
      lengths: ``[n, k]`` int32 lengths.
      limits: ``[k]`` int32 row lengths.

    Returns:
      ``[n]`` int32 row ids in order of row creation.
    """
    n = tf.shape(lengths)[0]

    def body(i, used, rows):
        fits = tf.reduce_all(used + lengths[i] <= limits, axis=1)
        row = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
        used = tf.tensor_scatter_nd_add(used, [[row]], lengths[i][None])
        rows = tf.tensor_scatter_nd_update(rows, [[i]], [row])
        return i + 1, used, rows

    _, _, rows = tf.while_loop(
        lambda i, *_: i < n,
        body,
        (tf.constant(0), tf.zeros_like(lengths), tf.zeros([n], tf.int32)),
        parallel_iterations=1,
    )
    return rows


def pack_window(
    batch: Mapping[str, tf.Tensor],
    feature_lengths: Mapping[str, int],
    strategy: str = "greedy",
    window: int | None = None,
) -> dict[str, tf.Tensor]:
    """Packs one padded batch of examples into rows.

    Args:
      batch: feature name -> ``[n, m]`` int32 examples padded with 0, each
        already trimmed to its feature length.
      feature_lengths: feature name -> row length.
      strategy: ``"greedy"`` (seqio's layout) or ``"first_fit"``.
      window: static upper bound on ``n`` (for greedy's doubling steps).

    Returns:
      For each feature ``k``: ``k``, ``k_segment_ids`` and ``k_positions``,
      each ``[rows, feature_lengths[k]]`` int32.
    """
    keys = list(feature_lengths)
    window = window or max(feature_lengths.values())
    xs = {k: tf.cast(batch[k][:, : feature_lengths[k]], tf.int32) for k in keys}
    lengths = tf.stack([_effective_lengths(xs[k]) for k in keys], axis=1)  # [n, k]
    limits = tf.constant([feature_lengths[k] for k in keys], tf.int32)
    if strategy == "greedy":
        rows = _greedy_rows(lengths, limits, window)
    elif strategy == "first_fit":
        rows = _first_fit_rows(lengths, limits)
        # Lay rows out one after another, examples in their original order.
        order = tf.argsort(rows, stable=True)
        rows = tf.gather(rows, order)
        lengths = tf.gather(lengths, order)
        xs = {k: tf.gather(v, order) for k, v in xs.items()}
    else:
        raise ValueError(f"packing strategy must be one of {PACKING_STRATEGIES}, got {strategy!r}")
    num_rows = rows[-1] + 1
    is_start = tf.not_equal(rows, tf.concat([[-1], rows[:-1]], axis=0))
    start_index = tf.boolean_mask(tf.range(tf.size(rows)), is_start)  # [rows]
    out = {}
    for j, k in enumerate(keys):
        x, eff, length = xs[k], lengths[:, j], feature_lengths[k]
        # seqio numbers segments by the non-empty examples of this feature only.
        nonempty = tf.cast(eff > 0, tf.int32)
        running = tf.cumsum(nonempty)
        segment = running - tf.gather(tf.gather(running - nonempty, start_index), rows)
        mask = tf.range(tf.shape(x)[1])[None, :] < eff[:, None]
        positions = tf.broadcast_to(tf.range(tf.shape(x)[1]), tf.shape(x))
        flat = tf.stack(
            [tf.boolean_mask(x, mask), tf.boolean_mask(positions, mask), tf.repeat(segment, eff)], axis=1
        )
        splits = tf.concat([[0], tf.cumsum(tf.math.unsorted_segment_sum(eff, rows, num_rows))], axis=0)
        dense = tf.RaggedTensor.from_row_splits(flat, splits, validate=False).to_tensor(
            0, shape=[None, length, 3]
        )
        tokens = dense[..., 0]
        out[k] = tokens
        out[k + "_positions"] = dense[..., 1]
        out[k + "_segment_ids"] = dense[..., 2] * tf.cast(tf.not_equal(tokens, 0), tf.int32)
    return out


def _select_and_trim(ds: tf.data.Dataset, feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
    return ds.map(
        lambda ex: {k: ex[k][:n] for k, n in feature_lengths.items()},
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def trim_and_pack_dataset(
    dataset: tf.data.Dataset,
    feature_lengths: Mapping[str, int],
    use_custom_ops: bool = False,
    *,
    strategy: str | None = None,
    window: int | None = None,
) -> tf.data.Dataset:
    """Packs a dataset of 1-D features into fixed-length rows.

    Features not in ``feature_lengths`` are dropped; each example is trimmed to
    ``feature_lengths``. For every feature ``k`` the output also has
    ``k_segment_ids`` (1, 2, ... per packed example, 0 on padding) and
    ``k_positions`` (0, 1, ... within each packed example).

    Args:
      dataset: unbatched examples, dicts of 1-D int tensors.
      feature_lengths: feature -> row length.
      use_custom_ops: seqio's switch for its denser custom-op packer; here it
        selects the ``"first_fit"`` strategy.
      strategy: ``"greedy"`` (default; seqio's layout) or ``"first_fit"``.
      window: examples per packing window; defaults to seqio's, the largest
        feature length.

    Returns:
      A dataset of rows, each feature ``[feature_lengths[k]]`` int32.

    Raises:
      ValueError: a feature is missing or not 1-D, or the strategy is unknown.
    """
    for k in feature_lengths:
        if k not in dataset.element_spec:
            raise ValueError(
                f"trim_and_pack_dataset: feature {k!r} is not in the dataset (it has {sorted(dataset.element_spec)})"
            )
        if dataset.element_spec[k].shape.rank != 1:
            raise ValueError(
                f"trim_and_pack_dataset: feature {k!r} must be 1-D, got shape {dataset.element_spec[k].shape}"
            )
    strategy = strategy or ("first_fit" if use_custom_ops else "greedy")
    if strategy not in PACKING_STRATEGIES:
        raise ValueError(f"packing strategy must be one of {PACKING_STRATEGIES}, got {strategy!r}")
    window = window or max(feature_lengths.values())
    ds = _select_and_trim(dataset, feature_lengths)
    return packed_rows(ds, feature_lengths, strategy, window)


def _padded_batch_all(ds: tf.data.Dataset, window: int) -> tf.data.Dataset:
    """Pads every feature of each window of examples to the window's longest."""
    return ds.padded_batch(window)


def packed_rows(
    ds: tf.data.Dataset,
    feature_lengths: Mapping[str, int],
    strategy: str,
    window: int,
    convert=None,
    prepare=None,
) -> tf.data.Dataset:
    """Windows, packs and (optionally) converts rows of examples.

    Args:
      ds: unbatched examples holding (at least) the features to pack.
      feature_lengths: feature -> row length.
      strategy: a packing strategy.
      window: examples per window.
      convert: optional function of the packed rows (``[rows, L]`` features).
      prepare: optional function of each padded window (``[n, width]``
        features) that returns the features to pack, each trimmed to its length.

    Returns:
      Unbatched rows.
    """
    ds = _padded_batch_all(ds, window)

    def pack(batch):
        if prepare is not None:
            batch = prepare(batch)
        rows = pack_window(batch, feature_lengths, strategy, window)
        if convert is not None:
            rows = convert(rows)
        return rows

    return ds.map(pack, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def trim_and_pad_dataset(dataset: tf.data.Dataset, feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
    """Trims or zero-pads the first axis of the listed features.

    Args:
      dataset: unbatched examples.
      feature_lengths: feature -> length; other features pass unchanged.

    Returns:
      The dataset with each listed feature of static length
      ``feature_lengths[k]``.
    """
    from t5x.feature_converters._ops import pad_to_length

    return dataset.map(
        lambda ex: {
            k: pad_to_length(v, feature_lengths[k]) if k in feature_lengths else v for k, v in ex.items()
        },
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def packing_efficiency(
    examples: tf.data.Dataset | Iterable[Mapping[str, np.ndarray]],
    features: Iterable[str] | None = None,
) -> dict[str, float]:
    """Fraction of positions that hold a real (non-zero) token.

    Args:
      examples: converted model examples (a dataset or an iterable of dicts of
        arrays), unbatched or batched.
      features: which features to measure; defaults to every ``*_tokens``
        feature except ``decoder_input_tokens`` (a shifted copy).

    Returns:
      feature name -> non-padding fraction in [0, 1].

    Raises:
      ValueError: there are no examples or a named feature is missing.
    """
    if isinstance(examples, tf.data.Dataset):
        examples = examples.as_numpy_iterator()
    names: list[str] | None = list(features) if features is not None else None
    nonzero: dict[str, int] = {}
    total: dict[str, int] = {}
    for ex in examples:
        if names is None:
            names = sorted(k for k in ex if k.endswith("_tokens") and k != "decoder_input_tokens")
        for k in names:
            if k not in ex:
                raise ValueError(
                    f"packing_efficiency: feature {k!r} is not in the examples (they have {sorted(ex)})"
                )
            arr = np.asarray(ex[k])
            nonzero[k] = nonzero.get(k, 0) + int(np.count_nonzero(arr))
            total[k] = total.get(k, 0) + arr.size
    if not total:
        raise ValueError("packing_efficiency: no examples to measure")
    return {k: nonzero[k] / total[k] for k in total}
