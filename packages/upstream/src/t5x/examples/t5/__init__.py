"""Upstream's ``t5x.examples.t5``: the T5 (1.0 and 1.1) encoder-decoder."""
