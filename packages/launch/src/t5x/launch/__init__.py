"""The t5x-launch CLI: gin configs, job assembly, the built-in demo, local and TPU-pod launch.

This is the only package that knows every concrete class. Gin files configure
the library packages directly through gin's dynamic registration
(``from __gin__ import dynamic_registration`` then ``from t5x import models``),
so the libraries stay free of gin; the jobs here take the built objects.
"""

from t5x.launch._configs import CheckpointConfig, DatasetConfig
from t5x.launch._gin_config import GinArgs, GinConfigError, parse_gin, split_gin_flags
from t5x.launch._jobs import JobResult, evaluate, infer, train
from t5x.launch._local import run_local
from t5x.launch._tpu import run_tpu, tpu_commands

__all__ = [
    "CheckpointConfig",
    "DatasetConfig",
    "GinArgs",
    "GinConfigError",
    "JobResult",
    "evaluate",
    "infer",
    "parse_gin",
    "run_local",
    "run_tpu",
    "split_gin_flags",
    "tpu_commands",
    "train",
]
