"""Task features to model features (encoder-decoder, decoder-only, prefix LM, encoder-only) with packing, on tf.data."""
