"""Network-level behaviour: parameter names, scanning, remat, cached decoding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from t5x.models import (
    DecoderOnlyModel,
    EncoderDecoderModel,
    preset,
    scan_params,
    unscan_params,
)


def _shapes(params):
    return {"/".join(k): tuple(v.shape) for k, v in traverse_util.flatten_dict(params).items()}


def _encdec_layer(prefix, d, hq, mlp, cross):
    attn = ["self_attention"] if cross else ["attention"]
    if cross:
        attn.append("encoder_decoder_attention")
    out = {}
    for a in attn:
        for proj in ("query", "key", "value"):
            out[f"{prefix}/{a}/{proj}/kernel"] = (d, hq)
        out[f"{prefix}/{a}/out/kernel"] = (hq, d)
    norms = (
        ["pre_self_attention_layer_norm", "pre_cross_attention_layer_norm"]
        if cross
        else ["pre_attention_layer_norm"]
    )
    for n in [*norms, "pre_mlp_layer_norm"]:
        out[f"{prefix}/{n}/scale"] = (d,)
    out[f"{prefix}/mlp/wi_0/kernel"] = (d, mlp)
    out[f"{prefix}/mlp/wi_1/kernel"] = (d, mlp)
    out[f"{prefix}/mlp/wo/kernel"] = (mlp, d)
    return out


def test_t5_1_1_tiny_parameter_tree_is_upstreams():
    model = EncoderDecoderModel(preset("t5_1_1_tiny"))
    variables = jax.eval_shape(
        lambda: model.get_initial_variables(
            jax.random.PRNGKey(0), {"encoder_input_tokens": (1, 4), "decoder_input_tokens": (1, 3)}
        )
    )
    want = {
        "token_embedder/embedding": (32128, 8),
        "encoder/relpos_bias/rel_embedding": (4, 32),
        "encoder/encoder_norm/scale": (8,),
        "decoder/relpos_bias/rel_embedding": (4, 32),
        "decoder/decoder_norm/scale": (8,),
        "decoder/logits_dense/kernel": (8, 32128),
    }
    for i in range(2):
        want.update(_encdec_layer(f"encoder/layers_{i}", 8, 12, 16, cross=False))
        want.update(_encdec_layer(f"decoder/layers_{i}", 8, 12, 16, cross=True))
    assert _shapes(variables["params"]) == want
    axes = traverse_util.flatten_dict(variables["params_axes"], sep="/")
    # Every parameter names one logical axis per dimension.
    assert {k.removesuffix("_axes") for k in axes} == set(want)
    assert all(len(axes[f"{k}_axes"].names) == len(shape) for k, shape in want.items())
    assert axes["encoder/layers_0/attention/query/kernel_axes"].names == ("embed", "joined_kv")
    assert axes["token_embedder/embedding_axes"].names == ("vocab", "embed")
    assert axes["decoder/logits_dense/kernel_axes"].names == ("embed", "vocab")


def test_t5_1_0_ties_logits_and_uses_relu():
    cfg = preset("t5_1_0_small", num_encoder_layers=1, num_decoder_layers=1)
    model = EncoderDecoderModel(cfg)
    shapes = _shapes(
        jax.eval_shape(
            lambda: model.get_initial_variables(
                jax.random.PRNGKey(0), {"encoder_input_tokens": (1, 4), "decoder_input_tokens": (1, 3)}
            )
        )["params"]
    )
    assert "decoder/logits_dense/kernel" not in shapes
    assert shapes["encoder/layers_0/mlp/wi/kernel"] == (512, 2048)


def test_decoder_tiny_parameter_tree_is_upstreams():
    model = DecoderOnlyModel(preset("decoder_tiny"))
    variables = jax.eval_shape(
        lambda: model.get_initial_variables(jax.random.PRNGKey(0), {"decoder_input_tokens": (1, 4)})
    )
    want = {
        "decoder/token_embedder/embedding": (32128, 8),
        "decoder/relpos_bias/rel_embedding": (4, 32),
        "decoder/decoder_norm/scale": (8,),
        "decoder/logits_dense/kernel": (8, 32128),
    }
    for i in range(2):
        layer = _encdec_layer(f"decoder/layers_{i}", 8, 12, 16, cross=True)
        want.update({k: v for k, v in layer.items() if "cross" not in k and "encoder_decoder" not in k})
    assert _shapes(variables["params"]) == want


def test_umt5_tiny_scanned_tree_has_layer_axis_at_position_one():
    model = EncoderDecoderModel(preset("umt5_tiny"))
    variables = jax.eval_shape(
        lambda: model.get_initial_variables(
            jax.random.PRNGKey(0), {"encoder_input_tokens": (1, 4), "decoder_input_tokens": (1, 3)}
        )
    )
    shapes = _shapes(variables["params"])
    assert shapes["token_embedder/embedding"] == (256384, 8)
    assert shapes["encoder/layers/relpos_bias/rel_embedding"] == (4, 2, 32)
    assert shapes["encoder/layers/attention/query/kernel"] == (8, 2, 4, 3)
    assert shapes["encoder/layers/attention/out/kernel"] == (4, 2, 3, 8)
    assert shapes["decoder/layers/mlp/wi_0/kernel"] == (8, 2, 16)
    assert shapes["decoder/layers/pre_cross_attention_layer_norm/scale"] == (8, 2)
    assert "encoder/relpos_bias/rel_embedding" not in shapes
    axes = traverse_util.flatten_dict(variables["params_axes"], sep="/")
    assert axes["encoder/layers/attention/query/kernel_axes"].names == ("embed", "layers", "heads", "kv")


def _encdec_batch(rng, vocab, batch=2, inputs=7, targets=5, padded=True):
    enc = rng.integers(2, vocab, size=(batch, inputs)).astype(np.int32)
    tgt = rng.integers(2, vocab, size=(batch, targets)).astype(np.int32)
    if padded:
        enc[1, -2:] = 0
        tgt[1, -1:] = 0
    dec_in = np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1)
    return {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in, "decoder_target_tokens": tgt}


@pytest.mark.parametrize("per_layer", [False, True])
def test_scanned_matches_unscanned_for_same_weights(per_layer):
    cfg = preset("t5_1_1_tiny", vocab_size=40, per_layer_relpos_bias=per_layer, dropout_rate=0.0)
    batch = _encdec_batch(np.random.default_rng(0), 40)
    model = EncoderDecoderModel(cfg)
    params = model.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in batch.items()})[
        "params"
    ]
    scanned_cfg = dataclasses.replace(cfg, scan_layers=True)
    scanned_params = scan_params(params, cfg)
    scanned = EncoderDecoderModel(scanned_cfg)
    want = np.asarray(model.compute_logits(params, batch))
    got = np.asarray(scanned.compute_logits(scanned_params, batch))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    shapes = _shapes(
        jax.eval_shape(
            lambda: scanned.get_initial_variables(
                jax.random.PRNGKey(1), {k: v.shape for k, v in batch.items()}
            )
        )["params"]
    )
    assert shapes == _shapes(scanned_params)
    roundtrip = unscan_params(scanned_params, cfg)
    assert _shapes(roundtrip) == _shapes(params)


def test_remat_policies_give_same_loss_and_gradients():
    cfg = preset("decoder_tiny", vocab_size=40, scan_layers=True)
    tokens = np.random.default_rng(1).integers(2, 40, size=(2, 6)).astype(np.int32)
    batch = {"decoder_input_tokens": tokens, "decoder_target_tokens": tokens}
    base = DecoderOnlyModel(cfg)
    params = base.get_initial_variables(jax.random.PRNGKey(0), {"decoder_input_tokens": (2, 6)})["params"]
    grad_fn = lambda m: jax.value_and_grad(lambda p: m.loss_fn(p, batch, None)[0])(params)  # noqa: E731
    want_loss, want_grad = grad_fn(base)
    for policy in ("minimal", "full"):
        loss, grad = grad_fn(DecoderOnlyModel(dataclasses.replace(cfg, remat_policy=policy)))
        np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), grad, want_grad)


@pytest.mark.parametrize(("scan", "per_layer"), [(False, False), (True, False), (False, True)])
def test_encdec_cached_decoding_matches_full_logits(scan, per_layer):
    cfg = preset("t5_1_1_tiny", vocab_size=40, scan_layers=scan, per_layer_relpos_bias=per_layer)
    batch = _encdec_batch(np.random.default_rng(2), 40, padded=False)
    model = EncoderDecoderModel(cfg)
    shapes = {k: v.shape for k, v in batch.items()}
    params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    module, length = model.module, batch["decoder_input_tokens"].shape[1]
    enc, dec_in = batch["encoder_input_tokens"], batch["decoder_input_tokens"]

    @jax.jit
    def full_and_stepwise(params):
        # One program: teacher-forced logits, then the same tokens fed one by one through the cache.
        full = module.apply(
            {"params": params}, enc, dec_in, batch["decoder_target_tokens"], enable_dropout=False
        )
        cache_shapes = jax.eval_shape(
            lambda: module.apply(
                {"params": params}, enc, dec_in, dec_in, enable_dropout=False, decode=True,
                max_decode_length=length, mutable=["cache"],
            )[1]["cache"]
        )  # fmt: skip
        cache = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), cache_shapes)
        encoded = module.apply({"params": params}, enc, enable_dropout=False, method="encode")

        def step(cache, tok):
            logits, new_vars = module.apply(
                {"params": params, "cache": cache}, encoded, enc, tok[:, None], tok[:, None],
                enable_dropout=False, decode=True, max_decode_length=length, mutable=["cache"], method="decode",
            )  # fmt: skip
            return new_vars["cache"], logits[:, 0]

        _, stepped = jax.lax.scan(step, cache, dec_in.T)
        return full, jnp.swapaxes(stepped, 0, 1)

    full, stepped = full_and_stepwise(params)
    np.testing.assert_allclose(np.asarray(stepped), np.asarray(full), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(("bidirectional", "scan"), [(True, False), (False, False), (True, True)])
def test_decoder_prefill_then_cached_steps_match_full_logits(bidirectional, scan):
    cfg = preset("decoder_tiny", vocab_size=40, scan_layers=scan)
    length = 8
    tokens = np.random.default_rng(3).integers(2, 40, size=(2, length)).astype(np.int32)
    dec_in = np.concatenate([np.zeros((2, 1), np.int32), tokens[:, :-1]], axis=1)
    prompt = np.array([3, 1])  # per-example prompt lengths
    dca = (np.arange(length)[None, :] <= prompt[:, None]).astype(np.int32)
    batch = {"decoder_input_tokens": dec_in, "decoder_target_tokens": tokens, "decoder_causal_attention": dca}
    model = DecoderOnlyModel(cfg, inputs_bidirectional_attention=bidirectional)
    params = model.get_initial_variables(jax.random.PRNGKey(0), {"decoder_input_tokens": (2, length)})[
        "params"
    ]
    steps = length - int(prompt.max())
    rows = np.arange(2)

    @jax.jit
    def full_and_stepwise(params):
        full = model._logits(params, batch, None)
        cache, index = model._prefill(params, batch)

        def step(cache, t):
            tok = jnp.asarray(dec_in)[rows, index + t][:, None]
            logits, new_vars = model.module.apply(
                {"params": params, "cache": cache}, tok, tok, enable_dropout=False, decode=True,
                max_decode_length=length, mutable=["cache"],
            )  # fmt: skip
            return new_vars["cache"], logits[:, 0]

        _, stepped = jax.lax.scan(step, cache, jnp.arange(steps))
        return full, index, jnp.swapaxes(stepped, 0, 1)

    full, index, stepped = full_and_stepwise(params)
    np.testing.assert_array_equal(np.asarray(index), prompt)
    positions = prompt[:, None] + np.arange(steps)[None, :]
    want = np.asarray(full)[rows[:, None], positions]
    np.testing.assert_allclose(np.asarray(stepped), want, atol=2e-5, rtol=2e-5)
