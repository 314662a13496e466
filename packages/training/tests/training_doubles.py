"""Small test doubles that implement the t5x.interfaces contracts.

A tiny pure-JAX classifier Model, a one-axis Partitioner over the local devices,
an on-disk npz Checkpointer and a numpy InputIterator.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from t5x.interfaces import ArraySpec, DataLayout, RestoredCheckpoint

VOCAB = 16
LENGTH = 8
HIDDEN = 32


class TinyModel:
    """Predicts each target token from the input token at the same position.

    Batch: ``inputs`` and ``targets``, int32 ``[batch, LENGTH]``. The loss sums
    the per-token cross-entropy (T5X's default normalisation), so gradients of
    microbatches add up to the full batch's.
    """

    feature_converter_cls = dict

    def __init__(self, dropout_rate: float = 0.1, z_loss: float = 1e-4):
        self.dropout_rate = dropout_rate
        self.z_loss = z_loss

    def get_initial_variables(self, rng, input_shapes, input_types=None):
        del input_shapes, input_types
        k1, k2 = jax.random.split(rng)
        params = {
            "embed": {"embedding": jax.random.normal(k1, (VOCAB, HIDDEN)) * 0.5},
            "out": {"kernel": jax.random.normal(k2, (HIDDEN, VOCAB)) * 0.1, "bias": jnp.zeros((VOCAB,))},
        }
        axes = {
            "embed": {"embedding": ("vocab", "embed")},
            "out": {"kernel": ("embed", "vocab"), "bias": ("vocab",)},
        }
        return {"params": params, "params_axes": axes}

    def _logits(self, params, batch, rng):
        hidden = jnp.tanh(params["embed"]["embedding"][batch["inputs"]])
        if rng is not None and self.dropout_rate:
            keep = jax.random.bernoulli(rng, 1 - self.dropout_rate, hidden.shape)
            hidden = jnp.where(keep, hidden / (1 - self.dropout_rate), 0.0)
        return hidden @ params["out"]["kernel"] + params["out"]["bias"]

    def _loss(self, logits, targets):
        log_z = jax.nn.logsumexp(logits, axis=-1)
        log_p = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - log_z
        z_loss = self.z_loss * jnp.sum(log_z**2)
        loss = -jnp.sum(log_p) + z_loss
        accuracy = jnp.mean((jnp.argmax(logits, -1) == targets).astype(jnp.float32))
        return loss, {"loss": loss, "z_loss": z_loss, "accuracy": accuracy}

    def loss_fn(self, params, batch, dropout_rng):
        return self._loss(self._logits(params, batch, dropout_rng), batch["targets"])

    def eval_fn(self, params, batch):
        return self._loss(self._logits(params, batch, None), batch["targets"])

    def score_batch(self, params, batch, return_intermediates=False):
        logits = self._logits(params, batch, None)
        log_p = jax.nn.log_softmax(logits)
        return jnp.sum(jnp.take_along_axis(log_p, batch["targets"][..., None], axis=-1)[..., 0], axis=-1)

    def predict_batch_with_aux(self, params, batch, rng=None, **decode_kwargs):
        logits = self._logits(params, batch, None)
        predictions = jnp.argmax(logits, -1).astype(jnp.int32)
        scores = jnp.sum(jnp.max(jax.nn.log_softmax(logits), -1), -1)
        return predictions, {"scores": scores}

    def flops_per_token(self, model_feature_lengths):
        return 6.0 * HIDDEN * VOCAB


def make_data(num_examples: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A learnable mapping: target = (3 * input + 1) mod VOCAB."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(0, VOCAB, size=(num_examples, LENGTH)).astype(np.int32)
    return {"inputs": inputs, "targets": ((3 * inputs + 1) % VOCAB).astype(np.int32)}


class ArrayIterator:
    """Batches of numpy arrays in a seeded per-epoch order; state is (epoch, position)."""

    def __init__(
        self,
        data: Mapping[str, np.ndarray],
        batch_size: int,
        seed: int = 0,
        repeat: bool = True,
        shuffle: bool = True,
    ):
        self.data = {k: np.asarray(v) for k, v in data.items()}
        self.size = len(next(iter(self.data.values())))
        self.batch_size, self.seed, self.repeat, self.shuffle = batch_size, seed, repeat, shuffle
        self.epoch, self.position = 0, 0

    @property
    def element_spec(self):
        return {k: ArraySpec((self.batch_size, *v.shape[1:]), str(v.dtype)) for k, v in self.data.items()}

    def __iter__(self):
        return self

    def _order(self):
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.size)

    def __next__(self):
        if self.position + self.batch_size > self.size:
            if not self.repeat:
                if self.position >= self.size:
                    raise StopIteration
                idx = self._order()[self.position :]
                self.position = self.size
                return {k: v[idx] for k, v in self.data.items()}
            self.epoch, self.position = self.epoch + 1, 0
        idx = self._order()[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return {k: v[idx] for k, v in self.data.items()}

    def get_state(self):
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def set_state(self, state):
        if state["seed"] != self.seed:
            raise ValueError(f"state seed {state['seed']} != iterator seed {self.seed}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class LocalPartitioner:
    """Data parallelism over this process's devices on a one-axis mesh."""

    def __init__(self, devices=None):
        devices = np.asarray(devices if devices is not None else jax.devices())
        self.mesh = jax.sharding.Mesh(devices, ("data",), axis_types=(jax.sharding.AxisType.Auto,))

    def _spec(self, names):
        return PartitionSpec(*("data" if n == "batch" else None for n in names))

    def get_sharding(self, logical_axes):
        def one(names):
            if isinstance(names, jax.sharding.Sharding):
                return names
            return NamedSharding(self.mesh, self._spec(names or ()))

        def is_names(x):
            return x is None or (type(x) is tuple and all(isinstance(n, (str, type(None))) for n in x))

        return jax.tree.map(one, logical_axes, is_leaf=is_names)

    def partition(self, fn, in_shardings, out_shardings, static_argnums=(), donate_argnums=()):
        return jax.jit(
            fn,
            in_shardings=self.get_sharding(in_shardings),
            out_shardings=self.get_sharding(out_shardings),
            static_argnums=static_argnums,
            donate_argnums=donate_argnums,
        )

    def compile(self, partitioned_fn, *args):
        return partitioned_fn.lower(*args).compile()

    def get_data_layout(self, batch_size=None):
        return DataLayout(batch_size=batch_size or self.mesh.size, shard_id=0, num_shards=1)

    def host_local_to_global(self, batch, logical_axes=None):
        return {
            k: jax.device_put(
                np.asarray(v), NamedSharding(self.mesh, self._spec(("batch",) + (None,) * (np.ndim(v) - 1)))
            )
            for k, v in batch.items()
        }

    def global_to_host_local(self, arrays):
        return jax.tree.map(np.asarray, arrays)


def _flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _unflatten(flat):
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        node = tree
        *parents, last = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


class NpzCheckpointer:
    """Saves state dicts as npz files in ``checkpoint_<step>/``, atomically (synchronous)."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.closed = False

    def save(self, step, train_state, input_state=None):
        final = os.path.join(self.directory, f"checkpoint_{step}")
        tmp = final + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        flat = {k: np.asarray(jax.device_get(v)) for k, v in _flatten(train_state).items()}
        with open(os.path.join(tmp, "state.npz"), "wb") as f:
            np.savez(f, **{k.replace("/", "|"): v for k, v in flat.items()})
        with open(os.path.join(tmp, "input_state.json"), "w") as f:
            json.dump(input_state, f)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)

    def all_steps(self):
        steps = []
        for name in os.listdir(self.directory):
            if name.startswith("checkpoint_") and not name.endswith(".tmp"):
                steps.append(int(name.split("_")[1]))
        return sorted(steps)

    def latest_step(self):
        steps = self.all_steps()
        return steps[-1] if steps else None

    def restore(self, step=None, target=None, shardings=None):
        step = self.latest_step() if step is None else step
        folder = os.path.join(self.directory, f"checkpoint_{step}")
        if step is None or not os.path.isdir(folder):
            raise FileNotFoundError(f"no checkpoint {step} in {self.directory}")
        with np.load(os.path.join(folder, "state.npz")) as f:
            flat = {k.replace("|", "/"): f[k] for k in f.files}
        if shardings is not None:
            flat_shardings = _flatten(shardings)
            flat = {
                k: jax.device_put(v, flat_shardings[k]) if k in flat_shardings else v for k, v in flat.items()
            }
        with open(os.path.join(folder, "input_state.json")) as f:
            input_state = json.load(f)
        return RestoredCheckpoint(step=step, state=_unflatten(flat), input_state=input_state)

    def wait_until_finished(self):
        pass

    def close(self):
        self.closed = True
