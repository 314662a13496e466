"""What train, eval and infer print when stdout is not a terminal, and how the demo decodes."""

import io
import re

import gin
import numpy as np

from t5x.launch._cli import main
from t5x.launch._inference import DecodeProgress

SMALL = [
    "--gin.models.T5Config.emb_dim=32",
    "--gin.models.T5Config.mlp_dim=64",
    "--gin.models.T5Config.num_heads=2",
    "--gin.models.T5Config.head_dim=16",
    "--gin.models.T5Config.num_encoder_layers=1",
    "--gin.models.T5Config.num_decoder_layers=1",
]
# The demo's own run file, shrunk: 6 steps, a line every 2, 16 examples decoded in batches of 8.
TINY_DEMO = [
    "--gin_file=runs/demo.gin",
    *SMALL,
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
    "--gin.BATCH_SIZE=8",
    "--gin.TRAIN_STEPS=6",
    "--gin.CHECKPOINT_PERIOD=3",
    "--gin.launch.train.log_period=2",
    "--gin.launch.train.max_inference_examples=16",
    "--gin.launch.train.show_predictions=1",
    "--gin.infer_eval/launch.DatasetConfig.batch_size=8",
]


def test_train_prints_a_line_per_log_period_and_names_the_files_it_wrote(tmp_path, capsys):
    model_dir = tmp_path / "run"
    assert main(["train", *TINY_DEMO, f"--gin.MODEL_DIR={model_dir}"]) == 0
    lines = capsys.readouterr().out.splitlines()  # captured: not a terminal

    # absl-py log lines: "I1202 18:40:00.123456 1234 _writers.py:207] step 2/6 | loss ..."
    step_line = r"I\d{4} .*\] step \d+/6 \| loss [\d.]+ \| "
    progress = [i for i, line in enumerate(lines) if re.match(step_line, line)]
    steps = [lines[i].split("] ", 1)[1].split(" |")[0] for i in progress]
    assert steps == ["step 2/6", "step 4/6", "step 6/6"], lines
    assert all(re.search(r"(tok/s|steps/s)", lines[i]) for i in progress), lines
    assert "\r" not in "".join(lines) and "\x1b" not in "".join(lines)
    decoding = [i for i, line in enumerate(lines) if line.startswith("[decode] synthetic_sort_digits:")]
    assert [lines[i] for i in decoding] == [
        "[decode] synthetic_sort_digits: decoded 8/16 examples",
        "[decode] synthetic_sort_digits: decoded 16/16 examples",
    ], lines
    (accuracy,) = [
        i for i, line in enumerate(lines) if line.startswith("[inference eval] step 6: synthetic_sort_digits")
    ]
    (finished,) = [i for i, line in enumerate(lines) if line.startswith("[t5x-launch] finished at step 6")]
    # Progress comes as training goes: every step line before decoding, decoding before its result.
    assert max(progress) < min(decoding) and max(decoding) < accuracy < finished

    last = lines[-1]
    assert last.startswith(f"[t5x-launch] files in {model_dir}: "), lines[-3:]
    named = last.split(": ", 1)[1].split(", ")
    for entry in ("checkpoint_3/", "checkpoint_6/", "config.gin", "metrics.jsonl", "model-info.txt"):
        assert entry in named, named
    assert "inference_eval/synthetic_sort_digits-000006.jsonl" in named
    assert "inference_eval/synthetic_sort_digits-metrics.jsonl" in named
    assert any(name.startswith("train/events.out.tfevents.") for name in named), named
    on_disk = {p.name for p in model_dir.iterdir() if p.is_file()}
    assert on_disk <= set(named), (on_disk, named)


def test_eval_shows_decoding_progress_and_names_its_files(trained_run, tmp_path, capsys):
    model_dir, _ = trained_run  # the session's shared run of this model (conftest): read only
    out_dir = tmp_path / "eval"
    common = [
        "--gin_file=models/demo/tiny.gin",
        *SMALL,
        "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
        "--gin.BATCH_SIZE=8",
    ]
    capsys.readouterr()
    evaluate = [
        *common,
        "--gin_file=runs/eval.gin",
        "--gin.SPLIT='validation'",
        "--gin.launch.evaluate.max_examples=24",
        f"--gin.CHECKPOINT_PATH={model_dir}",
        f"--gin.EVAL_OUTPUT_DIR={out_dir}",
    ]
    assert main(["eval", *evaluate]) == 0
    lines = capsys.readouterr().out.splitlines()
    decoding = [line for line in lines if line.startswith("[decode] synthetic_copy:")]
    assert decoding[0] == "[decode] synthetic_copy: decoded 8/24 examples", lines
    assert decoding[-1] == "[decode] synthetic_copy: decoded 24/24 examples", lines
    assert lines[-1].startswith(f"[t5x-launch] files in {out_dir}: ") and "config.gin" in lines[-1], lines


def _batches(sizes):
    return [{"decoder_target_tokens": np.ones((n, 4), np.int32)} for n in sizes]


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_decode_progress_lines_when_not_a_terminal_and_a_live_line_on_one(monkeypatch):
    import t5x.launch._inference as inference

    log = io.StringIO()
    monkeypatch.setattr(inference, "DECODE_PROGRESS_SECONDS", 0.0)  # a line after every batch
    assert len(list(DecodeProgress(_batches([4, 4, 2]), "t", stream=log))) == 3
    assert log.getvalue().splitlines() == [
        "[decode] t: decoded 4 examples",
        "[decode] t: decoded 8 examples",
        "[decode] t: decoded 10 examples",
    ]
    monkeypatch.setattr(inference, "DECODE_PROGRESS_SECONDS", 3600.0)  # the first and the last only
    log = io.StringIO()
    list(DecodeProgress(_batches([4] * 5), "t", total=32, verb="scored", stream=log))
    # A split shorter than the total ends with its own count.
    assert log.getvalue().splitlines() == [
        "[decode] t: scored 4/32 examples",
        "[decode] t: scored 20 examples",
    ]
    tty = _Tty()
    list(DecodeProgress(_batches([4, 4]), "t", total=8, stream=tty))
    assert (
        tty.getvalue()
        == "\r\x1b[2K[decode] t: decoded 4/8 examples\r\x1b[2K[decode] t: decoded 8/8 examples\n"
    )


def test_decode_progress_keeps_the_iterator_resumable():
    class Resumable:
        def __init__(self):
            self.items, self.position = _batches([2, 2, 2]), 0

        def __iter__(self):
            return self

        def __next__(self):
            if self.position == len(self.items):
                raise StopIteration
            self.position += 1
            return self.items[self.position - 1]

        def get_state(self):
            return {"position": self.position}

        def set_state(self, state):
            self.position = state["position"]

    wrapped = iter(DecodeProgress(Resumable(), "t", stream=io.StringIO()))
    wrapped.set_state({"position": 2})
    assert len(list(wrapped)) == 1 and wrapped.get_state() == {"position": 3}
    assert not hasattr(DecodeProgress([], "t"), "get_state")  # a plain iterator stays plain


def test_demo_decodes_greedily():
    import jax

    from t5x.launch import GinArgs, parse_gin
    from t5x.launch._gin_config import macro_value

    small = tuple(flag.removeprefix("--gin.").replace("=", " = ", 1) for flag in SMALL)
    parse_gin(GinArgs(bindings=small), default_files=["runs/demo.gin"])
    try:
        assert gin.query_parameter("decoding.temperature_sample.temperature") == 0.0
        model = macro_value("MODEL")
        model = model.scoped_configurable_fn() if hasattr(model, "scoped_configurable_fn") else model
        shapes = {"encoder_input_tokens": (4, 12), "decoder_input_tokens": (4, 12)}
        params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
        rows = np.arange(4)[:, None]
        batch = {
            "encoder_input_tokens": (3 + (rows * 7 + np.arange(12)) % 50).astype(np.int32),
            "decoder_input_tokens": np.zeros((4, 12), np.int32),
            "decoder_target_tokens": np.zeros((4, 12), np.int32),
        }

        def decode(seed, **decoder_params):
            rng = jax.random.PRNGKey(seed)
            return np.asarray(model.predict_batch_with_aux(params, batch, rng, decoder_params or None)[0])

        # Greedy: the sampling seed changes nothing; at temperature 1 it does (the check can fail).
        np.testing.assert_array_equal(decode(1), decode(2))
        assert not np.array_equal(decode(1, temperature=1.0), decode(2, temperature=1.0))
    finally:
        gin.clear_config()
