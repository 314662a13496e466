"""The built-in prompted multiple-choice tasks (builtin_mc_*): data, prompts, rows and metric."""

from __future__ import annotations

import numpy as np
import pytest
from tasks_testlib import PadConverter

import t5x.tasks as tt
from t5x.tasks.builtin import MC_DATASETS, MC_PROMPTS, NUM_CHOICES
from t5x.tasks.builtin._synthetic import _PLACES


def test_every_dataset_and_prompt_is_registered_with_mixtures():
    assert len(tt.BUILTIN_MC_TASKS) == sum(len(p) for p in MC_PROMPTS.values()) == 9
    for name in tt.BUILTIN_MC_TASKS:
        task = tt.get_mixture_or_task(name)
        assert set(task.splits) == {"validation", "test"}
        assert [f.__name__ for f in task.score_metric_fns] == ["rank_classification"]
        assert not task.predict_metric_fns
    assert [t.name for t in tt.get_mixture_or_task("builtin_mc").tasks] == list(tt.BUILTIN_MC_TASKS)
    for dataset, prompts in MC_PROMPTS.items():
        members = [t.name for t in tt.get_mixture_or_task(f"builtin_mc_{dataset}").tasks]
        assert members == [f"builtin_mc_{dataset}_{p}" for p in prompts]
    assert set(tt.BUILTIN_MC_MIXTURES) == {"builtin_mc", *(f"builtin_mc_{d}" for d in MC_DATASETS)}


@pytest.mark.parametrize("dataset", list(MC_DATASETS))
def test_examples_are_deterministic_and_well_formed(dataset):
    examples = tt.make_mc_examples(dataset, "validation")
    assert examples == tt.make_mc_examples(dataset, "validation")
    assert examples != tt.make_mc_examples(dataset, "test")
    assert len(examples) == 100
    labels = [ex["label"] for ex in examples]
    # The right option lands everywhere, so position alone cannot score well.
    assert set(labels) == set(range(NUM_CHOICES))
    for ex in examples:
        choices, right = ex["choices"], ex["choices"][ex["label"]]
        assert len(choices) == NUM_CHOICES and len(set(choices)) == NUM_CHOICES
        if dataset == "addition":
            assert right == str(int(ex["a"]) + int(ex["b"]))
        elif dataset == "copy":
            assert right == ex["words"]
            for wrong in choices:
                if wrong != right:
                    assert sum(a != b for a, b in zip(wrong.split(), right.split(), strict=True)) == 1
        else:
            places = {p + "." for p in _PLACES}
            assert right in places
            shuffles = [sorted(p.split()) for p in _PLACES]
            for wrong in choices:
                if wrong != right:
                    assert wrong not in places and sorted(wrong.rstrip(".").split()) in shuffles


def test_unknown_dataset_or_split_is_refused():
    with pytest.raises(ValueError, match=r"unknown multiple-choice dataset 'nope'"):
        tt.make_mc_examples("nope", "validation")
    with pytest.raises(ValueError, match=r"unknown split 'train'"):
        tt.make_mc_examples("copy", "train")


def test_rows_render_the_prompt_and_each_option(vocab):
    task = tt.get_mixture_or_task("builtin_mc_addition_question")
    rows = list(task.get_dataset(None, split="validation", shuffle=False).take(8).as_numpy_iterator())
    examples = tt.make_mc_examples("addition", "validation", 2)
    for i, row in enumerate(rows):
        ex = examples[i // NUM_CHOICES]
        option = i % NUM_CHOICES
        prompt = f"What is {ex['a']} plus {ex['b']}? Answer:"
        assert row["idx"].tolist() == [i // NUM_CHOICES, option]
        assert row["inputs_pretokenized"].decode() == prompt
        assert row["targets_pretokenized"].decode() == " " + ex["choices"][option]
        assert bool(row["is_correct"]) == (option == ex["label"])
        # No EOS: an option is scored as the plain continuation of the prompt.
        assert row["inputs"].tolist() == vocab.encode(prompt)
        assert row["targets"].tolist() == vocab.encode(" " + ex["choices"][option])


def test_evaluator_picks_the_best_scored_option():
    # A stand-in model that prefers short options: the accuracy must be that of "pick the shortest".
    examples = tt.make_mc_examples("sentence_completion", "validation", 10)
    evaluator = tt.Evaluator(
        "builtin_mc_sentence_completion_plain", PadConverter(), num_examples=40, batch_size=6
    )

    def score_fn(batch):
        return -(batch["targets"] > 0).sum(axis=1).astype(np.float64)

    result = evaluator.evaluate(compute_metrics=True, score_fn=score_fn).result()
    evaluator.close()
    lengths = np.asarray([[len(vocab_bytes(" " + c)) for c in ex["choices"]] for ex in examples])
    expected = 100.0 * np.mean(np.argmin(lengths, axis=1) == np.asarray([ex["label"] for ex in examples]))
    assert result["builtin_mc_sentence_completion_plain"]["accuracy"] == pytest.approx(expected)


def vocab_bytes(text: str) -> bytes:
    return text.encode("utf-8")
