"""How Adafactor factors the second moments of MoE parameters, by logical axis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The axes MoE parameters add to the dense ones, with Adafactor's role for each (upstream's
# MoE rules): every expert's matrix is factored on its own, the router's expert columns not.
_EXPERT_AXES = {"expert": "batch", "expert_mlp": "column", "unmodeled": "none"}


def logical_factor_rules(dense_rules: Mapping[str, Any]) -> dict[str, Any]:
    """``dense_rules`` (e.g. ``t5x.training.standard_logical_factor_rules()``) plus the MoE axes.

    Pass the result as Adafactor's ``logical_factor_rules``: expert kernels
    ``[expert, embed, mlp]`` have rank 3, which Adafactor's shape heuristic does not factor.
    """
    return {**dense_rules, **_EXPERT_AXES}
