"""The training loss made a slice of positions at a time, against the one over the whole logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x.models import (
    DecoderOnlyModel,
    EncoderDecoderModel,
    _chunked_loss,
    chunked_cross_entropy,
    compute_metrics,
    compute_weighted_cross_entropy,
    get_loss_normalizing_factor_and_weights,
    preset,
)

VOCAB = 37


def _batch(encoder: bool, batch: int = 3, length: int = 11) -> dict:
    rng = np.random.default_rng(0)
    tgt = rng.integers(2, VOCAB, size=(batch, length)).astype(np.int32)
    tgt[1, -4:] = 0
    features = {
        "decoder_input_tokens": np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1),
        "decoder_target_tokens": tgt,
        "decoder_loss_weights": (tgt > 0).astype(np.float32),
    }
    if encoder:
        features["encoder_input_tokens"] = rng.integers(2, VOCAB, size=(batch, 5)).astype(np.int32)
    return features


def _full_logits_loss(model, params, batch, dropout_rng):
    """The loss and metrics computed from the whole logits, as before slicing."""
    logits = model._logits(params, batch, dropout_rng)
    factor, weights = get_loss_normalizing_factor_and_weights(model.loss_normalizing_factor, batch)
    targets = batch["decoder_target_tokens"]
    loss, z_loss, _ = compute_weighted_cross_entropy(
        logits, targets, weights, model.label_smoothing, model.z_loss, factor
    )
    return loss, compute_metrics(logits, targets, batch["decoder_loss_weights"], loss, z_loss)


def _assert_trees_close(actual, expected, rtol, atol):
    """Leaf by leaf; ``atol`` is relative to the leaf's largest value (float32 sums in another order)."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
        scale = max(1.0, float(np.abs(e).max(initial=0.0)))
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol * scale)


MODELS = {
    "t5.1.1 (logits_dense)": (EncoderDecoderModel, "t5_1_1_tiny", {}),
    "t5.1.0 (tied embedding)": (EncoderDecoderModel, "t5_1_1_tiny", {"logits_via_embedding": True}),
    "umt5 (scanned layers)": (EncoderDecoderModel, "umt5_tiny", {}),
    "decoder (logits_dense)": (DecoderOnlyModel, "decoder_tiny", {}),
    "decoder (tied embedding)": (DecoderOnlyModel, "decoder_tiny", {"logits_via_embedding": True}),
}


@pytest.mark.parametrize(
    ("name", "normalizing"),
    [(name, None) for name in MODELS]
    + [("decoder (logits_dense)", "NUM_REAL_TARGET_TOKENS"), ("t5.1.0 (tied embedding)", 3.5)],
)
def test_loss_fn_equals_the_loss_over_the_whole_logits(name, normalizing, monkeypatch):
    model_cls, preset_name, overrides = MODELS[name]
    model = model_cls(
        preset(preset_name, vocab_size=VOCAB, dropout_rate=0.1, **overrides),
        z_loss=1e-2,
        label_smoothing=0.1,
        loss_normalizing_factor=normalizing,
    )
    batch = _batch(model_cls is EncoderDecoderModel)
    shapes = {k: v.shape for k, v in batch.items()}
    params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    # Three positions per slice: 11 positions make 4 slices, the last one padded.
    monkeypatch.setattr(_chunked_loss, "SLICE_BYTES", 3 * 3 * VOCAB * 4)
    rng = jax.random.PRNGKey(5)  # with dropout: both sides draw the same masks

    (loss, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, rng)
    (want, want_metrics), want_grads = jax.value_and_grad(
        lambda p: _full_logits_loss(model, p, batch, rng), has_aux=True
    )(params)

    np.testing.assert_allclose(loss, want, rtol=2e-6)
    _assert_trees_close(metrics, want_metrics, rtol=2e-6, atol=1e-7)
    _assert_trees_close(grads, want_grads, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("length", [1, 7, 16])
@pytest.mark.parametrize("slice_positions", [1, 3, 16])
def test_chunked_cross_entropy_matches_the_full_logits_for_any_slicing(length, slice_positions):
    batch, embed = 2, 5
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    kernel = jax.random.normal(keys[0], (embed, VOCAB))
    hidden = jax.random.normal(keys[1], (batch, length, embed))
    targets = jax.random.randint(keys[2], (batch, length), 0, VOCAB)
    loss_weights = jnp.linspace(0.0, 2.0, batch * length).reshape(batch, length)
    metric_weights = (jnp.arange(batch * length).reshape(batch, length) % 3 != 0).astype(jnp.float32)

    def project(kernel, h):
        return h @ kernel

    def sliced(kernel, hidden):
        return chunked_cross_entropy(
            project,
            kernel,
            hidden,
            targets,
            loss_weights,
            metric_weights,
            label_smoothing=0.2,
            z_loss=1e-3,
            slice_bytes=batch * slice_positions * VOCAB * 4,
        )

    def whole(kernel, hidden):
        logits = project(kernel, hidden)
        loss, z_loss, _ = compute_weighted_cross_entropy(logits, targets, loss_weights, 0.2, 1e-3)
        correct = jnp.sum((jnp.argmax(logits, -1) == targets) * metric_weights)
        return loss, z_loss, correct

    np.testing.assert_allclose(sliced(kernel, hidden), whole(kernel, hidden), rtol=2e-6)
    grads = jax.grad(lambda k, h: sliced(k, h)[0], argnums=(0, 1))(kernel, hidden)
    want = jax.grad(lambda k, h: whole(k, h)[0], argnums=(0, 1))(kernel, hidden)
    _assert_trees_close(grads, want, rtol=1e-5, atol=1e-6)
    # The incoming cotangent scales both gradients.
    scaled = jax.grad(lambda k, h: 2.5 * sliced(k, h)[0], argnums=(0, 1))(kernel, hidden)
    _assert_trees_close(scaled, jax.tree.map(lambda g: 2.5 * g, want), rtol=1e-5, atol=1e-6)


def test_bfloat16_hidden_states_get_a_bfloat16_gradient():
    kernel = jnp.ones((4, VOCAB))
    hidden = jnp.ones((2, 6, 4), jnp.bfloat16)
    targets = jnp.ones((2, 6), jnp.int32)
    ones = jnp.ones((2, 6))

    def loss(kernel, hidden):
        project = lambda k, h: jnp.dot(h, k.astype(h.dtype), preferred_element_type=jnp.float32)  # noqa: E731
        return chunked_cross_entropy(
            project, kernel, hidden, targets, ones, ones, slice_bytes=2 * 2 * VOCAB * 4
        )[0]

    d_kernel, d_hidden = jax.grad(loss, argnums=(0, 1))(kernel, hidden)
    assert d_hidden.dtype == jnp.bfloat16 and d_kernel.dtype == jnp.float32


def test_a_training_step_never_holds_the_whole_logits(monkeypatch):
    # A model whose logits dwarf everything else: 4 x 256 positions of a 16k vocabulary are
    # 64 MiB of float32 logits, made here in slices of 8 MiB.
    model = DecoderOnlyModel(preset("decoder_tiny", vocab_size=16384))
    batch = _batch(False, batch=4, length=256)
    params = model.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in batch.items()})[
        "params"
    ]
    logits_bytes = 4 * 256 * 16384 * 4
    monkeypatch.setattr(_chunked_loss, "SLICE_BYTES", logits_bytes // 8)

    def temp_bytes(loss_fn):
        step = jax.jit(jax.grad(lambda p: loss_fn(p)[0]))
        return step.lower(params).compile().memory_analysis().temp_size_in_bytes

    sliced = temp_bytes(lambda p: model._loss(p, batch, None))
    whole = temp_bytes(lambda p: _full_logits_loss(model, p, batch, None))
    assert whole >= logits_bytes  # the whole-logits loss holds at least the logits
    assert sliced < logits_bytes / 2, (sliced, whole)
