"""Classification and correlation metrics (T5 definitions, percent scale), in numpy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ArrayLike = Sequence[Any] | np.ndarray


def _pair(targets: ArrayLike, predictions: ArrayLike, name: str) -> tuple[np.ndarray, np.ndarray]:
    t, p = np.asarray(targets), np.asarray(predictions)
    if len(t) != len(p):
        raise ValueError(f"{name}: got {len(t)} targets but {len(p)} predictions; they must match one to one")
    if len(t) == 0:
        raise ValueError(f"{name}: needs at least one example, got none")
    return t, p


def accuracy(targets: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
    """Percentage of predictions equal to their target (labels of any hashable type)."""
    _pair(targets, predictions, "accuracy")
    return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions, strict=True)]))}


def sequence_accuracy(targets: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
    """Percentage of predicted sequences (e.g. strings) exactly equal to their target."""
    _pair(targets, predictions, "sequence_accuracy")
    hits = [t == p for t, p in zip(targets, predictions, strict=True)]
    return {"sequence_accuracy": 100.0 * float(np.mean(hits))}


def _f1(tp: float, fp: float, fn: float) -> float:
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2 * tp / denom


def f1(targets: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
    """Binary F1 of the positive class 1, in percent (sklearn's ``f1_score``)."""
    t, p = _pair(targets, predictions, "f1")
    t, p = t == 1, p == 1
    return {"f1": 100.0 * _f1(float(np.sum(t & p)), float(np.sum(~t & p)), float(np.sum(t & ~p)))}


def f1_score_with_invalid(targets: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
    """Binary F1 where a prediction other than 0 or 1 counts as wrong (T5's GLUE F1)."""
    t, p = _pair(targets, predictions, "f1_score_with_invalid")
    p = np.where((p == 0) | (p == 1), p, 1 - t)
    return f1(t, p)


def mean_multiclass_f1(num_classes: int, sample_weight: ArrayLike | None = None) -> Callable[..., dict]:
    """Returns a metric: the unweighted mean over classes ``0..num_classes-1`` of per-class F1."""

    def metric(targets: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
        t, p = _pair(targets, predictions, "mean_multiclass_f1")
        w = np.ones(len(t)) if sample_weight is None else np.asarray(sample_weight, float)
        if t.ndim == 2:  # one-hot indicators, as rank_classification passes them
            t, p = t.argmax(-1), p.argmax(-1)
        scores = [
            _f1(
                float(w[(t == c) & (p == c)].sum()),
                float(w[(t != c) & (p == c)].sum()),
                float(w[(t == c) & (p != c)].sum()),
            )
            for c in range(num_classes)
        ]
        return {f"mean_{num_classes}class_f1": 100.0 * float(np.mean(scores))}

    return metric


def mean_per_class_accuracy(targets: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
    """Accuracy averaged over the classes present in ``targets`` (balanced accuracy), in percent."""
    t, p = _pair(targets, predictions, "mean_per_class_accuracy")
    recalls = [float(np.mean(p[t == c] == c)) for c in np.unique(t)]
    return {"mean_per_class_accuracy": 100.0 * float(np.mean(recalls))}


def matthews_corrcoef(targets: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
    """Matthews correlation coefficient (multi-class form), times 100 as T5 reports it for CoLA."""
    t, p = _pair(targets, predictions, "matthews_corrcoef")
    classes = np.unique(np.concatenate([t, p]))
    ti, pi = np.searchsorted(classes, t), np.searchsorted(classes, p)
    confusion = np.zeros((len(classes), len(classes)))
    np.add.at(confusion, (ti, pi), 1.0)
    true_counts, pred_counts = confusion.sum(1), confusion.sum(0)
    correct, n = np.trace(confusion), confusion.sum()
    cov_tp = correct * n - true_counts @ pred_counts
    cov_pp = n * n - pred_counts @ pred_counts
    cov_tt = n * n - true_counts @ true_counts
    denom = np.sqrt(cov_tt * cov_pp)
    return {"matthews_corrcoef": 0.0 if denom == 0 else 100.0 * float(cov_tp / denom)}


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    return float("nan") if denom == 0 else float((x * y).sum() / denom)


def pearson_corrcoef(targets: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
    """Pearson correlation times 100 (STS-B)."""
    t, p = _pair(targets, predictions, "pearson_corrcoef")
    return {"pearson_corrcoef": 100.0 * _pearson(t.astype(float), p.astype(float))}


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Tied values share the mean of the ranks they span, as scipy.stats.rankdata does.
    starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(x)] - 1
    ranks = np.empty(len(x))
    ranks[order] = (first[group] + last[group]) / 2.0 + 1.0
    return ranks


def spearman_corrcoef(targets: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
    """Spearman rank correlation (ties get average ranks) times 100 (STS-B)."""
    t, p = _pair(targets, predictions, "spearman_corrcoef")
    return {
        "spearman_corrcoef": 100.0
        * _pearson(_average_ranks(t.astype(float)), _average_ranks(p.astype(float)))
    }
