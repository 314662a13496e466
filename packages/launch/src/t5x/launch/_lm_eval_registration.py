"""Registers the ``t5x`` model with lm-evaluation-harness when it is installed, without importing it.

lm-eval's registry takes a ``"module:attribute"`` placeholder and imports the
class on first use, so ``import t5x.launch`` costs only lm-eval's registry
modules (a few tens of milliseconds), not ``lm_eval.api.model`` (seconds).
"""

from __future__ import annotations

import importlib.util

LM_EVAL_MODEL_NAME = "t5x"
_TARGET = "t5x.launch._lm_eval:T5xLM"


def register_lm_eval_model() -> bool:
    """Makes ``lm_eval.api.registry.get_model("t5x")`` return :class:`T5xLM`.

    Returns:
      True when lm-eval is installed (the name is registered), else False.
    """
    try:
        if importlib.util.find_spec("lm_eval") is None:
            return False
    except ValueError:  # sys.modules["lm_eval"] is None: lm-eval deliberately hidden
        return False
    # lm-eval fills its own model names only into an empty registry, so they go in first.
    import lm_eval.models  # noqa: F401
    from lm_eval.api.registry import model_registry

    if LM_EVAL_MODEL_NAME not in model_registry:
        model_registry.register(LM_EVAL_MODEL_NAME, target=_TARGET)
    return True
