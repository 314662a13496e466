"""The architecture / objective study: grid configs, adaptation recipes, the CLI study."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import pathlib

import gin
import jax
import numpy as np
import pytest

import t5x.launch
import t5x.models
import t5x.tasks
from t5x.launch._assembly import feature_converter_for
from t5x.launch._cli import main
from t5x.launch._gin_config import GinArgs, check_required_macros, macro_value, parse_gin
from t5x.launch._jobs import load_initial_params
from t5x.launch._study import ARCHITECTURES, OBJECTIVES, grid_config, read_loss_curve

GRID = [(a, o) for a in ARCHITECTURES for o in OBJECTIVES]
PAPER_TOKENS = 168e9
RECIPES = {
    "lm_adaptation": "encoder_decoder_prefix_lm",
    "non_causal_to_causal": "causal_decoder_full_lm",
    "causal_to_non_causal": "non_causal_decoder_span_corruption",
}


def _parse(files, bindings=()):
    parse_gin(GinArgs(files=tuple(files), bindings=tuple(bindings)))
    check_required_macros()


def _row_tokens(model, lengths) -> int:
    model_lengths = feature_converter_for(model, pack=True).get_model_feature_lengths(lengths)
    return sum(
        model_lengths[k] for k in ("encoder_input_tokens", "decoder_target_tokens") if k in model_lengths
    )


def _check_model_kind(model, architecture: str) -> None:
    if architecture == "encoder_decoder":
        assert isinstance(model, t5x.models.EncoderDecoderModel)
    else:
        assert isinstance(model, t5x.models.DecoderOnlyModel)
        assert model.inputs_bidirectional_attention is (architecture == "non_causal_decoder")


@pytest.mark.parametrize(("architecture", "objective"), GRID)
def test_paper_config_builds_model_and_task_on_the_token_budget(architecture, objective, spm_path, tmp_path):
    _parse(
        [grid_config(architecture, objective, "paper")],
        [f"SENTENCEPIECE_MODEL = '{spm_path}'", f"MODEL_DIR = '{tmp_path}'"],
    )
    model = macro_value("MODEL")
    _check_model_kind(model, architecture)
    name = macro_value("MIXTURE_OR_TASK_NAME")
    task = t5x.tasks.get_mixture_or_task(name)
    assert name.startswith(f"c4_study_{objective}")
    assert isinstance(task.source, t5x.tasks.TfdsDataSource)
    lengths = macro_value("TASK_FEATURE_LENGTHS")
    assert set(lengths) == set(task.output_features)
    assert task.output_features["targets"].vocabulary == model.output_vocabulary
    batch, steps = macro_value("BATCH_SIZE"), macro_value("TRAIN_STEPS")
    assert steps == 131072
    # Prefix-LM rows hold two packed examples, so those configs halve the batch.
    assert batch == (1024 if objective == "prefix_lm" else 2048)
    tokens = batch * _row_tokens(model, lengths) * steps
    assert abs(tokens / PAPER_TOKENS - 1) < 0.01, tokens


@pytest.mark.parametrize(
    ("architecture", "low", "high"),
    [
        ("causal_decoder", 4.7e9, 4.95e9),
        ("non_causal_decoder", 4.7e9, 4.95e9),
        ("encoder_decoder", 10.9e9, 11.5e9),
    ],
)
def test_paper_model_sizes_without_allocating(architecture, low, high, spm_path, tmp_path):
    _parse(
        [grid_config(architecture, "span_corruption", "paper")],
        [f"SENTENCEPIECE_MODEL = '{spm_path}'", f"MODEL_DIR = '{tmp_path}'"],
    )
    model = macro_value("MODEL")
    shapes = {"decoder_input_tokens": (1, 8), "encoder_input_tokens": (1, 8)}
    variables = jax.eval_shape(lambda rng: model.get_initial_variables(rng, shapes), jax.random.PRNGKey(0))
    count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(variables["params"]))
    assert low < count < high, f"{architecture}: {count / 1e9:.2f}B parameters"


@pytest.mark.parametrize(("architecture", "objective"), GRID)
def test_tiny_config_builds_model_and_task(architecture, objective, tmp_path):
    _parse([grid_config(architecture, objective)], [f"MODEL_DIR = '{tmp_path}'"])
    model = macro_value("MODEL")
    _check_model_kind(model, architecture)
    task = t5x.tasks.get_mixture_or_task(macro_value("MIXTURE_OR_TASK_NAME"))
    assert task.output_features["targets"].vocabulary == t5x.tasks.builtin_vocabulary()
    assert set(macro_value("TASK_FEATURE_LENGTHS")) == set(task.output_features)
    rows = 8 if objective == "prefix_lm" else 16
    assert macro_value("BATCH_SIZE") == rows
    # Every combination sees about the same tokens per step (16 x 64).
    assert abs(rows * _row_tokens(model, macro_value("TASK_FEATURE_LENGTHS")) / (16 * 64) - 1) < 0.05


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_adaptation_recipes_restore_parameters_only_and_keep_the_step(recipe, tmp_path):
    files = [f"study/tiny/{RECIPES[recipe]}.gin", f"study/adapt/{recipe}.gin"]
    with pytest.raises(t5x.launch.GinConfigError, match="INITIAL_CHECKPOINT_PATH"):
        _parse(files, [f"MODEL_DIR = '{tmp_path}'", "TRAIN_STEPS = 10"])
    _parse(files, [f"MODEL_DIR = '{tmp_path}'", "TRAIN_STEPS = 10", "INITIAL_CHECKPOINT_PATH = '/ckpt'"])
    config = gin.get_configurable(t5x.launch.CheckpointConfig)()
    assert config.initial_checkpoint_path == "/ckpt"
    assert config.keep_initial_step is True


def test_multitask_finetune_recipe_builds_on_a_mixture(tmp_path):
    t5x.tasks.builtin.register_builtin_tasks()  # the recipe fine-tunes on a built-in mixture
    _parse(
        ["study/models/non_causal_decoder_tiny.gin", "study/adapt/multitask_finetune.gin"],
        [
            f"MODEL_DIR = '{tmp_path}'",
            "TRAIN_STEPS = 10",
            "INITIAL_CHECKPOINT_PATH = '/ckpt'",
            "MIXTURE_OR_TASK_NAME = 'synthetic_text_to_text'",
        ],
    )
    assert macro_value("DROPOUT_RATE") == 0.1
    assert isinstance(t5x.tasks.get_mixture_or_task(macro_value("MIXTURE_OR_TASK_NAME")), t5x.tasks.Mixture)
    assert gin.get_configurable(t5x.launch.CheckpointConfig)().keep_initial_step is True


def _tiny_model(architecture: str, tmp_path: pathlib.Path):
    _parse([grid_config(architecture, "prefix_lm")], [f"MODEL_DIR = '{tmp_path}'"])
    return macro_value("MODEL")


def _trainer(model, seed: int):
    import t5x.training
    from t5x.partitioning import PjitPartitioner

    partitioner = PjitPartitioner(num_partitions=1)
    shapes = {
        k: (2, 16) for k in ("decoder_input_tokens", "decoder_target_tokens", "decoder_causal_attention")
    }
    initialized = t5x.training.init_train_state(
        model, t5x.training.adafactor(), partitioner, shapes, seed=seed
    )
    return t5x.training.Trainer(model, partitioner, initialized.state, initialized.shardings, seed=seed)


def _prefix_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    targets = rng.integers(3, 300, size=(2, 16)).astype(np.int32)
    inputs = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], axis=1)
    prefix = (np.arange(16)[None, :] < 7).astype(np.int32).repeat(2, axis=0)
    return {
        "decoder_input_tokens": inputs,
        "decoder_target_tokens": targets,
        "decoder_causal_attention": prefix,
    }


def test_non_causal_checkpoint_loads_as_causal_and_back(tmp_path):
    from t5x.checkpointing import save_t5x_checkpoint

    non_causal = _tiny_model("non_causal_decoder", tmp_path)
    causal = _tiny_model("causal_decoder", tmp_path)
    source = _trainer(non_causal, seed=1)
    source.state = dataclasses.replace(source.state, step=jax.numpy.asarray(7, jax.numpy.int32))
    path = save_t5x_checkpoint(str(tmp_path / "nd"), 7, jax.device_get(source.state.state_dict()))

    target = _trainer(causal, seed=2)
    fresh_slots = jax.device_get(target.state.opt_state)
    step = load_initial_params(target, str(path), keep_step=True)
    assert step == 7 and int(target.state.step) == 7
    expected = jax.device_get(source.state.params)
    loaded = jax.device_get(target.state.params)
    assert jax.tree.structure(expected) == jax.tree.structure(loaded)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(fresh_slots), jax.tree.leaves(target.state.opt_state), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))  # the optimizer starts fresh

    batch = _prefix_batch()
    as_causal = np.asarray(causal.compute_logits(loaded, batch))
    as_non_causal = np.asarray(non_causal.compute_logits(loaded, batch))
    # Inside the prefix the non-causal decoder sees later tokens: the mask is the model's.
    assert not np.allclose(as_causal[:, :6], as_non_causal[:, :6], atol=1e-5)
    no_prefix = dict(batch, decoder_causal_attention=np.zeros_like(batch["decoder_causal_attention"]))
    np.testing.assert_allclose(
        np.asarray(non_causal.compute_logits(loaded, no_prefix)), as_causal, atol=1e-4, rtol=1e-4
    )

    # And back: the causal model's checkpoint loads into a non-causal decoder unchanged.
    back_path = save_t5x_checkpoint(str(tmp_path / "cd"), 7, jax.device_get(target.state.state_dict()))
    back = source  # a non-causal trainer; its step is reset to check that keep_step=False keeps it
    back.state = dataclasses.replace(back.state, step=jax.numpy.zeros_like(back.state.step))
    back.state = back.state.replace_params(jax.tree.map(np.zeros_like, jax.device_get(back.state.params)))
    assert load_initial_params(back, str(back_path)) == 7
    assert int(back.state.step) == 0  # without keep_step the new run counts from 0
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(jax.device_get(back.state.params)), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Runs ``t5x-launch arch-objective-study`` end to end (3 steps per combination)."""
    folder = tmp_path_factory.mktemp("study")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "arch-objective-study",
                f"--model_dir={folder}",
                "--steps=3",
                f"--zero_shot_tasks={t5x.tasks.BUILTIN_MC_TASKS[0]}",
            ]
        )
    assert code == 0
    return folder, out.getvalue()


@pytest.mark.slow
def test_study_prints_the_table_and_saves_the_plot(study):
    folder, printed = study
    record = json.loads((folder / "study.json").read_text())
    assert [(r["architecture"], r["objective"]) for r in record["runs"]] == GRID
    for run in record["runs"]:
        assert math.isfinite(run["final_loss"]) and run["final_loss"] > 0
        assert run["curve"][-1][0] == 3
        assert run["zero_shot_median"] is None or 0.0 <= run["zero_shot_median"] <= 100.0
        line = next(
            li
            for li in printed.splitlines()
            if li.startswith(f"{run['architecture']} ") and f" {run['objective']} " in li
        )
        assert f"{run['final_loss']:.4f}" in line
        # The tiny grid config trained: its checkpoint and operative config are there.
        assert (pathlib.Path(run["model_dir"]) / "checkpoint_3").is_dir()
        assert read_loss_curve(run["model_dir"]) == [tuple(p) for p in run["curve"]]
    assert "architecture" in printed and "zero-shot median" in printed
    png = pathlib.Path(record["plot_path"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_lm_adaptation_restores_parameters_and_trains_on(study, tmp_path):
    folder, _ = study
    source = folder / "encoder_decoder_span_corruption"
    _parse(
        ["study/tiny/encoder_decoder_prefix_lm.gin", "study/adapt/lm_adaptation.gin"],
        [
            f"MODEL_DIR = '{tmp_path}'",
            f"INITIAL_CHECKPOINT_PATH = '{source}'",
            "TRAIN_STEPS = 6",
            "launch.train.log_period = 1",
        ],
    )
    result = gin.get_configurable(t5x.launch.train)()
    # The step counts on from the span-corruption checkpoint (3): steps 3, 4, 5 run here.
    assert sorted(result.losses) == [3, 4, 5] and result.step == 6
    assert all(math.isfinite(v) for v in result.losses.values())
    assert sorted(p.name for p in tmp_path.glob("checkpoint_*")) == ["checkpoint_6"]
