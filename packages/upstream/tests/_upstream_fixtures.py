"""A seqio-style task module and an upstream-style gin file, written into a folder for a test."""

from __future__ import annotations

import pathlib
from typing import Any

TASK_MODULE = "tiny_upstream_tasks"
TASK = "tiny_upstream_copy"

# Written by the test as a user's seqio task module: nothing in it knows t5x.
_TASK_SOURCE = '''\
"""A seqio task: copy a short sentence (inputs -> targets)."""
import functools

import seqio
import tensorflow as tf

VOCABULARY = seqio.SentencePieceVocabulary({spm!r})
WORDS = "the quick brown fox jumps over a lazy dog while seven small birds sing".split()


def _sentences(split, shuffle_files, seed=None):
    del shuffle_files, seed
    count = {{"train": 64, "validation": 8, "test": 8}}[split]
    lines = [" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(4)) for i in range(count)]
    return tf.data.Dataset.from_tensor_slices({{"line": lines}})


def exact_match(targets, predictions):
    return {{"exact_match": 100.0 * sum(t == p for t, p in zip(targets, predictions)) / max(len(targets), 1)}}


seqio.TaskRegistry.add(
    {task!r},
    source=seqio.FunctionDataSource(_sentences, splits=("train", "validation", "test")),
    preprocessors=[
        functools.partial(seqio.preprocessors.rekey, key_map={{"inputs": "line", "targets": "line"}}),
        seqio.preprocessors.tokenize,
        seqio.preprocessors.append_eos_after_trim,
    ],
    output_features={{
        "inputs": seqio.Feature(VOCABULARY, add_eos=True),
        "targets": seqio.Feature(VOCABULARY, add_eos=True),
    }},
    metric_fns=[exact_match],
)
'''

# Upstream-style experiment files: upstream's includes, then small overrides. The
# model file serves train, eval and infer; the pretrain file adds the run settings.
_MODEL_GIN = """\
from __gin__ import dynamic_registration

import seqio
from t5x.examples.t5 import network

include 't5x/examples/t5/t5_1_1/small.gin'

DROPOUT_RATE = 0.0
seqio.SentencePieceVocabulary.sentencepiece_model_file = {spm!r}
network.T5Config:
  vocab_size = 128
  dtype = 'float32'
  emb_dim = 32
  num_heads = 2
  num_encoder_layers = 1
  num_decoder_layers = 1
  head_dim = 16
  mlp_dim = 64
"""

_PRETRAIN_GIN = """\
from __gin__ import dynamic_registration

import __main__ as train_script
from t5x import utils

include {model_gin!r}
include 't5x/configs/runs/pretrain.gin'

USE_CACHED_TASKS = False
MIXTURE_OR_TASK_MODULE = {module!r}
RANDOM_SEED = 0
train/utils.DatasetConfig.batch_size = 8
train_eval/utils.DatasetConfig.batch_size = 8
utils.SaveCheckpointConfig.period = 2
utils.create_learning_rate_scheduler.warmup_steps = 2
train_script.train:
  eval_period = 2
  eval_steps = 1
"""


def write_experiment(folder: pathlib.Path, spm_path: str) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes the task module and the gin files into ``folder``; returns (model gin, pretrain gin)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{TASK_MODULE}.py").write_text(_TASK_SOURCE.format(spm=spm_path, task=TASK))
    model_gin = folder / "tiny_model.gin"
    model_gin.write_text(_MODEL_GIN.format(spm=spm_path))
    pretrain_gin = folder / "tiny_pretrain.gin"
    pretrain_gin.write_text(_PRETRAIN_GIN.format(model_gin=str(model_gin), module=TASK_MODULE))
    return model_gin, pretrain_gin


def launch(folder: pathlib.Path, *args: str, expect: int = 0, module: str | None = None) -> Any:
    """Runs the installed ``t5x-launch`` in ``folder``, its task module on PYTHONPATH, as users do.

    With ``module`` (e.g. ``t5x.train``) it runs ``python -m <module> ARGS`` instead,
    upstream's command line. Returns the completed process; its exit code must be ``expect``.
    """
    import os
    import subprocess
    import sys

    program = (
        [sys.executable, "-m", module]
        if module
        else [str(pathlib.Path(sys.executable).with_name("t5x-launch"))]
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(folder))
    result = subprocess.run(
        [*program, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )
    if result.returncode != expect:
        raise AssertionError(
            f"{' '.join(program)} {' '.join(args)} exited {result.returncode}, expected {expect}\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
        )
    return result
