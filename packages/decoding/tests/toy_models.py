"""Small deterministic stand-ins for a model, each with a pure-Python reference."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

EOS = 1


@dataclasses.dataclass
class MarkovModel:
    """Logits depend on the position and on a running hash of every token fed so far.

    The hash lives in the cache (one int per row), so a decoder that forgets to expand, gather
    or update the cache gives logits that disagree with :meth:`logits`, the reference.
    """

    vocab: int = 4
    length: int = 4
    states: int = 7
    seed: int = 0
    eos_bias: float = 0.0
    scale: float = 2.0

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        table = rng.normal(size=(self.length + 2, self.states, self.vocab)) * self.scale
        table[..., EOS] += self.eos_bias
        self.table = table.astype(np.float32)

    # ----- the model side: what a real model's tokens_to_logits does -----
    def init_cache(self, start_states, offset: int = 0) -> dict:
        state = jnp.asarray(start_states, jnp.int32)
        if offset:
            state = jnp.stack([state, state])  # two "scanned layers" holding the same state
        return {"decoder": {"hash": state, "cache_index": jnp.zeros((), jnp.int32)}}

    def tokens_to_logits(self, decoding_state, offset: int = 0):
        cache = decoding_state.cache["decoder"]
        old = cache["hash"][0] if offset else cache["hash"]
        new = (old * 3 + decoding_state.cur_token[:, 0] + 1) % self.states
        logits = jnp.asarray(self.table)[decoding_state.cur_index, new]
        new_hash = jnp.stack([new, new]) if offset else new
        return logits, {"decoder": {"hash": new_hash, "cache_index": cache["cache_index"] + 1}}

    # ----- the reference side -----
    def fed_state(self, start_state: int, fed: list[int]) -> int:
        state = start_state
        for token in fed:
            state = (state * 3 + token + 1) % self.states
        return state

    def logits(self, start_state: int, fed: list[int]) -> np.ndarray:
        """Logits for the token after ``fed`` (which starts with the BOS token 0)."""
        return self.table[len(fed) - 1, self.fed_state(start_state, fed)]

    def log_probs(self, start_state: int, fed: list[int]) -> np.ndarray:
        z = self.logits(start_state, fed).astype(np.float64)
        return z - np.log(np.sum(np.exp(z - z.max()))) - z.max()


def brevity(alpha: float, length: int) -> float:
    return ((5.0 + length) / 6.0) ** alpha


def exhaustive_finished(model: MarkovModel, start_state: int, prompt: list[int], length: int, alpha: float):
    """Every EOS-terminated output of at most ``length`` tokens, scored like beam search.

    Returns a list of (score, tokens padded to ``length``) sorted best first.
    """
    results = []

    def extend(tokens: list[int], log_prob: float) -> None:
        position = len(tokens)  # index of the next output token
        if position >= length:
            return
        lp = model.log_probs(start_state, [0, *tokens])
        if position < len(prompt) and prompt[position] != 0:
            extend([*tokens, prompt[position]], log_prob)
            return
        for token in range(model.vocab):
            total = log_prob + lp[token]
            if token == EOS:
                seq = [*tokens, token] + [0] * (length - position - 1)
                results.append((total / brevity(alpha, position + 1), seq))
            else:
                extend([*tokens, token], total)

    extend([], 0.0)
    results.sort(key=lambda item: -item[0])
    return results


def exhaustive_unfinished(model: MarkovModel, start_state: int, length: int):
    """Every EOS-free output of exactly ``length`` tokens with its log-probability, best first."""
    results = []

    def extend(tokens: list[int], log_prob: float) -> None:
        if len(tokens) == length:
            results.append((log_prob, tokens))
            return
        lp = model.log_probs(start_state, [0, *tokens])
        for token in range(model.vocab):
            if token != EOS:
                extend([*tokens, token], log_prob + lp[token])

    extend([], 0.0)
    results.sort(key=lambda item: -item[0])
    return results


def greedy_reference(model: MarkovModel, start_state: int, prompt: list[int], length: int):
    """Greedy decode with forced prompt; returns (tokens, log-prob of the decoded tokens)."""
    tokens: list[int] = []
    total = 0.0
    for position in range(length):
        if position < len(prompt) and prompt[position] != 0:
            tokens.append(prompt[position])
            continue
        lp = model.log_probs(start_state, [0, *tokens])
        token = int(np.argmax(model.logits(start_state, [0, *tokens])))
        tokens.append(token)
        total += lp[token]
        if token == EOS:
            break
    return tokens + [0] * (length - len(tokens)), total


def tempered(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    return p / p.sum()


def assert_close_scores(actual, expected, atol=2e-4):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert math.isclose(float(a), float(e), abs_tol=atol), (actual, expected)


def jit_decode(fn, **static):
    """jit a decode function over its array arguments."""
    return jax.jit(lambda *arrays: fn(*arrays, **static))
