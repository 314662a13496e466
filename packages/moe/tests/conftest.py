"""Gives every test of t5x-moe 8 virtual CPU devices, and the shared tiny config.

XLA reads the device-count flag once, when JAX's CPU backend starts, so it is
set here, before any test module imports jax.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def devices():
    """The 8 virtual CPU devices."""
    found = jax.devices()
    if len(found) < 8:
        pytest.skip(
            f"needs 8 CPU devices but JAX started with {len(found)}: something imported jax before this "
            "package's conftest; run this package's tests in their own pytest process"
        )
    return found[:8]


@pytest.fixture(scope="session")
def tiny_config():
    """A two-layer encoder-decoder with one MoE layer per stack (4 experts)."""
    from t5x.moe import MoeT5Config

    return MoeT5Config(
        vocab_size=32,
        emb_dim=16,
        num_heads=2,
        head_dim=8,
        mlp_dim=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
        num_experts=4,
        min_expert_capacity=1,
    )


def _random_batch(seed: int, batch: int = 8, enc: int = 8, dec: int = 6, vocab: int = 32) -> dict:
    """Integer features of an encoder-decoder batch, no padding."""
    import numpy as np

    rng = np.random.RandomState(seed)
    targets = rng.randint(1, vocab, (batch, dec)).astype(np.int32)
    inputs = np.concatenate([np.zeros((batch, 1), np.int32), targets[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": rng.randint(1, vocab, (batch, enc)).astype(np.int32),
        "decoder_input_tokens": inputs,
        "decoder_target_tokens": targets,
    }


@pytest.fixture(scope="session")
def random_batch():
    """``random_batch(seed, batch=8, enc=8, dec=6)``: an encoder-decoder batch without padding."""
    return _random_batch
