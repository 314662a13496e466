"""Beam search with the GNMT length penalty, in one while loop."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from t5x.decoding import _checks
from t5x.decoding._beams import (
    brevity_penalty,
    cache_map,
    flat_batch_beam_expand,
    flatten_beam_dim,
    gather_beams,
    keep_scalars,
    select_beams,
    unflatten_beam_dim,
)
from t5x.decoding._reorder import (
    first_divergence,
    index_bounds,
    index_matches,
    reorder_cache,
    tag_writes,
)
from t5x.decoding._select import top_k
from t5x.decoding._state import NEG_INF, DecodingState, PyTree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BeamState:
    """The carry of the beam-search loop.

    Attributes:
      cur_index: ``[batch]`` int32, position of the token fed at the next step.
      live_logprobs: ``[batch, beams]`` float32 log-probabilities of the live beams.
      finished_scores: ``[batch, beams]`` float32 length-normalised scores of finished beams.
      live_seqs: ``[batch, beams, max_decode_len + 1]`` int32, position 0 is BOS.
      finished_seqs: ``[batch, beams, max_decode_len + 1]`` int32.
      finished_flags: ``[batch, beams]`` bool, which finished slots hold a real sequence.
      cache: the model's cache, rows flattened as ``batch * beams``.
    """

    cur_index: jax.Array
    live_logprobs: jax.Array
    finished_scores: jax.Array
    live_seqs: jax.Array
    finished_seqs: jax.Array
    finished_flags: jax.Array
    cache: PyTree


# Reorder only the written span of attention caches (see `t5x.decoding._reorder`); False
# gathers every cache leaf whole, the reference the tests compare against.
_REORDER_WRITTEN_SPAN = True


def _read_position(seqs: jax.Array, index: jax.Array) -> jax.Array:
    """``seqs[b, ..., index[b]]`` for ``[batch, ..., length]`` seqs, as a masked sum."""
    positions = jnp.arange(seqs.shape[-1], dtype=index.dtype)
    mask = positions == index.reshape(index.shape + (1,) * (seqs.ndim - index.ndim))
    return jnp.sum(jnp.where(mask, seqs, 0), axis=-1)


def _write_position(seqs: jax.Array, index: jax.Array, token: jax.Array) -> jax.Array:
    positions = jnp.arange(seqs.shape[-1], dtype=index.dtype)
    mask = positions == index.reshape(index.shape + (1,) * (seqs.ndim - index.ndim))
    return jnp.where(mask, token[..., None], seqs)


def _prompt_table(inputs: jax.Array, width: int) -> jax.Array:
    """Forced tokens by sequence position: ``[batch, width]``, 0 where nothing is forced."""
    have = inputs.shape[1]
    if have >= width:
        return inputs[:, :width]
    return jnp.pad(inputs, ((0, 0), (0, width - have)))


def beam_search(
    inputs: jax.Array,
    cache: PyTree,
    tokens_to_logits: Callable[[DecodingState], tuple[jax.Array, PyTree]],
    eos_id: int,
    num_decodes: int = 4,
    alpha: float = 0.6,
    max_decode_len: int | None = None,
    decode_rng: jax.Array | None = None,
    cache_offset: int = 0,
    initial_index: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Beam search for the ``num_decodes`` best EOS-terminated sequences.

    A sequence of ``n`` tokens (EOS included) with log-probability ``lp`` scores
    ``lp / ((5 + n) / 6) ** alpha``. Each step extends every live beam by every token, keeps
    the ``2 * beams`` best extensions (so enough stay live even if many end), moves those
    ending in EOS into the finished set (best ``beams`` by score) and keeps the ``beams``
    best others live. It stops at ``max_decode_len`` or once no live beam can still beat the
    worst finished one. Sequences that reach ``max_decode_len`` without EOS are not
    finished; an example with no finished sequence at all returns its live beams with their
    raw log-probabilities instead. Unused finished slots score about ``-1e7``.

    ``inputs`` follows the layout of :func:`temperature_sample`: position 0 is BOS and
    ignored, non-zero ``inputs[:, p]`` forces token ``p - 1`` of the output (a forced prefix
    costs no log-probability and cannot end a sequence). ``initial_index`` starts each example
    from a cache pre-filled up to that index, feeding ``inputs[b, initial_index[b]]``.

    Args:
      inputs: ``[batch, length]`` int32 prompts (or zeros).
      cache: the model's cache pytree for ``batch`` examples (batch axis at ``cache_offset``).
      tokens_to_logits: ``state -> (logits [batch * beams, vocab], new_cache)``;
        ``state.cur_index`` is ``[batch * beams]``.
      eos_id: the end-of-sequence token.
      num_decodes: the beam size, also the number of sequences returned per example.
      alpha: the length-penalty exponent (0: plain log-probability).
      max_decode_len: the output length; defaults to ``length``.
      decode_rng: unused (beam search is deterministic); accepted for a uniform signature.
      cache_offset: position of the batch axis in cache leaves (1 for scanned layers).
      initial_index: optional ``[batch]`` int32 index of the last pre-filled position.

    Returns:
      ``(sequences [batch, beams, max_decode_len] int32, scores [batch, beams] float32)``,
      sorted by increasing score (best last); tokens after EOS are 0.

    Raises:
      ValueError: for ``num_decodes < 1``, a vocabulary of fewer than 2 tokens, a prompt
        longer than ``max_decode_len``, ``initial_index`` past it, or bad shapes.
    """
    del decode_rng
    beams = _checks.check_num_decodes(num_decodes)
    inputs = _checks.check_inputs(inputs)
    batch, in_length = inputs.shape
    length = in_length if max_decode_len is None else int(max_decode_len)
    if length < 1:
        raise ValueError(f"max_decode_len must be >= 1, got max_decode_len={length}")
    width = length + 1
    prompt = _checks.concrete(inputs)
    if prompt is not None and in_length > width and np.any(prompt[:, width:]):
        last = int(np.max(np.nonzero(np.any(prompt != 0, axis=0))[0]))
        raise ValueError(
            f"the prompt in inputs reaches position {last}, longer than the decode length:"
            f" max_decode_len={length} allows prompts up to position {length}"
        )
    if initial_index is not None:
        _checks.check_initial_index(initial_index, batch, length)

    forced = _prompt_table(jnp.asarray(inputs, jnp.int32), width)
    positions = jnp.arange(width, dtype=jnp.int32)
    if initial_index is None:
        index0 = jnp.zeros((batch,), jnp.int32)
        live_seqs0 = jnp.zeros((batch, beams, width), jnp.int32)
    else:
        index0 = jnp.asarray(initial_index, jnp.int32)
        known = jnp.where(positions[None, :] <= index0[:, None], forced, 0)
        live_seqs0 = jnp.broadcast_to(known[:, None, :], (batch, beams, width))
    init = BeamState(
        cur_index=index0,
        live_logprobs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (beams - 1), jnp.float32), (batch, 1)),
        finished_scores=jnp.full((batch, beams), NEG_INF, jnp.float32),
        live_seqs=live_seqs0,
        finished_seqs=jnp.zeros((batch, beams, width), jnp.int32),
        finished_flags=jnp.zeros((batch, beams), jnp.bool_),
        cache=cache_map(
            keep_scalars(functools.partial(flat_batch_beam_expand, beam_size=beams, offset=cache_offset)),
            cache,
            apply_to_index=initial_index is not None,
        ),
    )

    start_bounds = index_bounds(init.cache) if _REORDER_WRITTEN_SPAN else None

    def written_span(
        index: jax.Array, old_cache: PyTree, new_cache: PyTree, writers: jax.Array
    ) -> tuple[jax.Array, jax.Array] | None:
        """Cache positions where the beams of an active example may differ after this step.

        At most ``[lo, hi)``: what any step may have written, by ``cache_index`` or
        ``cur_index``. Where every ``cache_index`` agrees with ``cur_index`` the step wrote
        where ``writers`` says, and ``lo`` moves up to the first position where the beams of
        an active example descend from different writers (beams soon share an ancestor).
        Examples that are done are left out: what their rows hold is never read again.
        """
        end_bounds = index_bounds(new_cache)
        if start_bounds is None or end_bounds is None:
            return None
        lo = jnp.minimum(start_bounds[0], jnp.min(index0))
        active = index < length
        tracked = index_matches(old_cache, jnp.repeat(index, beams), jnp.repeat(active, beams))
        shared = first_divergence(writers, batch, beams, active)
        lo = jnp.where(tracked, jnp.maximum(lo, shared), lo)
        return lo, jnp.maximum(end_bounds[1], jnp.max(index) + 1)

    def can_continue(state: BeamState) -> jax.Array:
        """Per example: not at the end, and some live beam could still enter the finished set."""
        # Log-probabilities only fall as tokens are added, so dividing today's best by the
        # largest penalty any finishing length can get bounds every future score.
        largest_penalty = jnp.maximum(
            brevity_penalty(alpha, length), brevity_penalty(alpha, state.cur_index + 1)
        )
        best_live = jnp.max(state.live_logprobs, axis=1) / largest_penalty
        worst_finished = jnp.where(
            jnp.all(state.finished_flags, axis=1), jnp.min(state.finished_scores, axis=1), NEG_INF
        )
        return (state.cur_index < length) & (worst_finished <= best_live)

    def body(carry: tuple[BeamState, jax.Array]) -> tuple[BeamState, jax.Array]:
        state, writers = carry
        index = state.cur_index
        flat_index = jnp.repeat(index, beams)
        flat_seqs = flatten_beam_dim(state.live_seqs)
        logits, new_cache = tokens_to_logits(
            DecodingState(
                cur_index=flat_index,
                sequences=flat_seqs,
                cur_token=_read_position(flat_seqs, flat_index)[:, None],
                cache=state.cache,
            )
        )
        _checks.check_logits(logits, batch * beams, "beam_search")
        new_cache = _checks.same_structure(new_cache, state.cache)
        vocab = logits.shape[-1]
        if vocab < 2:
            raise ValueError(f"beam_search needs a vocabulary of at least 2 tokens, got {vocab}")
        # Clamping -inf (tokens a model rules out) keeps later arithmetic and the one-hot
        # gathers free of NaN; such tokens then look like filler beams and never finish.
        log_probs = jnp.maximum(jax.nn.log_softmax(logits.astype(jnp.float32)), NEG_INF)
        log_probs = log_probs.reshape(batch, beams, vocab)
        log_probs = log_probs + state.live_logprobs[:, :, None]
        top_lp, top_flat = top_k(log_probs.reshape(batch, beams * vocab), 2 * beams)
        top_beam = top_flat // vocab
        top_token = top_flat % vocab

        # Inside a forced prefix only one continuation exists: the best live beam followed by
        # the forced token, at no cost.
        forced_token = _read_position(forced, index + 1)
        free = (forced_token == 0)[:, None]
        best_beam = jnp.argmax(state.live_logprobs, axis=1)
        prompt_lp = jnp.concatenate(
            [
                jnp.max(state.live_logprobs, axis=1, keepdims=True),
                jnp.full((batch, 2 * beams - 1), NEG_INF, jnp.float32),
            ],
            axis=1,
        )
        prompt_beam = jnp.concatenate(
            [best_beam[:, None], jnp.zeros((batch, 2 * beams - 1), top_beam.dtype)], axis=1
        )
        top_lp = jnp.where(free, top_lp, prompt_lp)
        top_beam = jnp.where(free, top_beam, prompt_beam)
        top_token = jnp.where(free, top_token, forced_token[:, None])

        top_seqs = gather_beams(state.live_seqs, top_beam, batch, beams, 2 * beams)
        top_seqs = _write_position(top_seqs, jnp.broadcast_to(index[:, None] + 1, top_token.shape), top_token)
        # Extensions of filler beams (score ~ -1e7) are not real sequences.
        ends = free & (top_token == eos_id) & (top_lp > NEG_INF / 2)

        # Live set: the best extensions that did not end.
        live_rank_lp = jnp.where(ends, top_lp + NEG_INF, top_lp)
        _, keep = top_k(live_rank_lp, beams)
        keep = keep[:, ::-1]
        live_seqs, live_lp, parent = gather_beams(
            [top_seqs, live_rank_lp, top_beam], keep, batch, 2 * beams, beams
        )

        def pick_parents(x: jax.Array) -> jax.Array:
            x = unflatten_beam_dim(x, batch, beams, cache_offset)
            return flatten_beam_dim(select_beams(x, parent, cache_offset), cache_offset)

        writers = tag_writes(writers, flat_index)
        span = written_span(index, state.cache, new_cache, writers)
        live_cache = reorder_cache(new_cache, pick_parents, span, cache_offset)
        writers = flatten_beam_dim(select_beams(unflatten_beam_dim(writers, batch, beams), parent))

        # Finished set: merge the old finished beams with the new ones, keep the best.
        penalty = brevity_penalty(alpha, index + 1)[:, None]
        new_scores = jnp.where(ends, top_lp / penalty, top_lp / penalty + NEG_INF)
        all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)
        _, best = top_k(all_scores, beams)
        best = best[:, ::-1]
        finished_seqs, finished_scores, finished_flags = gather_beams(
            [
                jnp.concatenate([state.finished_seqs, top_seqs], axis=1),
                all_scores,
                jnp.concatenate([state.finished_flags, ends], axis=1),
            ],
            best,
            batch,
            3 * beams,
            beams,
        )
        new_state = BeamState(
            cur_index=index + 1,
            live_logprobs=live_lp,
            finished_scores=finished_scores,
            live_seqs=live_seqs,
            finished_seqs=finished_seqs,
            finished_flags=finished_flags,
            cache=live_cache,
        )
        if initial_index is None:
            return new_state, writers
        # Examples started from a later pre-fill index reach the end first; they sit still
        # while the others finish.
        return _keep_where_done(state, new_state, index < length), writers

    # Who wrote each position of each row's cache (see `tag_writes`), to find how far back
    # the beams share their content; positions past `width` are never written.
    writers0 = jnp.zeros((batch * beams, width), jnp.int32)
    final, _ = jax.lax.while_loop(lambda carry: jnp.any(can_continue(carry[0])), body, (init, writers0))
    has_finished = jnp.any(final.finished_flags, axis=1)
    sequences = jnp.where(has_finished[:, None, None], final.finished_seqs, final.live_seqs)
    scores = jnp.where(has_finished[:, None], final.finished_scores, final.live_logprobs)
    return sequences[:, :, 1:], scores


def _keep_where_done(old: BeamState, new: BeamState, active: jax.Array) -> BeamState:
    """Takes ``new`` for active examples and ``old`` for the others (the cache: always ``new``)."""

    def choose(new_x: jax.Array, old_x: jax.Array) -> jax.Array:
        return jnp.where(active.reshape(active.shape + (1,) * (new_x.ndim - 1)), new_x, old_x)

    fields = {
        field: choose(getattr(new, field), getattr(old, field))
        for field in (
            "cur_index",
            "live_logprobs",
            "finished_scores",
            "live_seqs",
            "finished_seqs",
            "finished_flags",
        )
    }
    # The cache is taken as the step left it, also for examples that are done: they stay done,
    # so what their rows hold only feeds logits that are thrown away. Keeping the old cache
    # would keep it alive past the step's in-place write, a copy of every leaf at every step.
    return BeamState(cache=new.cache, **fields)
