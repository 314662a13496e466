"""Matmuls with operands rounded to bfloat16: values, gradients, and whole models."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

from t5x.models import DecoderOnlyConfig, DecoderOnlyModel, preset
from t5x.models._matmul import dense, dot_general

VOCAB = 40

# (x shape, y shape, dimension numbers): a dense layer, a two-axis contraction (the
# attention output projection), both attention products, and a transposed-operand case.
CASES = [
    ((3, 5, 6), (6, 7), (((2,), (0,)), ((), ()))),
    ((3, 5, 4, 2), (4, 2, 7), (((2, 3), (0, 1)), ((), ()))),
    ((2, 5, 3, 4), (2, 6, 3, 4), (((3,), (3,)), ((0, 2), (0, 2)))),
    ((2, 3, 5, 6), (2, 6, 3, 4), (((3,), (1,)), ((0, 1), (0, 2)))),
    ((6, 4), (5, 6), (((0,), (1,)), ((), ()))),
]


def _round(a):
    return a.astype(jnp.bfloat16).astype(jnp.float32)


def _operands(xs, ys):
    return jax.random.normal(jax.random.PRNGKey(0), xs), jax.random.normal(jax.random.PRNGKey(1), ys)


@pytest.mark.parametrize("xs,ys,dims", CASES)
def test_without_matmul_dtype_it_is_lax_dot_general(xs, ys, dims):
    x, y = _operands(xs, ys)
    np.testing.assert_array_equal(dot_general(x, y, dims), lax.dot_general(x, y, dims))
    np.testing.assert_array_equal(dot_general(x, y, dims, "float32"), lax.dot_general(x, y, dims))


@pytest.mark.parametrize("xs,ys,dims", CASES)
def test_rounded_product_and_its_gradients(xs, ys, dims):
    x, y = _operands(xs, ys)
    out = dot_general(x, y, dims, "bfloat16")
    assert out.dtype == jnp.float32
    exact = lax.dot_general(_round(x), _round(y), dims)
    np.testing.assert_allclose(out, exact, rtol=1e-5, atol=1e-5)
    assert float(jnp.max(jnp.abs(out - lax.dot_general(x, y, dims)))) > 0  # it did round

    g = jax.random.normal(jax.random.PRNGKey(2), out.shape)
    _, vjp = jax.vjp(lambda a, b: dot_general(a, b, dims, "bfloat16"), x, y)
    dx, dy = vjp(g)
    # The backward products round the incoming gradient too, as a TPU's default precision does.
    _, exact_vjp = jax.vjp(lambda a, b: lax.dot_general(a, b, dims), _round(x), _round(y))
    ex, ey = exact_vjp(_round(g))
    assert dx.shape == x.shape and dy.shape == y.shape
    np.testing.assert_allclose(dx, ex, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dy, ey, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xs", [(6, 5), (3, 4, 5)])
def test_dense_is_the_plain_product_with_the_same_gradients(xs):
    x, kernel = _operands(xs, (5, 7))
    dims = (((len(xs) - 1,), (0,)), ((), ()))
    np.testing.assert_array_equal(dense(x, kernel), lax.dot_general(x, kernel, dims))
    g = jax.random.normal(jax.random.PRNGKey(2), (*xs[:-1], 7))
    dx, dk = jax.vjp(dense, x, kernel)[1](g)
    ex, ek = jax.vjp(lambda a, b: lax.dot_general(a, b, dims), x, kernel)[1](g)
    assert dx.shape == x.shape and dk.shape == kernel.shape
    np.testing.assert_allclose(dx, ex, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dk, ek, rtol=1e-5, atol=1e-5)
    # With a matmul dtype it is the rounded product of `dot_general`.
    np.testing.assert_array_equal(dense(x, kernel, "bfloat16"), dot_general(x, kernel, dims, "bfloat16"))


def test_dense_names_mismatched_shapes():
    with pytest.raises(ValueError, match=r"dense: x \(3, 4\) and kernel \(5, 7\)"):
        dense(jnp.ones((3, 4)), jnp.ones((5, 7)))
    with pytest.raises(ValueError, match=r"dense: x \(3, 4\) and kernel \(\)"):
        dense(jnp.ones((3, 4)), jnp.ones(()))


def test_matmul_dtype_is_validated_and_canonical():
    assert DecoderOnlyConfig(vocab_size=VOCAB, matmul_dtype=jnp.bfloat16).matmul_dtype == "bfloat16"
    assert DecoderOnlyConfig(vocab_size=VOCAB).matmul_dtype is None
    with pytest.raises(ValueError, match=r"T5Config\.matmul_dtype.*'bf61'"):
        dataclasses.replace(preset("t5_1_1_tiny", vocab_size=VOCAB), matmul_dtype="bf61")


def _norm(tree):
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(tree))))


def _batch(rng, batch, length):
    tgt = rng.integers(2, VOCAB, size=(batch, length)).astype(np.int32)
    return {
        "decoder_input_tokens": np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], 1),
        "decoder_target_tokens": tgt,
        "decoder_loss_weights": np.ones(tgt.shape, np.float32),
    }


def test_bfloat16_matmuls_stay_close_to_float32_and_train():
    cfg = preset("decoder_tiny", vocab_size=VOCAB)
    exact, rounded = (
        DecoderOnlyModel(cfg),
        DecoderOnlyModel(dataclasses.replace(cfg, matmul_dtype="bfloat16")),
    )
    batch = _batch(np.random.default_rng(0), 4, 12)
    params = exact.get_initial_variables(jax.random.PRNGKey(0), {"decoder_input_tokens": (4, 12)})["params"]
    a, b = exact.compute_logits(params, batch), rounded.compute_logits(params, batch)
    assert a.dtype == b.dtype == jnp.float32
    spread, error = float(jnp.std(a)), jnp.abs(a - b)
    assert 0 < float(jnp.mean(error)) < 0.01 * spread and float(jnp.max(error)) < 0.1 * spread

    ga = jax.grad(lambda p: exact.loss_fn(p, batch, None)[0])(params)
    gb = jax.grad(lambda p: rounded.loss_fn(p, batch, None)[0])(params)
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(gb))
    difference = _norm(jax.tree.map(jnp.subtract, gb, ga))
    assert 0 < difference < 0.03 * _norm(ga)

    opt = optax.adam(3e-2)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(lambda p: rounded.loss_fn(p, batch, None)[0])(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for _ in range(10):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses
