"""Upstream's ``t5x.examples.scalable_t5``: the encoder-decoder with scanned, rematerialised layers."""
