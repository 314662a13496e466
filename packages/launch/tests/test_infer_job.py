"""`t5x-launch infer` end to end on a tiny trained model: lines with inputs, one file per task,
shards, resuming after a kill, and ad-hoc inputs from files."""

import json

import pytest

from t5x.launch._cli import main

pytestmark = pytest.mark.slow  # about ten short inference jobs on the session's trained tiny model

TINY = [
    "--gin_file=models/demo/tiny.gin",
    "--gin.models.T5Config.emb_dim=32",
    "--gin.models.T5Config.mlp_dim=64",
    "--gin.models.T5Config.num_heads=2",
    "--gin.models.T5Config.head_dim=16",
    "--gin.models.T5Config.num_encoder_layers=1",
    "--gin.models.T5Config.num_decoder_layers=1",
]
LENGTHS = "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}"
PLAIN = [{"inputs": f"item {i}", "targets": f"t{i}"} for i in range(5)]
TAGGED = [{"inputs": f"tag {i} {'x' * i}", "targets": f" x{i} "} for i in range(6)]


def _tagging_postprocess(text, example=None, is_target=False):
    # Not the identity, so that a line shows it ran: the text, stripped, with its length.
    return {"text": text.strip(), "length": len(text.strip()), "target": is_target}


def _register_tasks():
    import t5x.tasks

    vocabulary = t5x.tasks.builtin_vocabulary()
    features = {
        "inputs": t5x.tasks.Feature(vocabulary, add_eos=True),
        "targets": t5x.tasks.Feature(vocabulary, add_eos=True),
    }
    prep = [t5x.tasks.tokenize, t5x.tasks.append_eos_after_trim]
    for name, rows, post in (
        ("infer_job_plain", PLAIN, None),
        ("infer_job_tagged", TAGGED, _tagging_postprocess),
    ):
        if name not in t5x.tasks.TaskRegistry.names():
            t5x.tasks.TaskRegistry.add(
                name,
                t5x.tasks.InMemoryDataSource({"test": rows}),
                output_features=features,
                preprocessors=prep,
                postprocess_fn=post,
            )
    if "infer_job_mix" not in t5x.tasks.MixtureRegistry.names():
        t5x.tasks.MixtureRegistry.add(
            "infer_job_mix", ["infer_job_plain", "infer_job_tagged"], default_rate=1.0
        )


@pytest.fixture(scope="module")
def checkpoint(trained_run):
    """Step 2 of the session's shared run (conftest's `trained_run`, trained with other lengths:
    the parameters do not depend on them). Read only: every job writes elsewhere."""
    model_dir, _ = trained_run
    _register_tasks()
    return model_dir / "checkpoint_2"


def _infer(checkpoint, out, *extra):
    return main(
        [
            "infer",
            *TINY,
            "--gin_file=runs/infer.gin",
            LENGTHS,
            "--gin.BATCH_SIZE=4",
            f"--gin.CHECKPOINT_PATH={checkpoint}",
            f"--gin.INFER_OUTPUT_DIR={out}",
            *extra,
        ]
    )


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def mixture_out(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("mix")
    assert _infer(checkpoint, out, "--gin.MIXTURE_OR_TASK_NAME=infer_job_mix") == 0
    return out


def test_a_mixture_gets_one_file_per_task_with_inputs_targets_and_postprocessed_predictions(
    mixture_out, capsys
):
    plain = _lines(mixture_out / "infer_job_plain-predict.jsonl-00000-of-00001")
    tagged = _lines(mixture_out / "infer_job_tagged-predict.jsonl-00000-of-00001")
    assert [r["inputs"] for r in plain] == [
        {"inputs_pretokenized": r["inputs"], "targets_pretokenized": r["targets"]} for r in PLAIN
    ]
    assert [r["index"] for r in plain] == list(range(len(PLAIN)))
    assert [r["target"] for r in plain] == [r["targets"] for r in PLAIN]
    assert all(isinstance(r["prediction"], str) and isinstance(r["aux"]["scores"], float) for r in plain)
    # The tagged task's postprocess_fn turned both the target and the decoded prediction into dicts.
    assert [r["inputs"]["inputs_pretokenized"] for r in tagged] == [r["inputs"] for r in TAGGED]
    assert [r["target"] for r in tagged] == [
        {"text": r["targets"].strip(), "length": len(r["targets"].strip()), "target": True} for r in TAGGED
    ]
    for r in tagged:
        assert r["prediction"]["target"] is False
        assert r["prediction"]["length"] == len(r["prediction"]["text"])


def test_the_job_prints_progress_and_names_every_file_it_wrote(checkpoint, tmp_path, capsys):
    assert (
        _infer(checkpoint, tmp_path, "--gin.MIXTURE_OR_TASK_NAME=infer_job_mix", "--gin.INFER_MODE='score'")
        == 0
    )
    out = capsys.readouterr().out
    assert "[decode] infer_job_plain: scored 5/5 examples" in out
    assert "[decode] infer_job_tagged: scored 6/6 examples" in out
    last = out.strip().splitlines()[-1]
    named = last.removeprefix("[t5x-launch] wrote ").split(", ")
    expected = sorted(str(p) for p in tmp_path.iterdir())
    assert sorted(named) == expected
    assert len(expected) == 5  # two outputs, their .COMPLETED markers, config.gin
    scores = _lines(tmp_path / "infer_job_plain-score.jsonl-00000-of-00001")
    assert all(r["score"] < 0 and "prediction" not in r for r in scores)


def test_shards_of_two_jobs_together_are_the_unsharded_output(checkpoint, mixture_out, tmp_path):
    for shard in (0, 1):
        flags = [
            "--gin.MIXTURE_OR_TASK_NAME=infer_job_plain",
            f"--gin.infer.shard_id={shard}",
            "--gin.infer.num_shards=2",
        ]
        assert _infer(checkpoint, tmp_path, *flags) == 0
    parts = [_lines(tmp_path / f"infer_job_plain-predict.jsonl-0000{s}-of-00002") for s in (0, 1)]
    assert len(parts[0]) == 3 and len(parts[1]) == 2
    whole = _lines(mixture_out / "infer_job_plain-predict.jsonl-00000-of-00001")
    # Greedy decoding: the same prediction whichever batch an example is in; scores to rounding.
    for part in parts:
        for row in part:
            twin = next(w for w in whole if w["inputs"] == row["inputs"])
            assert row["prediction"] == twin["prediction"]
            assert row["aux"]["scores"] == pytest.approx(twin["aux"]["scores"], rel=1e-4)
    assert sorted(json.dumps(r["inputs"]) for p in parts for r in p) == sorted(
        json.dumps(r["inputs"]) for r in whole
    )


def test_a_killed_job_resumes_from_its_last_chunk(checkpoint, mixture_out, tmp_path, monkeypatch, capsys):
    import t5x.tasks

    real_next = t5x.tasks.ExampleBatches.__next__
    served = []

    def dies_at_the_second_batch(self):
        if len(served) == 1:
            raise RuntimeError("killed")  # the process dies here
        served.append(1)
        return real_next(self)

    flags = [
        "--gin.MIXTURE_OR_TASK_NAME=infer_job_plain",
        "--gin.infer.checkpoint_period=1",
    ]
    monkeypatch.setattr(t5x.tasks.ExampleBatches, "__next__", dies_at_the_second_batch)
    with pytest.raises(RuntimeError, match="killed"):
        _infer(checkpoint, tmp_path, *flags)
    output = tmp_path / "infer_job_plain-predict.jsonl-00000-of-00001"
    assert not output.exists()
    kept = sorted(p.name for p in (tmp_path / f"{output.name}.parts").glob("part-*.jsonl"))
    assert kept == ["part-00000.jsonl"]  # the first batch's chunk
    monkeypatch.setattr(t5x.tasks.ExampleBatches, "__next__", real_next)
    capsys.readouterr()
    assert _infer(checkpoint, tmp_path, *flags) == 0
    assert "[decode] infer_job_plain: decoded 1 examples" in capsys.readouterr().out  # only the rest
    resumed = _lines(output)
    assert [r["index"] for r in resumed] == list(range(5))
    whole = _lines(mixture_out / "infer_job_plain-predict.jsonl-00000-of-00001")
    assert [r["inputs"] for r in resumed] == [r["inputs"] for r in whole]
    assert [r["prediction"] for r in resumed] == [r["prediction"] for r in whole]


def test_adhoc_json_lines_inputs_need_no_registered_task(checkpoint, mixture_out, tmp_path):
    questions = tmp_path / "my_questions.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"question": r["inputs"], "answer": r["targets"], "id": i}) + "\n"
            for i, r in enumerate(PLAIN)
        )
    )
    out = tmp_path / "out"
    flags = [
        f"--gin.INFER_INPUT_FILES={questions}",
        "--gin.launch.infer.inputs_key=question",
        "--gin.launch.infer.targets_key=answer",
        "--gin.launch.infer.input_fields_to_include=['inputs']",
    ]
    assert _infer(checkpoint, out, *flags) == 0
    rows = _lines(out / "infer_my_questions-predict.jsonl-00000-of-00001")
    assert [r["inputs"]["inputs_pretokenized"] for r in rows] == [r["inputs"] for r in PLAIN]
    assert [r["target"] for r in rows] == [r["targets"] for r in PLAIN]
    # input_fields_to_include=['inputs']: the tokens and their text, not the targets'.
    assert all(set(r["inputs"]) == {"inputs", "inputs_pretokenized"} for r in rows)
    assert all(r["inputs"]["inputs"][-1] == 1 for r in rows)  # EOS appended
    # Same text, same tokenization, same model: the registered task's predictions.
    whole = _lines(mixture_out / "infer_job_plain-predict.jsonl-00000-of-00001")
    assert [r["prediction"] for r in rows] == [r["prediction"] for r in whole]


def test_bad_shard_numbers_and_missing_data_are_named(checkpoint, tmp_path, capsys):
    flags = [
        "--gin.MIXTURE_OR_TASK_NAME=infer_job_plain",
        "--gin.infer.shard_id=2",
        "--gin.infer.num_shards=2",
    ]
    assert _infer(checkpoint, tmp_path, *flags) == 2
    assert "infer.shard_id must be an int in [0, 1] (num_shards=2), got 2" in capsys.readouterr().err
    assert _infer(checkpoint, tmp_path) == 2
    err = capsys.readouterr().err
    assert "set MIXTURE_OR_TASK_NAME" in err and "or INFER_INPUT_FILES" in err


def test_a_bad_record_of_the_input_files_is_named_with_its_line(checkpoint, tmp_path, capsys):
    inputs = tmp_path / "asks.jsonl"
    inputs.write_text(json.dumps({"inputs": "fine"}) + "\n" + json.dumps({"text": "no inputs"}) + "\n")
    assert _infer(checkpoint, tmp_path / "out", f"--gin.INFER_INPUT_FILES={inputs}") == 2
    assert f"{inputs}:2: the record lacks field 'inputs'" in capsys.readouterr().err
