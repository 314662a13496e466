"""Upstream t5x's example networks (``t5x.examples.*.network``) on t5x.models' Flax networks."""
