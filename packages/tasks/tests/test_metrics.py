"""Metrics against hand-computed values (and the reference libraries where installed)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import tensorflow as tf

import t5x.tasks as tt
from t5x.tasks import metrics
from t5x.tasks._rank_classification import rank_classification as rank_prep
from t5x.tasks._rank_classification import rank_classification_postprocessor


def test_accuracy_and_sequence_accuracy():
    assert metrics.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == {"accuracy": 50.0}
    assert metrics.sequence_accuracy(["a b", "c"], ["a b", "c "]) == {"sequence_accuracy": 50.0}
    with pytest.raises(ValueError, match="3 targets but 2 predictions"):
        metrics.accuracy([1, 2, 3], [1, 2])


def test_f1_family():
    # tp=2 fp=1 fn=1 -> F1 = 4/6
    assert metrics.f1([1, 1, 1, 0, 0], [1, 1, 0, 1, 0])["f1"] == pytest.approx(100 * 4 / 6)
    # the invalid prediction 7 (target 1) counts as 0: tp=1 fn=1 fp=0 -> 2/3
    assert metrics.f1_score_with_invalid([1, 1, 0], [1, 7, 0])["f1"] == pytest.approx(100 * 2 / 3)
    # class 0: tp1 fp0 fn1 -> 2/3; class 1: tp1 fp1 fn0 -> 2/3; class 2: tp1 -> 1
    got = metrics.mean_multiclass_f1(3)([0, 0, 1, 2], [0, 1, 1, 2])
    assert got == {"mean_3class_f1": pytest.approx(100 * (2 / 3 + 2 / 3 + 1) / 3)}


def test_mean_per_class_accuracy():
    # class a: 2/3 right, class b: 1/1 right -> mean 5/6
    got = metrics.mean_per_class_accuracy(["a", "a", "a", "b"], ["a", "a", "b", "b"])
    assert got["mean_per_class_accuracy"] == pytest.approx(100 * 5 / 6)


def test_matthews_corrcoef_binary_by_hand():
    t, p = [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1]
    tp, tn, fp, fn = 2, 2, 1, 1
    expected = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert metrics.matthews_corrcoef(t, p)["matthews_corrcoef"] == pytest.approx(100 * expected)
    assert metrics.matthews_corrcoef([0, 1], [1, 1])["matthews_corrcoef"] == 0.0


def test_correlations_against_numpy_and_scipy():
    rng = np.random.default_rng(0)
    t = rng.integers(0, 5, 40).astype(float)  # ties exercise average ranks
    p = t + rng.normal(size=40)
    assert metrics.pearson_corrcoef(t, p)["pearson_corrcoef"] == pytest.approx(100 * np.corrcoef(t, p)[0, 1])
    assert metrics.spearman_corrcoef([1, 2, 3, 4], [10, 20, 40, 30])["spearman_corrcoef"] == pytest.approx(
        80.0
    )
    stats = pytest.importorskip("scipy.stats", reason="scipy not installed: compared by hand only")
    want = 100 * stats.spearmanr(t, p).statistic
    assert metrics.spearman_corrcoef(t, p)["spearman_corrcoef"] == pytest.approx(want)


def test_squad_normalisation_and_scores():
    assert metrics.normalize_squad("The  Eiffel-Tower!") == "eiffeltower"
    got = metrics.squad([["The cat sat", "a dog"], ["blue sky"]], ["cat sat down", "Blue sky."])
    # example 1: EM 0; F1 vs "cat sat" = 2*(2/3*1)/(2/3+1) = 0.8; example 2: EM 1, F1 1
    assert got["em"] == pytest.approx(50.0)
    assert got["f1"] == pytest.approx(100 * (0.8 + 1) / 2)
    with pytest.raises(TypeError, match="list of answers"):
        metrics.squad(["cat"], ["cat"])


def test_auc_by_hand():
    # pairs (pos, neg): scores pos {0.9, 0.4}, neg {0.5, 0.1}: 3 of 4 pairs ordered right
    assert metrics.roc_auc([1, 0, 1, 0], [0.9, 0.5, 0.4, 0.1]) == pytest.approx(0.75)
    # precision at each positive: 1/1, then 2/3 -> AP = 0.5*1 + 0.5*2/3
    assert metrics.average_precision([1, 0, 1, 0], [0.9, 0.5, 0.4, 0.1]) == pytest.approx(0.5 + 1 / 3)
    assert metrics.roc_auc([1, 0], [0.5, 0.5]) == pytest.approx(0.5)


@pytest.mark.skipif(
    importlib.util.find_spec("sacrebleu") is None, reason="sacrebleu not installed (metrics extra)"
)
def test_bleu_perfect_and_against_sacrebleu():
    import sacrebleu

    refs = ["the cat sat on the mat today", "a quick brown fox jumps high"]
    assert metrics.bleu(refs, refs)["bleu"] == pytest.approx(100.0)
    preds = ["the cat sat on a mat today", "a quick brown fox jumped high"]
    want = sacrebleu.corpus_bleu(preds, [refs], smooth_method="exp", tokenize="intl").score
    assert metrics.bleu(refs, preds)["bleu"] == pytest.approx(want)
    assert 0 < want < 100


@pytest.mark.skipif(
    importlib.util.find_spec("rouge_score") is None, reason="rouge-score not installed (metrics extra)"
)
def test_rouge_by_hand():
    # prediction "the cat" vs target "the cat sat": rouge1 P=1 R=2/3 -> F=0.8; rouge2 P=1 R=1/2 -> 2/3
    got = metrics.rouge(["the cat sat"], ["the cat"], score_keys=("rouge1", "rouge2", "rougeL", "rougeLsum"))
    assert got["rouge1"] == pytest.approx(80.0)
    assert got["rouge2"] == pytest.approx(100 * 2 / 3)
    assert got["rougeL"] == pytest.approx(80.0)
    assert got["rougeLsum"] == pytest.approx(80.0)


def test_rank_classification_metric_by_hand():
    # two examples with 2 options each; example 0 correct option 0, example 1 correct option 1
    targets = [
        ((0, 0), True, 1.0, 2),
        ((0, 1), False, 1.0, 4),
        ((1, 0), False, 1.0, 2),
        ((1, 1), True, 1.0, 4),
    ]
    scores = [-1.0, -3.0, -1.0, -3.0]  # picks option 0 in both
    assert metrics.rank_classification(targets, scores)["accuracy"] == 50.0
    got = metrics.rank_classification(targets, scores, num_classes=2)
    assert got["accuracy"] == 50.0 and got["f1"] == 0.0
    assert got["auc-roc"] == pytest.approx(50.0)
    # shuffled row order does not matter
    order = [3, 1, 0, 2]
    shuffled = metrics.rank_classification(
        [targets[i] for i in order], [scores[i] for i in order], num_classes=2
    )
    assert shuffled == got
    with pytest.raises(ValueError, match="got 3 fields"):
        metrics.rank_classification([((0, 0), True, 1.0)], [1.0])


def test_rank_classification_end_to_end_with_known_scorer(vocab, clean_registry):
    questions = [
        {"premise": "sky", "choices": ["blue", "green", "red"], "label": 0},
        {"premise": "grass", "choices": ["blue", "green", "red"], "label": 1},
        {"premise": "blood", "choices": ["blue", "green", "red"], "label": 1},  # scorer gets this one wrong
    ]
    source = tt.InMemoryDataSource({"validation": questions})

    def expand(ds):
        return rank_prep(
            ds,
            inputs_fn=lambda ex: tf.fill([3], ex["premise"]),
            targets_fn=lambda ex: ex["choices"],
            is_correct_fn=lambda ex: tf.equal(tf.range(3), tf.cast(ex["label"], tf.int32)),
        )

    task = tt.Task(
        "rank_mc",
        source,
        {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)},
        preprocessors=[expand, tt.tokenize],
        postprocess_fn=rank_classification_postprocessor,
        metric_fns=[metrics.rank_classification],
    )
    rows = list(task.get_dataset(split="validation", shuffle=False).as_numpy_iterator())
    assert [tuple(r["idx"]) for r in rows] == [(i, k) for i in range(3) for k in range(3)]
    assert [bool(r["is_correct"]) for r in rows[3:6]] == [False, True, False]
    known = {(b"sky", b"blue"): -1.0, (b"grass", b"green"): -1.0, (b"blood", b"red"): -1.0}
    scores = [known.get((r["inputs_pretokenized"], r["targets_pretokenized"]), -5.0) for r in rows]
    targets = [rank_classification_postprocessor(None, example=r, is_target=True) for r in rows]
    assert targets[4] == ((1, 1), True, 1.0, 5)
    assert metrics.rank_classification(targets, scores)["accuracy"] == pytest.approx(200 / 3)
    got = metrics.rank_classification(targets, scores, num_classes=3)
    assert got["accuracy"] == pytest.approx(200 / 3)
    # classes 0,1,2: gold [0,1,1], predicted [0,1,2]: F1 = 1, 2/3, 0
    assert got["mean_3class_f1"] == pytest.approx(100 * (1 + 2 / 3 + 0) / 3)
    train = rank_prep(
        source.get_dataset("validation", shuffle=False),
        inputs_fn=lambda ex: tf.fill([3], ex["premise"]),
        targets_fn=lambda ex: ex["choices"],
        is_correct_fn=lambda ex: tf.equal(tf.range(3), tf.cast(ex["label"], tf.int32)),
        mode="train",
    )
    assert [r["targets"] for r in train.as_numpy_iterator()] == [b"blue", b"green", b"green"]
    with pytest.raises(ValueError, match="mode"):
        rank_prep(source.get_dataset("validation"), None, None, None, mode="test")
