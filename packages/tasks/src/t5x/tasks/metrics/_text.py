"""Text metrics: BLEU (sacrebleu), ROUGE (rouge-score), SQuAD exact match and F1."""

from __future__ import annotations

import collections
import importlib
import re
import string
from collections.abc import Sequence
from typing import Any

import numpy as np


def _require(module: str, package: str, metric: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"t5x.tasks.metrics.{metric} needs the {package!r} package; install it with "
            "`pip install --find-links dist 't5x-tasks[metrics]'` "
            "(run in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md)"
        ) from e


def bleu(
    targets: Sequence[str] | Sequence[Sequence[str]], predictions: Sequence[str], tokenizer: str = "intl"
) -> dict:
    """Corpus BLEU with T5's sacrebleu settings (exp smoothing, ``intl`` tokenizer).

    Args:
      targets: one reference per prediction, or a list of reference streams
        (``targets[k][i]`` is the k-th reference of prediction i), as T5 takes them.
      predictions: the decoded predictions.
      tokenizer: the sacrebleu tokenizer name.

    Returns:
      ``{"bleu": score}`` on a 0-100 scale.
    """
    sacrebleu = _require("sacrebleu", "sacrebleu", "bleu")
    references = [list(r) for r in targets] if isinstance(targets[0], (list, tuple)) else [list(targets)]
    score = sacrebleu.corpus_bleu(
        list(predictions),
        references,
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize=tokenizer,
        use_effective_order=False,
    )
    return {"bleu": float(score.score)}


def rouge(
    targets: Sequence[str],
    predictions: Sequence[str],
    score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeLsum"),
    **scorer_kwargs: Any,
) -> dict[str, float]:
    """ROUGE F-measures (bootstrap mid point), as T5 computes them, in percent.

    Sentences are split at `` . `` so that ``rougeLsum`` sees sentence ends.

    Args:
      targets: reference summaries.
      predictions: predicted summaries.
      score_keys: any of ``rouge1``, ``rouge2``, ``rougeL``, ``rougeLsum``.
      **scorer_kwargs: passed to ``rouge_score.rouge_scorer.RougeScorer``
        (e.g. ``use_stemmer=True``).
    """
    rouge_scorer = _require("rouge_score.rouge_scorer", "rouge-score", "rouge")
    scoring = _require("rouge_score.scoring", "rouge-score", "rouge")
    if len(targets) != len(predictions):
        raise ValueError(f"rouge: got {len(targets)} targets but {len(predictions)} predictions")
    scorer = rouge_scorer.RougeScorer(rouge_types=list(score_keys), **scorer_kwargs)
    aggregator = scoring.BootstrapAggregator()
    for target, prediction in zip(targets, predictions, strict=True):
        aggregator.add_scores(
            scorer.score(target=target.replace(" . ", " .\n"), prediction=prediction.replace(" . ", " .\n"))
        )
    result = aggregator.aggregate()
    return {key: 100.0 * float(result[key].mid.fmeasure) for key in score_keys}


def normalize_squad(answer: str) -> str:
    """SQuAD's answer normalisation: lowercase, drop punctuation and a/an/the, squeeze spaces."""
    text = answer.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_PUNCTUATION = frozenset(string.punctuation)


def _token_f1(target: str, prediction: str) -> float:
    pred_tokens, target_tokens = prediction.split(), target.split()
    same = sum((collections.Counter(pred_tokens) & collections.Counter(target_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(target_tokens)
    return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """SQuAD exact match and token F1, each the best over an example's answers, in percent.

    Args:
      targets: for each example, its list of acceptable answers.
      predictions: one predicted answer per example.

    Returns:
      ``{"em": ..., "f1": ...}``.
    """
    if len(targets) != len(predictions):
        raise ValueError(f"squad: got {len(targets)} targets but {len(predictions)} predictions")
    if not targets:
        raise ValueError("squad: needs at least one example, got none")
    em, f1 = [], []
    for answers, prediction in zip(targets, predictions, strict=True):
        if isinstance(answers, str):
            raise TypeError(f"squad: each target must be a list of answers, got the string {answers!r}")
        gold = [normalize_squad(a) for a in answers]
        pred = normalize_squad(prediction)
        em.append(max(float(g == pred) for g in gold))
        f1.append(max(_token_f1(g, pred) for g in gold))
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1))}
