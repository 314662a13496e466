"""Greedy, sampling and beam-search decoding in one compiled loop over a KV cache."""
