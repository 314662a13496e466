"""Data sources, Tasks, Mixtures, T5 preprocessors and deterministic resumable pipelines on tf.data, without JAX."""
