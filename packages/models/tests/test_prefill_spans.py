"""A decoder-only prompt pass runs over the shortest span holding every prompt, filling the same cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x.models import DecoderOnlyModel, prefill_spans, preset
from t5x.models._models import _zeros_like_shapes

VOCAB, LENGTH = 40, 300


def test_spans_are_powers_of_two_then_the_cache_length():
    assert prefill_spans(319) == (128, 256, 319)
    assert prefill_spans(256) == (128, 256)
    assert prefill_spans(100) == (100,)
    assert prefill_spans(2048, shortest=512) == (512, 1024, 2048)


def _full_length_cache(model, params, inputs, dca, lengths):
    # The whole padded length in one pass: what the cache must equal.
    module = model.module
    shapes = jax.eval_shape(
        lambda: module.apply(
            {"params": params}, inputs, inputs, enable_dropout=False, decode=True,
            max_decode_length=inputs.shape[1], mutable=["cache"],
        )[1]["cache"]
    )  # fmt: skip
    _, new_vars = module.apply(
        {"params": params, "cache": _zeros_like_shapes(shapes)}, inputs, dca, None, None,
        dca if model.inputs_bidirectional_attention else None,
        enable_dropout=False, prefill=True, prefill_lengths=lengths, mutable=["cache"],
    )  # fmt: skip
    return new_vars["cache"]


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("prompts", [(5, 90), (7, 129), (5, 200), (130, 299)])
def test_prompt_pass_over_a_span_fills_the_full_length_cache(prompts, bidirectional):
    model = DecoderOnlyModel(
        preset("decoder_tiny", vocab_size=VOCAB), inputs_bidirectional_attention=bidirectional
    )
    shapes = {"decoder_input_tokens": (2, LENGTH), "decoder_target_tokens": (2, LENGTH)}
    params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    tokens = np.random.default_rng(1).integers(2, VOCAB, size=(2, LENGTH)).astype(np.int32)
    dca = (np.arange(LENGTH)[None, :] < np.array(prompts)[:, None]).astype(np.int32)
    batch = {"decoder_input_tokens": tokens * dca, "decoder_causal_attention": dca}

    cache, lengths = model.prefill_cache(params, batch)
    np.testing.assert_array_equal(lengths, np.array(prompts) - 1)
    want = _full_length_cache(model, params, jnp.asarray(tokens * dca), jnp.asarray(dca), lengths)
    got, expected = jax.tree_util.tree_leaves(cache), jax.tree_util.tree_leaves(want)
    assert [g.shape for g in got] == [e.shape for e in expected]
    assert any(np.abs(np.asarray(e)).max() > 0 for e in expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=1e-5, rtol=1e-5)


def test_a_prompt_pass_longer_than_the_cache_is_refused():
    model = DecoderOnlyModel(preset("decoder_tiny", vocab_size=VOCAB))
    shapes = {"decoder_input_tokens": (1, 8), "decoder_target_tokens": (1, 8)}
    params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    cache = _zeros_like_shapes(
        jax.eval_shape(
            lambda: model.module.apply(
                {"params": params}, jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32),
                enable_dropout=False, decode=True, max_decode_length=8, mutable=["cache"],
            )[1]["cache"]
        )
    )  # fmt: skip
    with pytest.raises(ValueError, match="prefill of 12 positions does not fit the cache length 8"):
        model.module.apply(
            {"params": params, "cache": cache}, jnp.ones((1, 12), jnp.int32), jnp.ones((1, 12), jnp.int32),
            enable_dropout=False, prefill=True, prefill_lengths=jnp.array([3]), mutable=["cache"],
        )  # fmt: skip
