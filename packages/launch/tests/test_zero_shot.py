"""Zero-shot rank classification for the three architectures, checked against logits computed here."""

from __future__ import annotations

import json
import pathlib
import statistics

import jax
import numpy as np
import pytest

import t5x.tasks as tt
from t5x import models
from t5x.launch import ZeroShotReport, evaluate_zero_shot, load_checkpoint_params
from t5x.launch._cli import main
from t5x.tasks.builtin import MC_PROMPTS

ARCHITECTURES = ("encoder_decoder", "causal_decoder", "non_causal_decoder")
NUM_EXAMPLES = 12
ROW_LENGTH = 160


def build_model(architecture: str, seed: int = 0):
    """A tiny model of the architecture over the built-in byte vocabulary, with random parameters."""
    vocab = tt.builtin_vocabulary()
    if architecture == "encoder_decoder":
        config = models.T5Config(
            vocab_size=384, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
            num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0,
        )  # fmt: skip
        model = models.EncoderDecoderModel(config, input_vocabulary=vocab, output_vocabulary=vocab)
        shapes = {"encoder_input_tokens": (1, 8), "decoder_input_tokens": (1, 8)}
    else:
        config = models.DecoderOnlyConfig(
            vocab_size=384, emb_dim=16, num_heads=2, head_dim=8, num_layers=2, mlp_dim=32, dropout_rate=0.0
        )
        model = models.DecoderOnlyModel(
            config, vocab, inputs_bidirectional_attention=architecture == "non_causal_decoder"
        )
        shapes = {"decoder_input_tokens": (1, 8)}
    return model, model.get_initial_variables(jax.random.PRNGKey(seed), shapes)["params"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def tiny(request):
    return (request.param, *build_model(request.param))


def _pad(ids: list[int]) -> np.ndarray:
    assert len(ids) <= ROW_LENGTH
    return np.asarray(ids + [0] * (ROW_LENGTH - len(ids)), np.int32)


def direct_scores(model, params, architecture: str, pairs: list[tuple[str, str]]) -> np.ndarray:
    """Log-likelihood of each target given its prompt, from teacher-forced logits (no converter, no score_batch).

    Returns:
      ``[len(pairs)]`` float64 sums of the target tokens' log-probabilities.
    """
    vocab = tt.builtin_vocabulary()
    features: dict[str, list[np.ndarray]] = {}
    for prompt, target in pairs:
        inp, tgt = list(vocab.encode(prompt)), list(vocab.encode(target))
        if architecture == "encoder_decoder":
            row = {
                "encoder_input_tokens": _pad(inp),
                "decoder_target_tokens": _pad(tgt),
                "decoder_input_tokens": _pad([0, *tgt[:-1]]),
                "decoder_loss_weights": _pad([1] * len(tgt)),
            }
        else:
            seq = inp + tgt
            row = {
                "decoder_target_tokens": _pad(seq),
                "decoder_input_tokens": _pad([0, *seq[:-1]]),
                "decoder_loss_weights": _pad([0] * len(inp) + [1] * len(tgt)),
                # The prefix, plus the position that reads its last token, attends bidirectionally.
                "decoder_causal_attention": _pad([1] * (len(inp) + 1)),
            }
        for key, value in row.items():
            features.setdefault(key, []).append(value)
    batch = {k: np.stack(v) for k, v in features.items()}
    logits = np.asarray(model.compute_logits(params, batch), np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    logp -= logits.max(-1, keepdims=True)
    picked = np.take_along_axis(logp, batch["decoder_target_tokens"][..., None], axis=-1)[..., 0]
    return (picked * batch["decoder_loss_weights"]).sum(-1)


def expected_accuracy(model, params, architecture: str, dataset: str, prompt: str, n: int) -> float:
    examples = tt.make_mc_examples(dataset, "validation", n)
    template = MC_PROMPTS[dataset][prompt]
    pairs = [(template.format(**ex), " " + choice) for ex in examples for choice in ex["choices"]]
    scores = direct_scores(model, params, architecture, pairs).reshape(n, -1)
    ordered = np.sort(scores, axis=1)
    # The comparison is only meaningful without near ties between the two best options.
    assert np.min(ordered[:, -1] - ordered[:, -2]) > 1e-4
    labels = np.asarray([ex["label"] for ex in examples])
    return 100.0 * float(np.mean(scores.argmax(1) == labels))


def test_accuracy_matches_argmax_of_log_likelihoods(tiny):
    architecture, model, params = tiny
    report = evaluate_zero_shot(model, params, ["builtin_mc_copy"], batch_size=5, num_examples=NUM_EXAMPLES)
    names = [f"builtin_mc_copy_{p}" for p in MC_PROMPTS["copy"]]
    assert list(report.per_prompt) == names
    for prompt in MC_PROMPTS["copy"]:
        expected = expected_accuracy(model, params, architecture, "copy", prompt, NUM_EXAMPLES)
        assert report.per_prompt[f"builtin_mc_copy_{prompt}"] == pytest.approx(expected)
    assert report.median == pytest.approx(statistics.median(report.per_prompt.values()))
    assert report.medians == {"builtin_mc_copy": pytest.approx(report.median)}
    assert report.num_examples == dict.fromkeys(names, NUM_EXAMPLES)


@pytest.mark.slow  # about 30 s on 2 loaded cores
def test_default_tasks_are_every_builtin_prompt():
    model, params = build_model("causal_decoder", seed=3)
    report = evaluate_zero_shot(model, params, num_examples=2, batch_size=16)
    assert tuple(report.per_prompt) == tt.BUILTIN_MC_TASKS
    assert len(report.per_prompt) == 9
    for value in report.per_prompt.values():
        assert value in (0.0, 50.0, 100.0)  # two examples per prompt
    assert report.median == statistics.median(report.per_prompt.values())


def test_median_and_table():
    report = ZeroShotReport(per_prompt={"a": 10.0, "b": 40.0, "c": 30.0, "d": 90.0}, median=35.0)
    table = report.format_table().splitlines()
    assert table[0].split() == ["task", "accuracy", "examples"]
    assert [line.split()[0] for line in table[2:6]] == ["a", "b", "c", "d"]
    assert table[-1].split()[-1] == "35.00"
    assert "median over 4 prompts" in table[-1]


def test_unknown_task_names_the_closest_ones():
    model, params = build_model("causal_decoder")
    with pytest.raises(tt.UnknownNameError, match=r"builtin_mc_copyy.*builtin_mc_copy"):
        evaluate_zero_shot(model, params, ["builtin_mc_copyy"])


def test_model_without_scoring_is_refused():
    class NoScore:
        feature_converter_cls = None

    with pytest.raises(TypeError, match=r"NoScore lacks score_batch"):
        evaluate_zero_shot(NoScore(), {}, ["builtin_mc_copy_copy"])


def test_task_without_rank_classification_is_refused():
    model, params = build_model("encoder_decoder")
    with pytest.raises(ValueError, match=r"'synthetic_copy' has no score-based metric"):
        evaluate_zero_shot(model, params, ["synthetic_copy"])


def test_bad_arguments_are_refused():
    model, params = build_model("causal_decoder")
    with pytest.raises(ValueError, match=r"batch_size must be a positive int, got 0"):
        evaluate_zero_shot(model, params, ["builtin_mc_copy_copy"], batch_size=0)
    with pytest.raises(TypeError, match=r"list of names, got the string"):
        evaluate_zero_shot(model, params, "builtin_mc_copy_copy")
    with pytest.raises(ValueError, match=r"task_names is empty"):
        evaluate_zero_shot(model, params, [])
    with pytest.raises(ValueError, match=r"no split 'train'"):
        evaluate_zero_shot(model, params, ["builtin_mc_copy_copy"], split="train")


def test_vocabulary_mismatch_is_refused():
    from t5x.vocabularies import ByteVocabulary

    config = models.DecoderOnlyConfig(
        vocab_size=384, emb_dim=8, num_heads=1, head_dim=8, num_layers=1, mlp_dim=8
    )
    model = models.DecoderOnlyModel(config, ByteVocabulary(extra_ids=0))
    with pytest.raises(ValueError, match=r"vocabulary"):
        evaluate_zero_shot(model, {}, ["builtin_mc_copy_copy"])


def _save(model_dir: pathlib.Path, params, step: int = 5) -> None:
    from t5x.checkpointing import save_t5x_checkpoint

    save_t5x_checkpoint(model_dir, step, {"target": params, "state": {"step": step}})


# The demo model, shrunk so that the CLI test compiles quickly.
TINY_GIN = """
include 'models/demo/tiny.gin'
models.T5Config.emb_dim = 16
models.T5Config.head_dim = 8
models.T5Config.mlp_dim = 32
models.T5Config.num_encoder_layers = 1
models.T5Config.num_decoder_layers = 1
"""


@pytest.mark.slow  # about 30 s on 2 loaded cores
def test_cli_zero_shot_from_a_checkpoint(tmp_path, capsys):
    from t5x.launch import model_from_gin

    gin_file = tmp_path / "tiny.gin"
    gin_file.write_text(TINY_GIN)
    model = model_from_gin([str(gin_file)])
    shapes = {"encoder_input_tokens": (1, 8), "decoder_input_tokens": (1, 8)}
    _save(tmp_path / "run", model.get_initial_variables(jax.random.PRNGKey(1), shapes)["params"], step=7)
    tasks = ["builtin_mc_addition_add", "builtin_mc_copy_copy"]
    out = tmp_path / "report.json"
    argv = ["zero-shot", f"--gin_file={gin_file}", f"--checkpoint={tmp_path / 'run'}"]
    assert main([*argv, f"--tasks={','.join(tasks)}", "--num_examples=4", f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert "builtin_mc_addition_add" in text and "median over 2 prompts" in text
    saved = json.loads(out.read_text())
    params = load_checkpoint_params(model, str(tmp_path / "run"))
    direct = evaluate_zero_shot(model, params, tasks, num_examples=4)
    assert saved["per_prompt"] == pytest.approx(direct.per_prompt)
    assert saved["median"] == pytest.approx(direct.median)

    # Without --gin_file the run's own config.gin (next to its checkpoints) configures the model.
    (tmp_path / "run" / "config.gin").write_text(TINY_GIN)
    argv = ["zero-shot", f"--checkpoint={tmp_path / 'run' / 'checkpoint_7'}", "--num_examples=4"]
    assert main([*argv, "--tasks=builtin_mc_copy_copy", f"--json={out}"]) == 0
    again = json.loads(out.read_text())
    assert again["per_prompt"] == pytest.approx(
        {"builtin_mc_copy_copy": direct.per_prompt["builtin_mc_copy_copy"]}
    )


def test_cli_without_a_model_config_says_what_to_pass(tmp_path, capsys):
    _, params = build_model("causal_decoder")
    _save(tmp_path / "run", params)
    assert main(["zero-shot", f"--checkpoint={tmp_path / 'run'}"]) == 2
    assert "no --gin_file given and no config.gin" in capsys.readouterr().err


def test_checkpoint_that_does_not_fit_the_model(tmp_path):
    _, small_params = build_model("causal_decoder")
    _save(tmp_path / "run", small_params)
    other = models.DecoderOnlyModel(
        models.DecoderOnlyConfig(
            vocab_size=384, emb_dim=24, num_heads=2, head_dim=8, num_layers=2, mlp_dim=32
        ),
        tt.builtin_vocabulary(),
    )
    with pytest.raises(
        ValueError, match=r"has shape \((384, )?16,?\), but the model expects \((384, )?24,?\)"
    ):
        load_checkpoint_params(other, str(tmp_path / "run"))
