"""TrainState, T5X Adafactor, schedules, the Trainer and resumable train / eval / infer loops.

Works with any Model, Partitioner, Checkpointer, InputIterator and MetricWriter
that meet the ``t5x.interfaces`` contracts.
"""

from t5x.training._actions import (
    ActionMode,
    EarlyStoppingAction,
    TerminateOnNanAction,
    TrainAction,
)
from t5x.training._adafactor import (
    HEURISTIC_RULE,
    Adafactor,
    AdafactorParamState,
    AdafactorState,
    FactorDim,
    HParamMap,
    adafactor,
    factor_name_to_factordim,
    standard_logical_factor_rules,
)
from t5x.training._infer import infer
from t5x.training._init import (
    InitializedState,
    batch_shardings,
    init_train_state,
    sharding_for,
    train_state_shardings,
)
from t5x.training._loops import (
    EarlyStopping,
    NonFiniteLossError,
    TrainResult,
    evaluate,
    restore_latest,
    train,
)
from t5x.training._optimizers import (
    MultiOptimizer,
    adamw,
    bind_param_axes,
    lion,
    multi_transform,
    scale_by_learning_rate,
    sgd,
)
from t5x.training._schedules import as_schedule, create_learning_rate_scheduler
from t5x.training._train_state import TrainState
from t5x.training._trainer import SUMMED_METRICS, Trainer, count_tokens, measure_peak_flops
from t5x.training._writers import ConsoleWriter, JsonlWriter, MultiWriter, TensorBoardWriter

__all__ = [
    "ActionMode",
    "EarlyStoppingAction",
    "TerminateOnNanAction",
    "TrainAction",
    "HEURISTIC_RULE",
    "SUMMED_METRICS",
    "Adafactor",
    "EarlyStopping",
    "NonFiniteLossError",
    "TrainResult",
    "AdafactorParamState",
    "AdafactorState",
    "ConsoleWriter",
    "FactorDim",
    "HParamMap",
    "InitializedState",
    "JsonlWriter",
    "MultiWriter",
    "MultiOptimizer",
    "TensorBoardWriter",
    "TrainState",
    "Trainer",
    "adafactor",
    "adamw",
    "as_schedule",
    "batch_shardings",
    "bind_param_axes",
    "count_tokens",
    "create_learning_rate_scheduler",
    "evaluate",
    "factor_name_to_factordim",
    "infer",
    "init_train_state",
    "lion",
    "measure_peak_flops",
    "multi_transform",
    "restore_latest",
    "scale_by_learning_rate",
    "sgd",
    "sharding_for",
    "standard_logical_factor_rules",
    "train",
    "train_state_shardings",
]
