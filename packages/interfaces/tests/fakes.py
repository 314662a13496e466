"""Minimal, correct implementations of the contracts, to test the checks with."""

from __future__ import annotations

import copy

import numpy as np

from t5x.interfaces import ArraySpec, RestoredCheckpoint


class ByteLevelVocabulary:
    """UTF-8 bytes shifted by 3 (pad 0, eos 1, unk 2); Python path only."""

    vocab_size = 259
    pad_id = 0
    eos_id = 1
    unk_id = 2
    extra_ids = 0

    def encode(self, s):
        return [b + 3 for b in s.encode("utf-8")]

    def decode(self, ids):
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")

    def encode_tf(self, s):
        raise NotImplementedError

    def decode_tf(self, ids):
        raise NotImplementedError

    def __eq__(self, other):
        return type(other) is type(self)

    def __hash__(self):
        return hash(type(self))


class CountingIterator:
    """Batches of consecutive integers; the state is the next integer."""

    def __init__(self, total, batch_size):
        self.total, self.batch_size, self.position = total, batch_size, 0

    @property
    def element_spec(self):
        return {"x": ArraySpec((self.batch_size,), "int64")}

    def __iter__(self):
        return self

    def __next__(self):
        if self.position + self.batch_size > self.total:
            raise StopIteration
        batch = {"x": np.arange(self.position, self.position + self.batch_size, dtype=np.int64)}
        self.position += self.batch_size
        return batch

    def get_state(self):
        return {"position": self.position}

    def set_state(self, state):
        self.position = int(state["position"])


class MemoryCheckpointer:
    """Keeps checkpoints in a shared dict, so a 'reopened' one sees earlier saves."""

    def __init__(self, store):
        self.store = store

    def save(self, step, train_state, input_state=None):
        self.store[step] = (copy.deepcopy(train_state), copy.deepcopy(input_state))

    def restore(self, step=None, target=None, shardings=None):
        step = self.latest_step() if step is None else step
        if step not in self.store:
            raise FileNotFoundError(f"no checkpoint for step {step}")
        state, input_state = self.store[step]
        return RestoredCheckpoint(step, copy.deepcopy(state), copy.deepcopy(input_state))

    def all_steps(self):
        return sorted(self.store)

    def latest_step(self):
        return max(self.store, default=None)

    def wait_until_finished(self):
        pass

    def close(self):
        pass


class ListWriter:
    """Records every call; refuses writes after close."""

    def __init__(self):
        self.calls, self.closed = [], False

    def _record(self, *call):
        if self.closed:
            raise RuntimeError("writer is closed")
        self.calls.append(call)

    def write_scalars(self, step, scalars):
        self._record("scalars", step, dict(scalars))

    def write_texts(self, step, texts):
        self._record("texts", step, dict(texts))

    def write_hparams(self, hparams):
        self._record("hparams", dict(hparams))

    def flush(self):
        pass

    def close(self):
        self.closed = True


class NumpyPartitioner:
    """One 'device', one process: every sharding is the identity."""

    mesh = None

    def partition(self, fn, in_shardings, out_shardings, static_argnums=(), donate_argnums=()):
        return fn

    def compile(self, partitioned_fn, *args):
        return partitioned_fn

    def get_data_layout(self, batch_size=None):
        from t5x.interfaces import DataLayout

        return DataLayout(batch_size=batch_size or 1, shard_id=0, num_shards=1)

    def get_sharding(self, logical_axes):
        return logical_axes

    def host_local_to_global(self, batch, logical_axes=None):
        return {k: np.asarray(v) for k, v in batch.items()}

    def global_to_host_local(self, arrays):
        return arrays


class UnigramModel:
    """Every target token is drawn from one learned distribution over the vocabulary."""

    feature_converter_cls = "t5x.feature_converters.LMFeatureConverter"

    def __init__(self, vocab_size=5):
        self.vocab_size = vocab_size

    def get_initial_variables(self, rng, input_shapes, input_types=None):
        return {"params": {"logits": np.zeros(self.vocab_size, np.float32)}}

    def _token_log_probs(self, params, batch):
        logits = params["logits"]
        log_probs = logits - np.log(np.exp(logits).sum())
        targets = batch["decoder_target_tokens"]
        return log_probs[targets] * (targets > 0)

    def loss_fn(self, params, batch, dropout_rng):
        loss = -float(self._token_log_probs(params, batch).sum())
        return loss, {"loss": loss}

    def eval_fn(self, params, batch):
        return self.loss_fn(params, batch, None)

    def score_batch(self, params, batch, return_intermediates=False):
        return self._token_log_probs(params, batch).sum(axis=1)

    def predict_batch_with_aux(self, params, batch, rng=None, **decode_kwargs):
        targets = batch["decoder_target_tokens"]
        best = int(np.argmax(params["logits"][1:])) + 1
        predictions = np.full_like(targets, best)
        return predictions, {"scores": self.score_batch(params, {"decoder_target_tokens": predictions})}

    def flops_per_token(self, model_feature_lengths):
        return 6.0 * self.vocab_size
