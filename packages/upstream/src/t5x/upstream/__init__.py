"""Upstream t5x gin files under t5x-launch: upstream's module names, keywords and run scripts.

Installing t5x-upstream makes ``t5x-launch train --gin_file=t5x/examples/t5/t5_1_1/small.gin
--gin_file=t5x/configs/runs/pretrain.gin ...`` work: the gin files of those
paths ship here (written for this implementation; the hyperparameters are
upstream's), the modules they import (``t5x.utils``, ``t5x.adafactor``,
``t5x.trainer``, ``t5x.checkpoints``, ``t5x.gin_utils``, ``t5x.examples.*.network``)
map upstream's names onto the t5x packages, ``import seqio`` resolves to
``t5x.seqio``, and ``__main__.train`` / ``evaluate`` / ``infer`` take upstream's
keywords and run t5x-launch's jobs.
"""

from t5x.upstream._command_line import UpstreamFlagError
from t5x.upstream._command_line import run as run_command_line
from t5x.upstream._extension import EXTENSION, GIN_DIR, prepare
from t5x.upstream._scripts import UnsupportedUpstreamOption, evaluate, infer, precompile, train
from t5x.upstream._unsupported import UNSUPPORTED, explain_unsupported

__all__ = [
    "EXTENSION",
    "GIN_DIR",
    "UNSUPPORTED",
    "UnsupportedUpstreamOption",
    "UpstreamFlagError",
    "evaluate",
    "explain_unsupported",
    "infer",
    "precompile",
    "prepare",
    "run_command_line",
    "train",
]
