"""T5-family encoder-decoders and causal / prefix-LM decoders in Flax, with t5x parameter names."""
