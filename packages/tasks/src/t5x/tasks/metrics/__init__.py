"""Evaluation metrics with the T5 library's definitions.

Each metric is ``fn(targets, predictions) -> {name: value}``; score-based ones
(``rank_classification``) take ``(targets, scores)``. Values are on the percent
scale where T5 reports them that way. BLEU and ROUGE need the ``metrics`` extra
(``pip install --find-links dist 't5x-tasks[metrics]'``, see docs/installing.md) and import
their libraries on first use.
"""

from t5x.tasks.metrics._classification import (
    accuracy,
    f1,
    f1_score_with_invalid,
    matthews_corrcoef,
    mean_multiclass_f1,
    mean_per_class_accuracy,
    pearson_corrcoef,
    sequence_accuracy,
    spearman_corrcoef,
)
from t5x.tasks.metrics._rank import average_precision, rank_classification, roc_auc
from t5x.tasks.metrics._text import bleu, normalize_squad, rouge, squad

__all__ = [
    "accuracy",
    "average_precision",
    "bleu",
    "f1",
    "f1_score_with_invalid",
    "matthews_corrcoef",
    "mean_multiclass_f1",
    "mean_per_class_accuracy",
    "normalize_squad",
    "pearson_corrcoef",
    "rank_classification",
    "roc_auc",
    "rouge",
    "sequence_accuracy",
    "spearman_corrcoef",
    "squad",
]
