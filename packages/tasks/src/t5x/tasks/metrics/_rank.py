"""Rank classification: score every answer option and take the best (T5's zero-shot eval)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from t5x.tasks.metrics._classification import ArrayLike, mean_multiclass_f1


def _curve(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted cumulative true/false positives at each distinct threshold, high to low."""
    order = np.argsort(-scores, kind="mergesort")
    scores, labels, weights = scores[order], labels[order], weights[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]
    tps = np.cumsum(labels * weights)[last_of_tie]
    fps = np.cumsum((1 - labels) * weights)[last_of_tie]
    return tps, fps


def roc_auc(labels: ArrayLike, scores: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Area under the ROC curve (ties in ``scores`` count half), as sklearn's ``roc_auc_score``.

    Raises:
      ValueError: ``labels`` holds only one class.
    """
    y = np.asarray(labels, float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, float)
    tps, fps = _curve(y, np.asarray(scores, float), w)
    if tps[-1] == 0 or fps[-1] == 0:
        raise ValueError("roc_auc: needs both positive and negative labels, got only one class")
    tpr, fpr = np.r_[0.0, tps / tps[-1]], np.r_[0.0, fps / fps[-1]]
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))


def average_precision(labels: ArrayLike, scores: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Area under the precision-recall step curve, as sklearn's ``average_precision_score``."""
    y = np.asarray(labels, float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, float)
    tps, fps = _curve(y, np.asarray(scores, float), w)
    if tps[-1] == 0:
        raise ValueError("average_precision: needs at least one positive label")
    precision = tps / (tps + fps)
    recall = np.r_[0.0, tps / tps[-1]]
    return float(np.sum(np.diff(recall) * precision))


def rank_classification(
    targets: Sequence[tuple[Sequence[int], bool, float, int]],
    scores: ArrayLike,
    num_classes: int | None = None,
    normalize_by_target_length: bool = False,
) -> dict[str, float]:
    """Picks the best-scoring option of each example and reports how often it is correct.

    Use with :func:`t5x.tasks.rank_classification` (the preprocessor that
    expands each example into one row per option) and
    :func:`t5x.tasks.rank_classification_postprocessor` (which turns each row
    into the target tuple below). Percent scale, seqio's definitions.

    Args:
      targets: one tuple per option row: ``(idx, is_correct, weight,
        target_length)`` where ``idx = (example index, option index)``.
      scores: the model's log-likelihood of each row's target, ``[rows]``.
      num_classes: options per example when fixed (enables F1 and, for two,
        ROC-AUC and PR-AUC of option 1); None when it varies (accuracy only).
      normalize_by_target_length: divide each score by its target length.

    Returns:
      ``{"accuracy": ...}`` plus ``f1`` / ``mean_<n>class_f1`` / ``auc-roc`` /
      ``auc-pr`` when ``num_classes`` allows.

    Raises:
      ValueError: mismatched lengths, malformed targets, or rows not divisible
        by ``num_classes``.
    """
    if len(targets) != len(scores):
        raise ValueError(f"rank_classification: got {len(targets)} targets but {len(scores)} scores")
    if not targets:
        raise ValueError("rank_classification: needs at least one row, got none")
    if len(targets[0]) != 4:
        raise ValueError(
            "rank_classification: each target must be (idx, is_correct, weight, target_length), "
            f"got {len(targets[0])} fields: {targets[0]!r}"
        )
    score_list = [float(s) for s in scores]
    if normalize_by_target_length:
        score_list = [s / t[3] for t, s in zip(targets, score_list, strict=True)]
    rows = sorted(zip(targets, score_list, strict=True), key=lambda r: tuple(np.asarray(r[0][0]).tolist()))

    if not num_classes:
        correct = total = 0.0
        for _, group in itertools.groupby(rows, key=lambda r: int(np.asarray(r[0][0])[0])):
            options = list(group)
            best = options[int(np.argmax([s for _, s in options]))][0]
            correct += float(best[1]) * float(best[2])
            total += float(best[2])
        return {"accuracy": 100.0 * correct / total}

    if len(rows) % num_classes:
        raise ValueError(
            f"rank_classification: {len(rows)} rows is not a multiple of num_classes={num_classes}"
        )
    labels = np.array([bool(t[1]) for t, _ in rows]).reshape(-1, num_classes)
    weights = np.array([float(t[2]) for t, _ in rows]).reshape(-1, num_classes)[:, 0]
    loglik = np.array([s for _, s in rows], np.float64).reshape(-1, num_classes)
    predictions = loglik.argmax(-1)
    hit = labels[np.arange(len(labels)), predictions]
    out = {"accuracy": 100.0 * float(np.average(hit, weights=weights))}
    if np.any(labels.sum(-1) > 1):
        return out  # several correct options: only accuracy is meaningful
    gold = labels.argmax(-1)
    if num_classes > 2:
        out.update(mean_multiclass_f1(num_classes, sample_weight=weights)(gold, predictions))
        return out
    tp = float(weights[(gold == 1) & (predictions == 1)].sum())
    fp = float(weights[(gold == 0) & (predictions == 1)].sum())
    fn = float(weights[(gold == 1) & (predictions == 0)].sum())
    out["f1"] = 0.0 if tp == 0 else 100.0 * 2 * tp / (2 * tp + fp + fn)
    probs = np.exp(loglik - loglik.max(-1, keepdims=True))
    probs = probs[:, 1] / probs.sum(-1)
    if 0 < gold.sum() < len(gold):
        out["auc-roc"] = 100.0 * roc_auc(gold, probs, weights)
        out["auc-pr"] = 100.0 * average_precision(gold, probs, weights)
    return out
