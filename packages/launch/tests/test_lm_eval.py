"""The lm-evaluation-harness adapter: lm-eval's own evaluator on a local task, checked against our scores.

Needs the ``lm-eval`` extra (``pip install --find-links dist 't5x-launch[lm-eval]'``); skipped without it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

pytest.importorskip(
    "lm_eval", reason="lm-eval is not installed: pip install --find-links dist 't5x-launch[lm-eval]'"
)

import t5x.tasks as tt
from t5x import models
from t5x.checkpointing import save_t5x_checkpoint
from t5x.launch import evaluate_zero_shot, load_checkpoint_params, model_from_gin
from t5x.launch._cli import main

NUM_EXAMPLES = 6
TASK = "t5x_local_copy"
# lm-eval renders the prompt "copy: <words>" and puts target_delimiter " " before each
# choice: the same strings as the built-in task builtin_mc_copy_copy.
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {data}
output_type: multiple_choice
validation_split: validation
doc_to_text: "copy: {{{{words}}}}"
doc_to_target: label
doc_to_choice: choices
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
TINY_GIN = """
include 'models/demo/tiny.gin'
models.T5Config.emb_dim = 16
models.T5Config.head_dim = 8
models.T5Config.mlp_dim = 32
models.T5Config.num_encoder_layers = 1
models.T5Config.num_decoder_layers = 1
"""


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # The local JSON task must never reach the Hugging Face hub.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    examples = tt.make_mc_examples("copy", "validation", NUM_EXAMPLES)
    data = folder / "copy.jsonl"
    data.write_text("".join(json.dumps(ex) + "\n" for ex in examples))
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=data))
    return folder


def decoder_model(bidirectional: bool):
    config = models.DecoderOnlyConfig(
        vocab_size=384, emb_dim=16, num_heads=2, head_dim=8, num_layers=2, mlp_dim=32, dropout_rate=0.0
    )
    model = models.DecoderOnlyModel(
        config, tt.builtin_vocabulary(), inputs_bidirectional_attention=bidirectional
    )
    params = model.get_initial_variables(jax.random.PRNGKey(0), {"decoder_input_tokens": (1, 8)})["params"]
    return model, params


def _ours(model, params) -> tuple[np.ndarray, float]:
    """Each option's log-likelihood from score_batch on hand-made rows, and our zero-shot accuracy."""
    vocab = tt.builtin_vocabulary()
    examples = tt.make_mc_examples("copy", "validation", NUM_EXAMPLES)
    encoder_decoder = isinstance(model, models.EncoderDecoderModel)
    length = 96
    rows = []
    for ex in examples:
        prompt = list(vocab.encode(f"copy: {ex['words']}"))
        for choice in ex["choices"]:
            target = list(vocab.encode(" " + choice))
            if encoder_decoder:
                row = {"encoder_input_tokens": prompt, "decoder_target_tokens": target}
                row["decoder_input_tokens"] = [0, *target[:-1]]
                row["decoder_loss_weights"] = [1] * len(target)
            else:
                seq = prompt + target
                row = {"decoder_target_tokens": seq, "decoder_input_tokens": [0, *seq[:-1]]}
                row["decoder_loss_weights"] = [0] * len(prompt) + [1] * len(target)
                row["decoder_causal_attention"] = [1] * (len(prompt) + 1)
            rows.append({k: np.asarray(v + [0] * (length - len(v)), np.int32) for k, v in row.items()})
    batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    scores = np.asarray(model.score_batch(params, batch)).reshape(NUM_EXAMPLES, -1)
    zero_shot = evaluate_zero_shot(model, params, ["builtin_mc_copy_copy"], num_examples=NUM_EXAMPLES)
    return scores, zero_shot.per_prompt["builtin_mc_copy_copy"]


def _check_against_ours(results, model, params) -> None:
    scores, zero_shot_accuracy = _ours(model, params)
    labels = np.asarray([ex["label"] for ex in tt.make_mc_examples("copy", "validation", NUM_EXAMPLES)])
    accuracy = float(np.mean(scores.argmax(1) == labels))
    assert results["results"][TASK]["acc,none"] == pytest.approx(accuracy)
    assert 100.0 * results["results"][TASK]["acc,none"] == pytest.approx(zero_shot_accuracy)
    samples = sorted(results["samples"][TASK], key=lambda s: s["doc_id"])
    theirs = np.asarray([[float(r[0]) for r in s["filtered_resps"]] for s in samples])
    np.testing.assert_allclose(theirs, scores, rtol=1e-4, atol=1e-4)


def test_t5x_is_registered_without_importing_lm_eval_models_code():
    code = (
        "import sys, t5x.launch\n"
        "assert 'lm_eval.api.model' not in sys.modules, 'lm_eval.api.model imported eagerly'\n"
        "from lm_eval.api.registry import get_model\n"
        "from lm_eval.api.registry import model_registry\n"
        "print(get_model('t5x').__name__, 'dummy' in model_registry)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    # lm-eval's own names are still there (its registry fills them only when it starts empty).
    assert out.stdout.split() == ["T5xLM", "True"]


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal_decoder", "non_causal_decoder"])
def test_lm_eval_evaluator_on_a_local_task_decoder_only(task_dir, tmp_path, bidirectional):
    from t5x.launch import T5xLM
    from t5x.launch._lm_eval import run_lm_eval

    model, params = decoder_model(bidirectional)
    save_t5x_checkpoint(tmp_path / "run", 3, {"target": params, "state": {"step": 3}})
    restored = load_checkpoint_params(model, str(tmp_path / "run"))
    lm = T5xLM(model, restored, batch_size=5)
    results = run_lm_eval(lm, [TASK], include_path=[str(task_dir)])
    _check_against_ours(results, model, restored)


def test_lm_eval_evaluator_builds_the_model_from_its_arguments(task_dir, tmp_path):
    from lm_eval.api.registry import get_model

    from t5x.launch._lm_eval import run_lm_eval

    gin_file = tmp_path / "tiny.gin"
    gin_file.write_text(TINY_GIN)
    model = model_from_gin([str(gin_file)])
    shapes = {"encoder_input_tokens": (1, 8), "decoder_input_tokens": (1, 8)}
    params = model.get_initial_variables(jax.random.PRNGKey(4), shapes)["params"]
    save_t5x_checkpoint(tmp_path / "run", 2, {"target": params, "state": {"step": 2}})
    # What `lm_eval --model t5x --model_args gin_file=...,checkpoint=...` does.
    lm = get_model("t5x").create_from_arg_string(
        f"gin_file={gin_file},checkpoint={tmp_path / 'run'}", {"batch_size": 4}
    )
    assert lm.batch_size == 4
    results = run_lm_eval(lm, [TASK], include_path=[str(task_dir)])
    _check_against_ours(results, model, load_checkpoint_params(model, str(tmp_path / "run")))


def test_cli_lm_eval(task_dir, tmp_path, capsys):
    model, params = decoder_model(False)
    save_t5x_checkpoint(tmp_path / "run", 1, {"target": params, "state": {"step": 1}})
    gin_file = tmp_path / "causal.gin"
    gin_file.write_text(
        "from __gin__ import dynamic_registration\nfrom t5x import models\nfrom t5x import tasks\n"
        "MODEL = @models.DecoderOnlyModel()\nmodels.DecoderOnlyModel.config = @models.DecoderOnlyConfig()\n"
        "models.DecoderOnlyModel.vocabulary = @tasks.builtin_vocabulary()\n"
        "models.DecoderOnlyConfig:\n  vocab_size = 384\n  emb_dim = 16\n  num_heads = 2\n  head_dim = 8\n"
        "  num_layers = 2\n  mlp_dim = 32\n  dropout_rate = 0.0\n"
    )
    out = tmp_path / "results.json"
    argv = ["lm-eval", f"--gin_file={gin_file}", f"--checkpoint={tmp_path / 'run'}", f"--tasks={TASK}"]
    assert main([*argv, f"--include_path={task_dir}", f"--output_path={out}"]) == 0
    assert TASK in capsys.readouterr().out
    scores, _ = _ours(model, params)
    labels = np.asarray([ex["label"] for ex in tt.make_mc_examples("copy", "validation", NUM_EXAMPLES)])
    assert json.loads(out.read_text())[TASK]["acc,none"] == pytest.approx(
        float(np.mean(scores.argmax(1) == labels))
    )


def _instance(kind: str, args: tuple):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def _causal_log_likelihood(model, params, context: list[int], target: list[int]) -> float:
    seq = context + target
    pad = 64 - len(seq)
    batch = {
        "decoder_target_tokens": np.asarray([seq + [0] * pad], np.int32),
        "decoder_input_tokens": np.asarray([[0, *seq[:-1]] + [0] * pad], np.int32),
        "decoder_loss_weights": np.asarray([[0] * len(context) + [1] * len(target) + [0] * pad], np.int32),
    }
    return float(np.asarray(model.score_batch(params, batch))[0])


def test_loglikelihood_rolling_scores_every_token_once():
    from t5x.launch import T5xLM

    model, params = decoder_model(False)
    text = "the quick brown fox jumps"
    ids = list(tt.builtin_vocabulary().encode(text))
    whole = T5xLM(model, params).loglikelihood_rolling([_instance("loglikelihood_rolling", (text,))])
    assert whole[0] == pytest.approx(_causal_log_likelihood(model, params, [], ids), rel=1e-5)
    # Windows of 10 tokens: [0:10] and [10:20] alone, then [20:25] after the 5 tokens before it.
    windowed = T5xLM(model, params, max_length=10).loglikelihood_rolling(
        [_instance("loglikelihood_rolling", (text,))]
    )
    expected = (
        _causal_log_likelihood(model, params, [], ids[:10])
        + _causal_log_likelihood(model, params, [], ids[10:20])
        + _causal_log_likelihood(model, params, ids[15:20], ids[20:])
    )
    assert windowed[0] == pytest.approx(expected, rel=1e-5)


def test_generate_until_is_greedy_and_stops_at_the_stop_string():
    from t5x.launch import T5xLM

    model, params = decoder_model(False)
    vocab = tt.builtin_vocabulary()
    prompt = "copy: apple river"
    seq = list(vocab.encode(prompt))
    generated: list[int] = []
    for _ in range(6):
        inputs = [0, *seq, *generated]
        # Targets mark the real positions (the attention mask); the last one is a placeholder.
        targets = [*seq, *generated, 1]
        batch = {
            "decoder_input_tokens": np.asarray([inputs + [0] * (64 - len(inputs))], np.int32),
            "decoder_target_tokens": np.asarray([targets + [0] * (64 - len(targets))], np.int32),
        }
        next_token = int(np.asarray(model.compute_logits(params, batch))[0, len(inputs) - 1].argmax())
        if next_token == vocab.eos_id:
            break
        generated.append(next_token)
    expected = vocab.decode(generated)
    lm = T5xLM(model, params)
    got = lm.generate_until([_instance("generate_until", (prompt, {"until": [], "max_gen_toks": 6}))])
    assert got == [expected]
    if len(expected) > 2:
        stop = expected[2:]
        cut = lm.generate_until([_instance("generate_until", (prompt, {"until": [stop], "max_gen_toks": 6}))])
        assert cut == [expected[: expected.index(stop)]]


def test_bad_arguments():
    from t5x.launch import T5xLM

    with pytest.raises(ValueError, match=r"pass model and params, or gin_file"):
        T5xLM()
    model, params = decoder_model(False)
    with pytest.raises(ValueError, match=r"batch_size must be a positive int, got 0"):
        T5xLM(model, params, batch_size=0)
