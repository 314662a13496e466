"""t5x-checkpointing's Checkpointer restores into what init_train_state returns.

The TrainState itself, its abstract shapes and its shardings are passed as
they are (no ``state_dict()`` by the caller), for Adafactor's slots and for an
Optax optimizer's; a parameter the checkpoint lacks falls back to the target.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from training_doubles import LocalPartitioner, TinyModel

from t5x.training import TrainState, adafactor, adamw, init_train_state

checkpointing = pytest.importorskip("t5x.checkpointing", reason="needs t5x-checkpointing (test extra)")

SHAPES = {"inputs": (8, 8), "targets": (8, 8)}
TYPES = {"inputs": jnp.int32, "targets": jnp.int32}
OPTIMIZERS = {"adafactor": lambda: adafactor(beta1=0.9), "adamw": lambda: adamw(1e-3)}


def _init(optimizer, seed):
    return init_train_state(
        TinyModel(), OPTIMIZERS[optimizer](), LocalPartitioner(), SHAPES, TYPES, seed=seed
    )


def _trained(state: TrainState, seed: int) -> TrainState:
    """``state`` after a few optimizer steps, so that every slot holds something other than its initial value."""
    for i in range(3):
        rng = jax.random.PRNGKey(seed + i)
        grads = jax.tree.map(lambda p, key=rng: jax.random.normal(key, p.shape, p.dtype), state.params)
        state = state.apply_gradient(grads, learning_rate=0.1)
    return state


def _assert_same(got, want):
    if isinstance(got, TrainState):  # the optimizer (static) is another object: compare the contents
        got, want = got.state_dict(), want.state_dict()
    got_leaves, got_tree = jax.tree.flatten(got)
    want_leaves, want_tree = jax.tree.flatten(want)
    assert got_tree == want_tree
    for a, b in zip(got_leaves, want_leaves):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module", params=sorted(OPTIMIZERS))
def saved(request, tmp_path_factory):
    """A checkpoint of a trained state, and a fresh ``init_train_state`` result with other values."""
    trained = _trained(_init(request.param, seed=0).state, seed=10)
    ckpt = checkpointing.Checkpointer(tmp_path_factory.mktemp(request.param), async_save=False)
    ckpt.save(3, trained.state_dict())
    return ckpt, trained, _init(request.param, seed=1)


@pytest.mark.parametrize(
    "target",
    [
        lambda init: init.state,
        lambda init: init.shapes,
        lambda init: jax.eval_shape(lambda: init.state),
    ],
    ids=["train_state", "shapes", "eval_shape"],
)
def test_restore_into_the_train_state_init_train_state_returns(saved, target):
    ckpt, trained, init = saved
    restored = ckpt.restore(target=target(init), shardings=init.shardings)
    assert restored.step == 3
    state = init.state.restore_state(restored.state)
    _assert_same(state, trained)
    assert int(state.step) == int(trained.step) == 3
    for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(init.shardings)):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    # The restored state trains on: same structure and shardings as the live one.
    grads = jax.tree.map(jnp.ones_like, state.params)
    jax.block_until_ready(state.apply_gradient(grads, learning_rate=0.1))


def test_restore_without_shardings_gives_the_values(saved):
    ckpt, trained, init = saved
    _assert_same(init.state.restore_state(ckpt.restore(target=init.state).state), trained)


def test_missing_parameter_is_named_and_falls_back_to_the_target(saved, tmp_path):
    _, trained, init = saved
    state_dict = trained.state_dict()
    params = dict(state_dict["target"])
    dropped = "out"  # its kernel, say, was added to the model after this checkpoint was written
    params[dropped] = {k: v for k, v in params[dropped].items() if k != "kernel"}
    ckpt = checkpointing.Checkpointer(tmp_path / "older", async_save=False)
    ckpt.save(5, {**state_dict, "target": params})
    with pytest.raises(KeyError, match=f"no parameter target/{dropped}/kernel; pass fallback_to_target=True"):
        ckpt.restore(target=init.state)
    restored = ckpt.restore(target=init.state, shardings=init.shardings, fallback_to_target=True)
    state = init.state.restore_state(restored.state)
    np.testing.assert_array_equal(state.params[dropped]["kernel"], init.state.params[dropped]["kernel"])
    assert not np.array_equal(state.params[dropped]["kernel"], trained.params[dropped]["kernel"])
    np.testing.assert_array_equal(state.params[dropped]["bias"], trained.params[dropped]["bias"])
    _assert_same(state.params["embed"], trained.params["embed"])
    _assert_same(state.opt_state, trained.opt_state)
    with pytest.raises(ValueError, match=f"target/{dropped}/kernel is not in .* no value to fall back to"):
        ckpt.restore(target=init.shapes, fallback_to_target=True)
