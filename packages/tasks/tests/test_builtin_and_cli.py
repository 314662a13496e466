import numpy as np
import pytest
from tasks_testlib import PadConverter, take

import t5x.tasks as tt
from t5x.tasks._cli import main


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("synthetic_reverse", lambda i, t: " ".join(reversed(i.removeprefix("reverse: ").split())) == t),
        ("synthetic_copy", lambda i, t: i.removeprefix("copy: ") == t),
        ("synthetic_sort_digits", lambda i, t: sorted(i.removeprefix("sort: ").split()) == t.split()),
        ("synthetic_add", lambda i, t: sum(int(x) for x in i.removeprefix("add: ").split(" + ")) == int(t)),
    ],
)
def test_synthetic_problems_are_correct_and_deterministic(name, check):
    task = tt.get_mixture_or_task(name)
    vocab = task.output_features["targets"].vocabulary
    rows = take(task.get_dataset({"inputs": 256, "targets": 256}, split="validation", shuffle=False), 20)
    for row in rows:
        assert row["inputs"][-1] == vocab.eos_id and row["targets"][-1] == vocab.eos_id
        assert check(vocab.decode(row["inputs"].tolist()), vocab.decode(row["targets"].tolist()))
    again = take(task.get_dataset({"inputs": 256, "targets": 256}, split="validation", shuffle=False), 20)
    assert all(np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(rows, again, strict=True))
    assert task.num_input_examples("train") == 20_000


def test_metrics():
    assert tt.exact_match(["a b", "c"], ["a b", "d"]) == {"exact_match": 50.0}
    assert tt.token_accuracy(["a b c"], ["a x c"]) == {"token_accuracy": pytest.approx(200 / 3)}
    task = tt.get_mixture_or_task("synthetic_add")
    assert task.postprocess_fn(b" 42 ") == "42"
    assert tt.exact_match in task.predict_metric_fns


def test_corpus_is_generated_deterministically():
    assert tt.generate_corpus(3, seed=1) == tt.generate_corpus(3, seed=1)
    assert tt.generate_corpus(3, seed=1) != tt.generate_corpus(3, seed=2)
    assert all(d.endswith(".") and "\n" not in d for d in tt.generate_corpus(10))


def test_corpus_pretraining_tasks_feed_iterators():
    lengths = {"inputs": 128, "targets": 32}
    it = tt.BatchIterator("synthetic_corpus_span_corruption", PadConverter(), lengths, 4, block_size=16)
    batch = next(it)
    vocab = tt.builtin_vocabulary()
    assert batch["inputs"].shape == (4, 128)
    assert (batch["inputs"] >= vocab.vocab_size - 100).any()
    lm = tt.BatchIterator("synthetic_corpus_lm", PadConverter(), {"targets": 64}, 2, block_size=8)
    assert next(lm)["targets"].shape == (2, 64)
    mix = tt.BatchIterator(
        "synthetic_text_to_text", PadConverter(), {"inputs": 32, "targets": 32}, 8, block_size=16
    )
    assert next(mix)["inputs"].shape == (8, 32)


def test_cli_list_and_inspect(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "synthetic_reverse" in out and "synthetic_text_to_text" in out
    assert main(["inspect", "synthetic_add", "--split", "validation", "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- example") == 2
    assert "inputs: ids" in out and "text: 'add: " in out and "inputs_pretokenized: 'add: " in out
    assert main(["inspect", "synthetic_addd"]) == 2
    assert "synthetic_add" in capsys.readouterr().err
