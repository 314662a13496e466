"""SentencePiece, byte, pass-through and Hugging Face vocabularies with seqio-compatible ids."""
