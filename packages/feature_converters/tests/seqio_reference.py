"""Runs seqio's feature converters on examples given as JSON (stdin) -> JSON (stdout).

Executed by the seqio peer interpreter (see test_seqio_equality.py), never imported
by the tests. Input: a list of jobs, each {"converter", "kwargs",
"task_feature_lengths", "examples"}; output: a list of converted example lists.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import seqio
import tensorflow as tf


def run(job):
    cls = getattr(seqio, job["converter"])
    conv = cls(**job["kwargs"])
    names = sorted(job["task_feature_lengths"])
    examples = job["examples"]
    ds = tf.data.Dataset.from_generator(
        lambda: ({k: np.asarray(ex[k], np.int32) for k in names} for ex in examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in names},
    )
    out = conv(ds, job["task_feature_lengths"])
    return [{k: v.tolist() for k, v in ex.items()} for ex in out.as_numpy_iterator()]


def main():
    jobs = json.load(sys.stdin)
    json.dump([run(job) for job in jobs], sys.stdout)


if __name__ == "__main__":
    main()
