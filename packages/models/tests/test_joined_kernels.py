"""Joined decoding kernels: what joins, that a one-row step uses them, and that it changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x import decoding
from t5x.models import DecoderOnlyModel, EncoderDecoderModel, join_decode_kernels, preset
from t5x.models._joined import JOINED

VOCAB = 40


def _encdec(batch=1):
    rng = np.random.default_rng(5)
    enc = rng.integers(2, VOCAB, size=(batch, 7)).astype(np.int32)
    tgt = rng.integers(2, VOCAB, size=(batch, 5)).astype(np.int32)
    dec_in = np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1)
    model = EncoderDecoderModel(preset("t5_1_1_tiny", vocab_size=VOCAB))
    feats = {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in, "decoder_target_tokens": tgt}
    params = model.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in feats.items()})[
        "params"
    ]
    return model, params, feats


def test_joins_each_decoder_self_attention_and_gated_mlp():
    _, params, _ = _encdec()
    joined = join_decode_kernels(params["decoder"])
    layers = sorted(k for k in params["decoder"] if k.startswith("layers_"))
    assert sorted(joined) == layers
    for name in layers:
        layer, got = params["decoder"][name], joined[name]
        assert sorted(got) == ["mlp", "self_attention"]  # no cross-attention: its keys read the encoder
        attention = layer["self_attention"]
        want = np.concatenate([attention[n]["kernel"] for n in ("query", "key", "value")], axis=1)
        np.testing.assert_array_equal(got["self_attention"]["qkv"], want)
        want = np.concatenate([layer["mlp"]["wi_0"]["kernel"], layer["mlp"]["wi_1"]["kernel"]], axis=1)
        np.testing.assert_array_equal(got["mlp"]["wi"], want)


def test_scanned_or_ungated_kernels_do_not_join():
    scanned = EncoderDecoderModel(preset("umt5_tiny", vocab_size=VOCAB))
    shapes = {"encoder_input_tokens": (1, 7), "decoder_input_tokens": (1, 5), "decoder_target_tokens": (1, 5)}
    params = scanned.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    assert join_decode_kernels(params["decoder"]) == {}
    relu = EncoderDecoderModel(preset("t5_1_1_tiny", vocab_size=VOCAB, mlp_activations=("relu",)))
    params = relu.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    assert all(
        sorted(layer) == ["self_attention"] for layer in join_decode_kernels(params["decoder"]).values()
    )


def _stepwise_logits(model, params, feats, joined):
    module, enc, dec_in = model.module, feats["encoder_input_tokens"], feats["decoder_input_tokens"]
    length = dec_in.shape[1]
    cache_shapes = jax.eval_shape(
        lambda: module.apply(
            {"params": params}, enc, dec_in, dec_in, enable_dropout=False, decode=True,
            max_decode_length=length, mutable=["cache"],
        )[1]["cache"]
    )  # fmt: skip
    cache = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), cache_shapes)
    encoded = module.apply({"params": params}, enc, enable_dropout=False, method="encode")
    variables = {"params": params} if joined is None else {"params": params, JOINED: {"decoder": joined}}

    def step(cache, tok):
        logits, new_vars = module.apply(
            {**variables, "cache": cache}, encoded, enc, tok[:, None], tok[:, None],
            enable_dropout=False, decode=True, max_decode_length=length, mutable=["cache"], method="decode",
        )  # fmt: skip
        return new_vars["cache"], logits[:, 0]

    return np.asarray(jax.jit(lambda c: jax.lax.scan(step, c, dec_in.T)[1])(cache))


def test_one_row_steps_read_the_joined_kernels_and_match_the_separate_products():
    model, params, feats = _encdec(batch=1)
    joined = join_decode_kernels(params["decoder"])
    full = model.module.apply({"params": params}, *feats.values(), enable_dropout=False)
    separate = _stepwise_logits(model, params, feats, None)
    together = _stepwise_logits(model, params, feats, joined)
    np.testing.assert_allclose(together, separate, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(together, np.swapaxes(np.asarray(full), 0, 1), atol=2e-5, rtol=2e-5)
    # Zeroed joined kernels change the logits: the step really multiplies by them.
    zeroed = jax.tree_util.tree_map(jnp.zeros_like, joined)
    assert not np.allclose(_stepwise_logits(model, params, feats, zeroed), separate, atol=1e-3)


def test_steps_of_several_rows_ignore_joined_kernels():
    model, params, feats = _encdec(batch=2)
    zeroed = jax.tree_util.tree_map(jnp.zeros_like, join_decode_kernels(params["decoder"]))
    np.testing.assert_array_equal(
        _stepwise_logits(model, params, feats, zeroed), _stepwise_logits(model, params, feats, None)
    )


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_greedy_decoding_of_one_example_equals_its_row_in_a_batch(kind):
    # Batch 1 decodes through the joined kernels, batch 2 through the separate ones.
    rng = np.random.default_rng(7)
    if kind == "encdec":
        model, params, feats = _encdec(batch=2)
        model = EncoderDecoderModel(model.config, decode_fn=decoding.temperature_sample)
        batch = {
            "encoder_input_tokens": feats["encoder_input_tokens"],
            "decoder_input_tokens": np.zeros((2, 6), np.int32),
        }
    else:
        model = DecoderOnlyModel(preset("decoder_tiny", vocab_size=VOCAB))
        tokens = rng.integers(2, VOCAB, size=(2, 10)).astype(np.int32)
        dca = (np.arange(10)[None, :] <= np.array([[4], [6]])).astype(np.int32)
        batch = {"decoder_input_tokens": tokens * dca, "decoder_causal_attention": dca}
        shapes = {"decoder_input_tokens": (2, 10), "decoder_target_tokens": (2, 10)}
        params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    assert model._step_variables(params, 1).keys() == {"params", JOINED}
    greedy = {"temperature": 0.0}
    both, both_aux = model.predict_batch_with_aux(params, batch, decoder_params=greedy)
    for row in range(2):
        one, one_aux = model.predict_batch_with_aux(
            params, {k: v[row : row + 1] for k, v in batch.items()}, decoder_params=greedy
        )
        np.testing.assert_array_equal(one[0], both[row])
        np.testing.assert_allclose(one_aux["scores"][0], both_aux["scores"][row], rtol=1e-5, atol=1e-5)
