"""Greedy, sampling and beam-search decoding in one compiled loop over a KV cache.

A model supplies ``tokens_to_logits(state: DecodingState) -> (logits [rows, vocab],
new_cache)``; :func:`temperature_sample` and :func:`beam_search` run the whole decode inside
one ``lax.while_loop``, so wrapping a call in ``jax.jit`` compiles it once.
"""

from t5x.decoding._beam_search import BeamState, beam_search
from t5x.decoding._beams import (
    add_beam_dim,
    brevity_penalty,
    cache_gather_beams,
    cache_map,
    flat_batch_beam_expand,
    flatten_beam_dim,
    gather_beams,
    gather_topk_beams,
    unflatten_beam_dim,
)
from t5x.decoding._masks import topk_mask, topp_mask
from t5x.decoding._sampling import SamplingLoopState, temperature_sample

# Upstream t5x's per-row sampling loop: private there too, but its own tests call it.
from t5x.decoding._sampling import _temperature_sample_single_trial as _temperature_sample_single_trial
from t5x.decoding._select import top_k_two_stage
from t5x.decoding._state import MIN_TEMPERATURE, NEG_INF, DecodingState

__all__ = [
    "BeamState",
    "DecodingState",
    "MIN_TEMPERATURE",
    "NEG_INF",
    "SamplingLoopState",
    "add_beam_dim",
    "beam_search",
    "brevity_penalty",
    "cache_gather_beams",
    "cache_map",
    "flat_batch_beam_expand",
    "flatten_beam_dim",
    "gather_beams",
    "gather_topk_beams",
    "temperature_sample",
    "top_k_two_stage",
    "topk_mask",
    "topp_mask",
    "unflatten_beam_dim",
]
