"""Upstream's ``t5x.examples.decoder_only``: causal and prefix-LM decoders."""
