"""The t5x-launch CLI: gin configs, job assembly, the built-in demo, local and TPU-pod launch.

This is the only package that knows every concrete class. Gin files configure
the library packages directly through gin's dynamic registration
(``from __gin__ import dynamic_registration`` then ``from t5x import models``),
so the libraries stay free of gin; the jobs here take the built objects.
"""

from t5x.launch._configs import (
    CheckpointConfig,
    DatasetConfig,
    RestoreCheckpointConfig,
    SaveCheckpointConfig,
)
from t5x.launch._errors import ConfigurationError, UserError
from t5x.launch._eval_job import evaluate
from t5x.launch._gin_config import GinArgs, GinConfigError, GinExtension, parse_gin, split_gin_flags
from t5x.launch._infer_job import infer
from t5x.launch._interactive import InteractiveModel
from t5x.launch._jobs import JobResult, load_initial_params, train
from t5x.launch._lm_eval_registration import LM_EVAL_MODEL_NAME, register_lm_eval_model
from t5x.launch._local import run_local
from t5x.launch._malloc import add_malloc_defaults, restart_with_malloc_defaults, user_environment
from t5x.launch._model_dir_lock import ModelDirInUseError
from t5x.launch._platform import apply_cpu_kernels_override, cpu_kernels_override, job_runs_on_cpu
from t5x.launch._precompile import PrecompileResult, precompile
from t5x.launch._preemption import Preempted
from t5x.launch._study import StudyResult, StudyRun, grid_config, run_study
from t5x.launch._tpu import run_tpu, tpu_commands
from t5x.launch._xla_flags import add_backend_defaults, add_xla_defaults
from t5x.launch._zero_shot import ZeroShotReport, evaluate_zero_shot, load_checkpoint_params, model_from_gin

__all__ = [
    "add_backend_defaults",
    "apply_cpu_kernels_override",
    "cpu_kernels_override",
    "job_runs_on_cpu",
    "add_malloc_defaults",
    "add_xla_defaults",
    "restart_with_malloc_defaults",
    "user_environment",
    "LM_EVAL_MODEL_NAME",
    "ZeroShotReport",
    "evaluate_zero_shot",
    "load_checkpoint_params",
    "model_from_gin",
    "register_lm_eval_model",
    "CheckpointConfig",
    "RestoreCheckpointConfig",
    "SaveCheckpointConfig",
    "ConfigurationError",
    "DatasetConfig",
    "GinArgs",
    "GinConfigError",
    "GinExtension",
    "InteractiveModel",
    "JobResult",
    "ModelDirInUseError",
    "Preempted",
    "PrecompileResult",
    "precompile",
    "evaluate",
    "infer",
    "parse_gin",
    "run_local",
    "StudyResult",
    "StudyRun",
    "grid_config",
    "load_initial_params",
    "run_study",
    "run_tpu",
    "split_gin_flags",
    "tpu_commands",
    "train",
    "UserError",
]

# lm-evaluation-harness finds this package's model as "t5x" (only when lm-eval is installed).
register_lm_eval_model()


def __getattr__(name: str) -> object:
    # T5xLM subclasses lm-eval's LM, whose import takes seconds: load it on first use.
    if name == "T5xLM":
        from t5x.launch._lm_eval import T5xLM

        return T5xLM
    raise AttributeError(f"module 't5x.launch' has no attribute {name!r}")
