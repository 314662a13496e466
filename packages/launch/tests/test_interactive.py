"""t5x.launch.InteractiveModel: predict, score, train, evaluate and save on in-memory examples."""

import gin
import numpy as np
import pytest

from t5x.launch import InteractiveModel

SMALL = [
    "models.T5Config.emb_dim = 32",
    "models.T5Config.mlp_dim = 64",
    "models.T5Config.num_heads = 2",
    "models.T5Config.head_dim = 16",
    "models.T5Config.num_encoder_layers = 1",
    "models.T5Config.num_decoder_layers = 1",
]
LENGTHS = {"inputs": 8, "targets": 8}
EXAMPLES = [{"inputs": "abc", "targets": "cba"}, {"inputs": "xyz", "targets": "zyx"}]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A fresh tiny model trained on two examples, saved with its config.gin."""
    folder = tmp_path_factory.mktemp("interactive")
    try:
        model = InteractiveModel.from_gin(
            ["models/demo/tiny.gin"],
            gin_bindings=SMALL,
            task_feature_lengths=LENGTHS,
            batch_size=4,
            learning_rate_fn=lambda step: 0.05,
        )
        before = model.score(EXAMPLES)
        losses = [model.train_step(EXAMPLES)["loss"] for _ in range(8)]
        saved = model.save(folder)
        # As a run's config.gin does: the model's bindings in the scope of its macro.
        scoped = "\n".join(f"MODEL/{binding}" for binding in SMALL)
        (folder / "config.gin").write_text(f"include 'models/demo/tiny.gin'\n{scoped}\n")
    finally:
        gin.clear_config()
    return model, before, losses, saved, folder


def test_train_step_learns_and_scores_follow(trained):
    model, before, losses, _, _ = trained
    assert model.step == 8
    assert losses[-1] < losses[0], losses
    after = model.score(EXAMPLES)
    assert len(after) == 2 and all(isinstance(s, float) for s in after)
    # Training on these targets makes them more likely (log-likelihoods rise).
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    # A wrong target scores below the trained one.
    (wrong,) = model.score([{"inputs": "abc", "targets": "qqq"}])
    assert wrong < after[0]


def test_predict_and_evaluate_on_more_examples_than_a_batch(trained):
    model = trained[0]
    many = [EXAMPLES[i % 2] for i in range(6)]  # two batches of 4, the second padded
    predictions, aux = model.predict_with_aux(many)
    assert len(predictions) == 6 and all(isinstance(p, str) for p in predictions)
    assert predictions[:2] == predictions[2:4] == model.predict(EXAMPLES)  # greedy: same input, same output
    assert all(len(values) == 6 for values in aux.values())
    metrics = model.evaluate(many, score_metric_fns=[lambda t, s: {"mean_score": float(np.mean(s))}])
    expected = 100.0 * np.mean([p == e["targets"] for p, e in zip(predictions, many, strict=True)])
    assert metrics["exact_match"] == pytest.approx(expected)
    assert metrics["mean_score"] == pytest.approx(np.mean(model.score(many)), rel=1e-5)


def test_from_model_dir_restores_the_saved_state(trained):
    model, _, _, saved, folder = trained
    assert saved.endswith("checkpoint_8")
    try:
        restored = InteractiveModel.from_model_dir(folder, task_feature_lengths=LENGTHS, batch_size=4)
        assert restored.decoder_params == {"temperature": 0.0}  # the gin file's greedy decoding
    finally:
        gin.clear_config()
    assert restored.step == 8
    np.testing.assert_allclose(restored.score(EXAMPLES), model.score(EXAMPLES), rtol=1e-5)


def test_bad_examples_are_named(trained):
    model = trained[0]
    with pytest.raises(ValueError, match=r"example 1 needs 'inputs'"):
        model.predict([{"inputs": "a"}, {"targets": "b"}])
    with pytest.raises(ValueError, match=r"example 0 needs 'targets'"):
        model.score([{"inputs": "a"}])
    with pytest.raises(FileNotFoundError, match="config.gin"):
        InteractiveModel.from_model_dir(trained[4] / "checkpoint_8")
