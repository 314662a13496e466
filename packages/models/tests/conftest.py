"""Test set-up: cheap XLA compilation for the tiny models of these tests."""

import os

# Set before JAX starts its backend: the tests' models are tiny, so XLA's optimising
# passes cost far more compile time than they save at run time.
_FAST = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST}".strip()
