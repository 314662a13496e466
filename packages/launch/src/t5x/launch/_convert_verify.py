"""``convert --verify``: run both sides of a conversion on one random batch and compare logits."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

_BATCH, _INPUTS, _TARGETS = 2, 12, 8


def random_batch(vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A small encoder-decoder batch: ``encoder_input_tokens [2, 12]``, ``decoder_* [2, 8]``.

    Ids avoid 0 (padding) and 1 (EOS) so every position counts; the second
    example is padded to show that both sides mask alike.
    """
    rng = np.random.default_rng(seed)
    high = max(vocab_size, 3)
    encoder = rng.integers(2, high, size=(_BATCH, _INPUTS)).astype(np.int32)
    encoder[1, _INPUTS - 3 :] = 0
    targets = rng.integers(2, high, size=(_BATCH, _TARGETS)).astype(np.int32)
    decoder_inputs = np.concatenate([np.zeros((_BATCH, 1), np.int32), targets[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": encoder,
        "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": targets,
        "decoder_loss_weights": np.ones_like(targets, np.float32),
    }


def t5x_logits(params: Any, config: Any, batch: dict[str, np.ndarray]) -> np.ndarray:
    """Logits ``[batch, targets, vocab]`` of our network in float32."""
    import jax

    from t5x.models import EncoderDecoderModel

    config = dataclasses.replace(config, dtype="float32", dropout_rate=0.0)
    params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
    return np.asarray(EncoderDecoderModel(config).compute_logits(params, batch), np.float32)


def has_transformers() -> bool:
    """Whether PyTorch and ``transformers`` are installed (without importing them)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def run_transformers(*args: str) -> None:
    """Runs :mod:`t5x.launch._hf_worker` with ``args`` in a child process.

    Raises:
      ImportError: PyTorch or ``transformers`` is not installed (says what to install).
      RuntimeError: the child failed (its error output is included).
    """
    if not has_transformers():
        raise ImportError(
            "--verify with a Hugging Face side runs the model in transformers on PyTorch: "
            "pip install --find-links dist 't5x-launch[hf]' "
            "(run in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md), "
            "or: pip install torch transformers"
        )
    proc = subprocess.run(
        [sys.executable, "-m", "t5x.launch._hf_worker", *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"transformers ({args[0]}) failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}"
        )


def transformers_logits(folder: str, batch: dict[str, np.ndarray]) -> np.ndarray:
    """Logits ``[batch, targets, vocab]`` of the ``transformers`` model in ``folder`` (PyTorch, float32).

    Raises:
      ImportError: PyTorch or ``transformers`` is not installed (says what to install).
      RuntimeError: loading or running the model failed.
    """
    with tempfile.TemporaryDirectory() as tmp:
        batch_path, out_path = os.path.join(tmp, "batch.npz"), os.path.join(tmp, "logits.npy")
        np.savez(batch_path, **batch)  # type: ignore[arg-type]
        run_transformers("logits", folder, batch_path, out_path)
        return np.load(out_path)


def max_logit_difference(ours: np.ndarray, theirs: np.ndarray) -> float:
    """The largest absolute difference between two logit arrays of one shape.

    Raises:
      ValueError: the shapes differ.
    """
    if ours.shape != theirs.shape:
        raise ValueError(f"logit shapes differ: {ours.shape} vs {theirs.shape}")
    return float(np.max(np.abs(ours.astype(np.float64) - theirs.astype(np.float64))))
