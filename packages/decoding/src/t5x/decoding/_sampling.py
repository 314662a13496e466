"""Temperature, top-k and top-p sampling (and greedy decoding) in one while loop."""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t5x.decoding import _checks, _select
from t5x.decoding._beams import flat_batch_beam_expand, keep_scalars, unflatten_beam_dim
from t5x.decoding._masks import topk_mask, topp_mask
from t5x.decoding._state import MIN_TEMPERATURE, DecodingState, PyTree

# Two slots past the end of the sequence buffer: position L+1 absorbs the writes of rows
# that reached their end while other rows (started from a later prefill index) still run.
_EXTRA_SLOTS = 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingLoopState:
    """The carry of the sampling loop, as seen by ``state_callback_fn`` / ``logit_callback_fn``.

    Attributes:
      step: scalar int32, loop iterations done.
      cur_index: ``[rows]`` int32, position of ``cur_token``.
      sequences: ``[rows, length + 2]`` int32; position 0 is BOS, the output is ``[1:-1]``.
      cache: the model's cache.
      cur_token: ``[rows, 1]`` int32, the token fed at the next step.
      ended: ``[rows]`` bool, rows that produced EOS or reached their length.
      rng: the PRNG key of the next step.
      log_prob: ``[rows]`` float32, the log-probability of the decoded tokens so far.
    """

    step: jax.Array
    cur_index: jax.Array
    sequences: jax.Array
    cache: PyTree
    cur_token: jax.Array
    ended: jax.Array
    rng: jax.Array
    log_prob: jax.Array

    def replace(self, **changes: Any) -> SamplingLoopState:
        """Returns a copy with the given fields replaced."""
        return dataclasses.replace(self, **changes)


def _read_position(sequences: jax.Array, index: jax.Array) -> jax.Array:
    """``sequences[r, index[r]]`` as a masked sum: elementwise work keeps sharding intact."""
    positions = jnp.arange(sequences.shape[1], dtype=index.dtype)
    return jnp.sum(jnp.where(positions[None, :] == index[:, None], sequences, 0), axis=1)


def _write_position(sequences: jax.Array, index: jax.Array, token: jax.Array) -> jax.Array:
    positions = jnp.arange(sequences.shape[1], dtype=index.dtype)
    return jnp.where(positions[None, :] == index[:, None], token[:, None], sequences)


def _pick(log_probs: jax.Array, token: jax.Array) -> jax.Array:
    vocab = jnp.arange(log_probs.shape[-1], dtype=token.dtype)
    return jnp.sum(jnp.where(vocab[None, :] == token[:, None], log_probs, 0.0), axis=-1)


def _rows(value: Any, num_decodes: int) -> Any:
    """Scalars stay scalars; per-example ``[batch]`` values become ``[rows, 1]``."""
    if np.ndim(value) == 0:
        return value
    return jnp.repeat(jnp.asarray(value), num_decodes)[:, None]


def _is_off(value: Any) -> bool:
    """True when a filter parameter is concretely zero everywhere (so it can be skipped)."""
    values = _checks.concrete(value)
    return values is not None and not np.any(values)


def temperature_sample(
    inputs: jax.Array,
    cache: PyTree,
    tokens_to_logits: Callable[[DecodingState], tuple[jax.Array, PyTree]],
    eos_id: int,
    decode_rng: jax.Array | None = None,
    num_decodes: int = 1,
    temperature: Any = 1.0,
    topk: Any = 0,
    topp: Any = 0.0,
    cache_offset: int = 0,
    initial_index: jax.Array | None = None,
    max_decode_steps: Any = None,
    max_decode_steps_hard_limit: int | None = None,
    rescale_log_probs: bool = True,
    state_callback_fn: Callable[[SamplingLoopState], SamplingLoopState] | None = None,
    logit_callback_fn: Callable[[jax.Array, SamplingLoopState], jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Samples continuations autoregressively, ``num_decodes`` per example, in one while loop.

    ``inputs`` is laid out like the decoder input tokens of T5X: position 0 is the BOS token
    (0) and is ignored, positions 1.. hold an optional prompt, then 0s. Position ``p`` of the
    output is ``inputs[:, p + 1]`` wherever that is non-zero (the prompt is forced and costs
    no log-probability) and a decoded token elsewhere. Decoding starts by feeding token 0 at
    index 0, or, with ``initial_index``, by feeding ``inputs[r, initial_index[r]]`` at that
    index to a cache already filled up to it. A row stops after it decodes ``eos_id`` (EOS
    tokens inside the prompt do not count) or fills its length; later positions are 0.

    Temperature 0 (per example or for all) decodes greedily. ``topk`` and ``topp`` filter the
    tempered logits before sampling; both may be set and are applied in that order.

    Args:
      inputs: ``[batch, length]`` int32 prompts in the layout above; ``length`` is the decode
        length.
      cache: the model's cache pytree for ``batch`` examples (batch axis at ``cache_offset``).
      tokens_to_logits: ``state -> (logits [rows, vocab], new_cache)``, with ``rows = batch *
        num_decodes``.
      eos_id: the end-of-sequence token.
      decode_rng: PRNG key; defaults to ``jax.random.PRNGKey(0)``.
      num_decodes: samples per example.
      temperature: float, scalar or ``[batch]``; values <= 1e-4 mean greedy.
      topk: keep the ``topk`` largest logits (0: no limit); a Python int or an int array,
        scalar or ``[batch]``.
      topp: keep the smallest most-likely set with probability >= ``topp`` (0: no limit);
        scalar or ``[batch]``.
      cache_offset: position of the batch axis in cache leaves (1 for scanned layers).
      initial_index: ``[batch]`` int32, index of the last pre-filled position per example.
      max_decode_steps: optional cap on decoded tokens after the prompt: a row ends at
        ``min(length, nonzero(inputs[r]) + max_decode_steps)`` tokens. Scalar or ``[batch]``.
      max_decode_steps_hard_limit: an optional static cap applied to ``max_decode_steps``.
      rescale_log_probs: if true the returned log-probabilities are those of the tempered,
        filtered distribution that was sampled from (0 for greedy rows); if false, those of
        the raw logits.
      state_callback_fn: optional ``SamplingLoopState -> SamplingLoopState`` run at the start
        of every step and once on the final state.
      logit_callback_fn: optional ``(logits, SamplingLoopState) -> logits`` run before sampling.

    Returns:
      ``(sequences [batch, num_decodes, length] int32, log_probs [batch, num_decodes]
      float32)``, each example's decodes sorted by increasing log-probability (best last).

    Raises:
      ValueError: for ``num_decodes < 1``, ``topk`` negative or above the vocabulary size,
        ``topp`` outside [0, 1], a negative temperature, ``initial_index`` past the decode
        length (a prompt longer than the decode length), or badly shaped arguments.
    """
    num_decodes = _checks.check_num_decodes(num_decodes)
    inputs = _checks.check_inputs(inputs)
    batch, length = inputs.shape
    for name, value in (("temperature", temperature), ("topk", topk), ("topp", topp)):
        _checks.check_per_example(name, value, batch)
    if initial_index is not None:
        _checks.check_initial_index(initial_index, batch, length)
    if max_decode_steps is not None:
        _checks.check_per_example("max_decode_steps", max_decode_steps, batch)
        if max_decode_steps_hard_limit is not None and max_decode_steps_hard_limit > 0:
            max_decode_steps = jnp.minimum(max_decode_steps, max_decode_steps_hard_limit)
    if decode_rng is None:
        decode_rng = jax.random.PRNGKey(0)

    # Looked up on the package so that patching ``t5x.decoding.cache_map`` or
    # ``t5x.decoding._temperature_sample_single_trial`` (as upstream's tests do) takes effect.
    package = sys.modules["t5x.decoding"]
    if num_decodes > 1:
        inputs = flat_batch_beam_expand(inputs, num_decodes)
        # A pre-filled cache keeps one write index per example, which must be expanded too.
        cache = package.cache_map(
            keep_scalars(
                functools.partial(flat_batch_beam_expand, beam_size=num_decodes, offset=cache_offset)
            ),
            cache,
            apply_to_index=initial_index is not None,
        )
    if initial_index is not None:
        initial_index = jnp.repeat(jnp.asarray(initial_index, jnp.int32), num_decodes)
    if max_decode_steps is not None and np.ndim(max_decode_steps) == 1:
        max_decode_steps = jnp.repeat(jnp.asarray(max_decode_steps, jnp.int32), num_decodes)

    sequences, log_prob = package._temperature_sample_single_trial(
        inputs,
        cache,
        tokens_to_logits,
        eos_id,
        decode_rng,
        num_decodes,
        temperature,
        topk,
        topp,
        initial_index=initial_index,
        max_decode_steps=max_decode_steps,
        rescale_log_probs=rescale_log_probs,
        state_callback_fn=state_callback_fn,
        logit_callback_fn=logit_callback_fn,
    )
    sequences = unflatten_beam_dim(jnp.asarray(sequences), batch, num_decodes)
    log_prob = unflatten_beam_dim(jnp.asarray(log_prob), batch, num_decodes)
    order = jnp.argsort(log_prob, axis=-1, stable=True)
    return (
        jnp.take_along_axis(sequences, order[:, :, None], axis=1),
        jnp.take_along_axis(log_prob, order, axis=1),
    )


def _temperature_sample_single_trial(
    inputs: jax.Array,
    cache: PyTree,
    tokens_to_logits: Callable[[DecodingState], tuple[jax.Array, PyTree]],
    eos_id: int,
    prng_key: jax.Array,
    num_decodes: int = 1,
    temperature: Any = 1.0,
    topk: Any = 20,
    topp: Any = 0.0,
    initial_index: jax.Array | None = None,
    max_decode_steps: Any = None,
    rescale_log_probs: bool = True,
    state_callback_fn: Callable[[SamplingLoopState], SamplingLoopState] | None = None,
    logit_callback_fn: Callable[[jax.Array, SamplingLoopState], jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One decode per row of already-expanded ``inputs``, under upstream t5x's private name.

    This is the loop :func:`temperature_sample` runs after laying out ``num_decodes`` rows per
    example; upstream's own tests call it directly. ``inputs``, ``initial_index`` and
    ``max_decode_steps`` are per row; ``temperature``, ``topk`` and ``topp`` are scalars or
    one value per example (``rows / num_decodes`` of them). The defaults are upstream's.

    Returns:
      ``(sequences [rows, length] int32, log_probs [rows] float32)``, unsorted.
    """
    inputs = _checks.check_inputs(inputs)
    rows, length = inputs.shape
    if rows % num_decodes:
        raise ValueError(f"inputs has {rows} rows, not a multiple of num_decodes={num_decodes}")
    batch = rows // num_decodes
    for name, value in (("temperature", temperature), ("topk", topk), ("topp", topp)):
        _checks.check_per_example(name, value, batch)
    _validate_sampling_values(temperature, topk, topp)
    if initial_index is not None:
        _checks.check_initial_index(initial_index, rows, length)
        initial_index = jnp.asarray(initial_index, jnp.int32)
    if max_decode_steps is not None:
        _checks.check_per_example("max_decode_steps", max_decode_steps, rows)
        steps = _checks.concrete(max_decode_steps)
        if steps is not None and np.any(steps < 0):
            raise ValueError(f"max_decode_steps must be >= 0, got {steps.tolist()}")
        max_decode_steps = jnp.asarray(max_decode_steps, jnp.int32)
    return _sample_rows(
        inputs,
        cache,
        tokens_to_logits,
        eos_id,
        prng_key,
        temperature=_rows(temperature, num_decodes),
        topk=topk if isinstance(topk, int | np.integer) else _rows(topk, num_decodes),
        topp=_rows(topp, num_decodes),
        initial_index=initial_index,
        max_decode_steps=max_decode_steps,
        rescale_log_probs=rescale_log_probs,
        state_callback_fn=state_callback_fn,
        logit_callback_fn=logit_callback_fn,
    )


def _validate_sampling_values(temperature: Any, topk: Any, topp: Any) -> None:
    values = _checks.concrete(temperature)
    if values is not None and (np.any(values < 0) or np.any(np.isnan(values))):
        raise ValueError(f"temperature must be >= 0, got {values.tolist()}")
    values = _checks.concrete(topk)
    if values is not None and np.any(values < 0):
        raise ValueError(f"topk must be >= 0 (0 means no top-k filter), got topk={values.tolist()}")
    values = _checks.concrete(topp)
    if values is not None and (np.any(values < 0) or np.any(values > 1) or np.any(np.isnan(values))):
        raise ValueError(f"topp must be in [0, 1] (0 means no top-p filter), got topp={values.tolist()}")


def _sample_rows(
    inputs: jax.Array,
    cache: PyTree,
    tokens_to_logits: Callable[[DecodingState], tuple[jax.Array, PyTree]],
    eos_id: int,
    rng: jax.Array,
    *,
    temperature: Any,
    topk: Any,
    topp: Any,
    initial_index: jax.Array | None,
    max_decode_steps: jax.Array | None,
    rescale_log_probs: bool,
    state_callback_fn: Callable[[SamplingLoopState], SamplingLoopState] | None,
    logit_callback_fn: Callable[[jax.Array, SamplingLoopState], jax.Array] | None,
) -> tuple[jax.Array, jax.Array]:
    """The loop over flat rows; returns ``[rows, length]`` tokens and ``[rows]`` log-probs."""
    rows, length = inputs.shape
    sequences0 = jnp.pad(inputs, ((0, 0), (0, _EXTRA_SLOTS)))
    if max_decode_steps is None:
        end_index = jnp.full((rows,), length, jnp.int32)
    else:
        end_index = jnp.minimum(length, jnp.sum(inputs != 0, axis=1, dtype=jnp.int32) + max_decode_steps)
    if initial_index is None:
        index0 = jnp.zeros((rows,), jnp.int32)
        token0 = jnp.zeros((rows,), jnp.int32)
    else:
        index0 = initial_index
        token0 = _read_position(sequences0, index0)

    temps = _checks.concrete(temperature)
    all_greedy = temps is not None and bool(np.all(temps <= MIN_TEMPERATURE))
    none_greedy = temps is not None and bool(np.all(temps > MIN_TEMPERATURE))

    def greedy(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
        token = _select.argmax(logits)
        if rescale_log_probs:
            # The tempered distribution of a zero temperature puts all mass on the argmax.
            return token, jnp.zeros((rows,), jnp.float32)
        return token, _pick(jax.nn.log_softmax(logits), token)

    def sample(logits: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        scaled = logits / jnp.maximum(jnp.asarray(temperature, jnp.float32), MIN_TEMPERATURE)
        if not _is_off(topk):
            scaled = topk_mask(scaled, topk)
        if not _is_off(topp):
            scaled = topp_mask(scaled, topp)
        token = jax.random.categorical(key, scaled).astype(jnp.int32)
        lp = _pick(jax.nn.log_softmax(scaled if rescale_log_probs else logits), token)
        return token, lp

    def body(state: SamplingLoopState) -> SamplingLoopState:
        if state_callback_fn is not None:
            state = state_callback_fn(state)
        key, next_rng = jax.random.split(state.rng)
        logits, new_cache = tokens_to_logits(
            DecodingState(
                cur_index=state.cur_index,
                sequences=state.sequences[:, :-_EXTRA_SLOTS],
                cur_token=state.cur_token,
                cache=state.cache,
            )
        )
        _checks.check_logits(logits, rows, "temperature_sample")
        new_cache = _checks.same_structure(new_cache, state.cache)
        logits = logits.astype(jnp.float32)
        if logit_callback_fn is not None:
            logits = logit_callback_fn(logits, state)
        vocab = logits.shape[-1]
        # Greedy decoding never filters, so a top-k above the vocabulary only matters when sampling.
        if isinstance(topk, int | np.integer) and topk > vocab and not all_greedy:
            raise ValueError(f"topk={topk} is larger than the vocabulary size {vocab}")

        if all_greedy:
            token, lp = greedy(logits)
        elif none_greedy:
            token, lp = sample(logits, key)
        else:
            greedy_token, greedy_lp = greedy(logits)
            sampled_token, sampled_lp = sample(logits, key)
            is_greedy = jnp.broadcast_to(jnp.asarray(temperature) <= MIN_TEMPERATURE, (rows, 1))[:, 0]
            token = jnp.where(is_greedy, greedy_token, sampled_token)
            lp = jnp.where(is_greedy, greedy_lp, sampled_lp)

        # Rows that reached their end keep writing into the spare slot past it until the
        # slowest row is done.
        index = jnp.minimum(state.cur_index, end_index)
        forced = _read_position(state.sequences, index + 1)
        free = forced == 0
        token = jnp.where(free, token, forced)
        log_prob = state.log_prob + jnp.where(free & ~state.ended, lp, 0.0)
        token = jnp.where(state.ended, 0, token)
        sequences = _write_position(state.sequences, index + 1, token)
        # EOS ends a row where the prompt had no token: decoded, or written there by a
        # state_callback_fn (a prompt's own EOS does not count).
        outside_prompt = _read_position(sequences0, index + 1) == 0
        ended = state.ended | (outside_prompt & (token == eos_id)) | (index >= end_index - 1)
        return SamplingLoopState(
            step=state.step + 1,
            cur_index=index + 1,
            sequences=sequences,
            cache=new_cache,
            cur_token=token[:, None],
            ended=ended,
            rng=next_rng,
            log_prob=log_prob,
        )

    init = SamplingLoopState(
        step=jnp.zeros((), jnp.int32),
        cur_index=index0,
        sequences=sequences0,
        cache=cache,
        cur_token=token0[:, None],
        ended=jnp.zeros((rows,), jnp.bool_),
        rng=rng,
        log_prob=jnp.zeros((rows,), jnp.float32),
    )
    final = jax.lax.while_loop(lambda s: ~jnp.all(s.ended), body, init)
    if state_callback_fn is not None:
        final = state_callback_fn(final)
    return final.sequences[:, 1 : length + 1], final.log_prob
