"""Adafactor against direct numpy formulas of the paper / upstream T5X rule."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x.training import (
    AdafactorState,
    FactorDim,
    HParamMap,
    TrainState,
    adafactor,
    standard_logical_factor_rules,
)

EPS1 = 1e-30


def _rms(x, axis=None):
    return np.sqrt(np.mean(np.square(x), axis=axis, keepdims=axis is not None))


def _factored_reference(grads, row_axis, lr, param=None, eps2=1e-3, clip=1.0, decay_rate=0.8):
    """Runs len(grads) steps of factored Adafactor in numpy (paper's sum form)."""
    r_acc = c_acc = None
    deltas = []
    for t, g in enumerate(grads):
        g = g.astype(np.float64)
        gm = g if row_axis == 0 else g.T  # [rows, cols]
        beta = 1.0 - (t + 1.0) ** (-decay_rate)
        row_sum = np.sum(gm**2 + EPS1, axis=1)
        col_sum = np.sum(gm**2 + EPS1, axis=0)
        r_acc = row_sum * (1 - beta) if r_acc is None else beta * r_acc + (1 - beta) * row_sum
        c_acc = col_sum * (1 - beta) if c_acc is None else beta * c_acc + (1 - beta) * col_sum
        v_hat = np.outer(r_acc, c_acc) / np.sum(r_acc)
        y = gm / np.sqrt(v_hat)
        y = y / max(1.0, _rms(y) / clip)
        scale = lr if param is None else lr * max(_rms(param), eps2)
        delta = -scale * y
        deltas.append(delta if row_axis == 0 else delta.T)
    return deltas


def _run(opt, params, grads_seq, lr=None):
    state = opt.init(params)
    deltas = []
    for grads in grads_seq:
        kwargs = {} if lr is None else {"learning_rate": lr}
        updates, state = opt.update(grads, state, params, **kwargs)
        deltas.append(updates)
        # Keep params fixed so that each step's reference scale is simple.
    return deltas, state


@pytest.mark.parametrize(("shape", "row_axis"), [((256, 128), 1), ((128, 256), 0), ((128, 128), 0)])
def test_factored_matches_numpy(shape, row_axis):
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=shape).astype(np.float32) for _ in range(3)]
    params = {"w": jnp.zeros(shape)}
    opt = adafactor(multiply_by_parameter_scale=False)
    deltas, state = _run(opt, params, [{"w": jnp.asarray(g)} for g in grads], lr=0.01)
    want = _factored_reference(grads, row_axis, lr=0.01)
    for got, ref in zip(deltas, want, strict=True):
        np.testing.assert_allclose(np.asarray(got["w"]), ref, rtol=2e-4, atol=1e-7)
    slots = state.param_states["w"]
    rows, cols = (shape[row_axis],), (shape[1 - row_axis],)
    assert slots.v_row.shape == rows
    assert slots.v_col.shape == cols
    assert slots.v.shape == (1,)
    assert slots.m.shape == (1,)
    assert int(state.count) == 3


def test_unfactored_small_and_vector_params():
    rng = np.random.default_rng(1)
    params = {"small": jnp.zeros((64, 300)), "vec": jnp.zeros((300,))}
    opt = adafactor(multiply_by_parameter_scale=False, clipping_threshold=None)
    grads = [
        {k: jnp.asarray(rng.normal(size=v.shape), jnp.float32) for k, v in params.items()} for _ in range(2)
    ]
    deltas, state = _run(opt, params, grads, lr=0.1)
    for name in params:
        v = np.zeros(params[name].shape)
        for t, g in enumerate(grads):
            g = np.asarray(g[name], np.float64)
            beta = 1 - (t + 1.0) ** -0.8
            v = beta * v + (1 - beta) * (g**2 + EPS1)
            np.testing.assert_allclose(np.asarray(deltas[t][name]), -0.1 * g / np.sqrt(v), rtol=1e-5)
        assert state.param_states[name].v.shape == params[name].shape
        assert state.param_states[name].v_row.shape == (1,)
        assert state.param_states[name].v_col.shape == (1,)


def test_update_clipping():
    g = np.array([[3.0, -1e-3], [2.0, 0.5]], np.float32)
    params = {"w": jnp.zeros((2, 2))}
    # Unfactored, first step: y = g / sqrt(g^2 + eps1) = sign(g), RMS 1.
    for threshold, divisor in [(1.0, 1.0), (0.5, 2.0), (0.25, 4.0), (None, 1.0)]:
        opt = adafactor(multiply_by_parameter_scale=False, clipping_threshold=threshold)
        (delta,), _ = _run(opt, params, [{"w": jnp.asarray(g)}], lr=1.0)
        np.testing.assert_allclose(np.asarray(delta["w"]), -np.sign(g) / divisor, rtol=1e-6)


def test_parameter_scale_with_epsilon2_floor():
    rng = np.random.default_rng(2)
    big = rng.normal(size=(8, 4)).astype(np.float32) * 3
    params = {"big": jnp.asarray(big), "tiny": jnp.full((8, 4), 1e-5)}
    g = {k: jnp.ones_like(v) for k, v in params.items()}
    opt = adafactor()
    (delta,), _ = _run(opt, params, [g], lr=0.5)
    np.testing.assert_allclose(np.asarray(delta["big"]), -0.5 * _rms(big) * np.ones((8, 4)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(delta["tiny"]), -0.5 * 1e-3 * np.ones((8, 4)), rtol=1e-5)


def test_parameter_scale_hparam_map_and_max_scale():
    params = {"a": jnp.full((4,), 10.0), "b": jnp.full((4,), 10.0)}
    g = {k: jnp.ones_like(v) for k, v in params.items()}
    opt = adafactor(
        multiply_by_parameter_scale=HParamMap([("a", True), (".*", False)]), max_parameter_scale=2.0
    )
    (delta,), _ = _run(opt, params, [g], lr=0.5)
    np.testing.assert_allclose(np.asarray(delta["a"]), -0.5 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(delta["b"]), -0.5, rtol=1e-6)


def test_momentum_weight_decay_and_step_offset():
    g = np.array([1.0, -2.0, 4.0], np.float32)
    p = np.array([1.0, 2.0, 3.0], np.float32)
    params = {"w": jnp.asarray(p)}
    opt = adafactor(
        multiply_by_parameter_scale=False,
        beta1=0.9,
        weight_decay_rate=0.01,
        step_offset=5,
        clipping_threshold=None,
    )
    state = opt.init(params)
    assert state.param_states["w"].m.shape == (3,)
    state = state._replace(count=jnp.asarray(5, jnp.int32))  # first step after the offset: no decay
    updates, state = opt.update({"w": jnp.asarray(g)}, state, params, learning_rate=0.1)
    y = g / np.sqrt(g.astype(np.float64) ** 2 + EPS1)
    m = 0.1 * (0.1 * y)
    np.testing.assert_allclose(np.asarray(state.param_states["w"].m), m, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(updates["w"]), -m - 0.01 * p, rtol=1e-6)


def test_global_norm_clip_and_schedule_learning_rate():
    params = {"w": jnp.zeros((4,))}
    g = {"w": jnp.asarray([3.0, 4.0, 0.0, 0.0])}
    opt = adafactor(
        learning_rate=lambda count: 0.5 * (count + 1),
        multiply_by_parameter_scale=False,
        global_norm_clip_threshold=1.0,
    )
    state = opt.init(params)
    updates, state = opt.update(g, state, params)
    # Clipped gradient [0.6, 0.8, 0, 0]; unfactored first step -> sign, RMS 1/sqrt(2) (zeros stay ~0).
    np.testing.assert_allclose(np.asarray(state.param_states["w"].v)[:2], [0.36, 0.64], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(updates["w"])[:2], [-0.5, -0.5], rtol=1e-6)
    with pytest.raises(ValueError, match="learning rate"):
        adafactor().update(g, adafactor().init(params), params)


def test_skip_nan_updates():
    params = {"w": jnp.ones((3,))}
    opt = adafactor(skip_nan_updates=True)
    state = opt.init(params)
    updates, new_state = opt.update({"w": jnp.asarray([1.0, jnp.nan, 1.0])}, state, params, learning_rate=0.1)
    assert np.all(np.isfinite(np.asarray(updates["w"])))
    assert np.asarray(updates["w"])[1] == 0.0
    assert np.all(np.isfinite(np.asarray(new_state.param_states["w"].v)))


def test_logical_rules_treat_layers_as_batch():
    rng = np.random.default_rng(3)
    stacked = rng.normal(size=(128, 3, 256)).astype(np.float32)
    grads = rng.normal(size=(128, 3, 256)).astype(np.float32)
    axes = {"scanned": ("embed", "layers", "mlp"), "scale": ("embed", "layers")}
    params = {"scanned": jnp.asarray(stacked), "scale": jnp.ones((128, 3))}
    opt = adafactor(logical_factor_rules=standard_logical_factor_rules()).with_param_axes(axes)
    state = opt.init(params)
    slots = state.param_states["scanned"]
    assert slots.v_row.shape == (128, 3)
    assert slots.v_col.shape == (3, 256)
    assert state.param_states["scale"].v.shape == (128, 3)  # half-factored spec -> unfactored
    updates, _ = opt.update(
        {"scanned": jnp.asarray(grads), "scale": jnp.ones((128, 3))}, state, params, learning_rate=0.1
    )
    # Each layer is updated as if it were a separate (128, 256) matrix.
    single = adafactor()
    for layer in range(3):
        p = {"w": jnp.asarray(stacked[:, layer])}
        (delta,), _ = _run(single, p, [{"w": jnp.asarray(grads[:, layer])}], lr=0.1)
        np.testing.assert_allclose(
            np.asarray(updates["scanned"])[:, layer], np.asarray(delta["w"]), rtol=2e-5, atol=1e-8
        )


def test_rank3_without_rules_and_unknown_axis_raise():
    params = {"w": jnp.zeros((4, 4, 4))}
    with pytest.raises(ValueError, match="explicit factorization rule"):
        adafactor().init(params)
    with pytest.raises(ValueError, match="'mystery'"):
        adafactor(
            logical_factor_rules=standard_logical_factor_rules(),
            params_axes={"w": ("embed", "mystery", "mlp")},
        )


def test_two_dim_rules_fall_back_to_shape_heuristic():
    params = {"k": jnp.zeros((256, 128))}
    opt = adafactor(logical_factor_rules=standard_logical_factor_rules(), params_axes={"k": ("embed", "mlp")})
    slots = opt.init(params).param_states["k"]
    assert slots.v_row.shape == (128,)  # heuristic: the smaller dim is the row
    assert slots.v_col.shape == (256,)
    explicit = adafactor(factor_map=HParamMap([(".*", (FactorDim.BATCH, FactorDim.ROW, FactorDim.COLUMN))]))
    slots = explicit.init({"k": jnp.zeros((2, 256, 128))}).param_states["k"]
    assert slots.v_row.shape == (2, 256)
    assert slots.v_col.shape == (2, 128)


def test_state_dict_uses_t5x_slot_names():
    params = {"encoder": {"kernel": jnp.ones((256, 128)), "scale": jnp.ones((128,))}}
    opt = adafactor(beta1=0.9)
    state = TrainState.create(opt, {"params": params})
    state = state.apply_gradient(jax.tree.map(jnp.ones_like, params), learning_rate=0.01)
    sd = state.state_dict()
    assert set(sd) == {"target", "state"}
    assert int(sd["state"]["step"]) == 1
    slots = sd["state"]["param_states"]["encoder"]["kernel"]
    assert set(slots) == {"v_row", "v_col", "v", "m"}
    assert slots["v"].shape == (1,)
    assert slots["m"].shape == (256, 128)
    restored = TrainState.from_state_dict(sd, opt)
    assert isinstance(restored.opt_state, AdafactorState)
    assert int(restored.opt_state.count) == 1
    for a, b in zip(jax.tree.leaves(restored.opt_state), jax.tree.leaves(state.opt_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    bad = jax.tree.map(lambda x: x, sd)
    del bad["state"]["param_states"]["encoder"]["kernel"]["m"]
    with pytest.raises(ValueError, match="encoder/kernel/m"):
        TrainState.from_state_dict(bad, opt)


def test_works_inside_optax_multi_transform():
    params = {"a": jnp.ones((4,)), "b": jnp.ones((4,))}
    opt = optax.multi_transform(
        {"ada": adafactor(multiply_by_parameter_scale=False), "sgd": optax.sgd(0.1)}, {"a": "ada", "b": "sgd"}
    )
    state = opt.init(params)
    updates, _ = opt.update(jax.tree.map(jnp.ones_like, params), state, params, learning_rate=0.2)
    np.testing.assert_allclose(np.asarray(updates["a"]), -0.2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(updates["b"]), -0.1, rtol=1e-6)
