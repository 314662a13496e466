"""Optional: identical outputs to seqio's converters on the same random examples.

Runs seqio (0.0.20) in another interpreter, named by the environment variable
``T5X_SEQIO_PYTHON`` (e.g. peers/seqio/bin/python), through
``seqio_reference.py``; skipped when the variable is not set.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import t5x.feature_converters as fc

SEQIO_PYTHON = os.environ.get("T5X_SEQIO_PYTHON")
pytestmark = pytest.mark.skipif(
    not SEQIO_PYTHON,
    reason="set T5X_SEQIO_PYTHON to an interpreter with seqio 0.0.20 to compare against seqio",
)

CASES = [
    ("EncDecFeatureConverter", {"inputs": 12, "targets": 7}, {}),
    ("LMFeatureConverter", {"targets": 10}, {}),
    ("PrefixLMFeatureConverter", {"inputs": 6, "targets": 5}, {}),
    ("PrefixLMFeatureConverter", {"inputs": 6, "targets": 5}, {"loss_on_targets_only": False}),
    ("DecoderFeatureConverter", {"targets": 8}, {}),
    ("DecoderFeatureConverter", {"inputs": 4, "targets": 5}, {}),
    ("EncoderFeatureConverter", {"inputs": 9, "targets": 9}, {"mask_id": 3}),
]


def _examples(rng, n, lengths, too_long=False):
    """Random examples with empty features, 0 ids inside and (optionally) over-long ones."""
    out = []
    for _ in range(n):
        ex = {}
        for k, limit in lengths.items():
            size = 0 if rng.random() < 0.1 else int(rng.integers(1, limit + 1))
            if too_long and rng.random() < 0.2:
                size = limit + int(rng.integers(1, 4))
            toks = rng.integers(1, 20, size=size)
            toks[rng.random(size) < 0.05] = 0
            ex[k] = toks.tolist()
        out.append(ex)
    return out


def _jobs():
    rng = np.random.default_rng(1234)
    jobs = []
    for name, lengths, kwargs in CASES:
        for pack in (True, False):
            for bos_id, check in ((0, True), (3, True), (0, False)):
                jobs.append(
                    {
                        "converter": name,
                        "kwargs": dict(kwargs, pack=pack, bos_id=bos_id, apply_length_check=check),
                        "task_feature_lengths": lengths,
                        # More examples than one packing window, so window edges are compared too.
                        "examples": _examples(
                            rng, 3 * max(lengths.values()) + 5, lengths, too_long=not check
                        ),
                    }
                )
    return jobs


def _ours(job):
    names = sorted(job["task_feature_lengths"])
    examples = job["examples"]
    ds = tf.data.Dataset.from_generator(
        lambda: ({k: np.asarray(ex[k], np.int32) for k in names} for ex in examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in names},
    )
    conv = getattr(fc, job["converter"])(**job["kwargs"])
    return [
        {k: v.tolist() for k, v in ex.items()}
        for ex in conv(ds, job["task_feature_lengths"]).as_numpy_iterator()
    ]


@pytest.fixture(scope="module")
def seqio_results():
    jobs = _jobs()
    script = pathlib.Path(__file__).with_name("seqio_reference.py")
    proc = subprocess.run(
        [SEQIO_PYTHON, str(script)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return jobs, json.loads(proc.stdout)


@pytest.mark.parametrize("index", range(len(CASES) * 6))
def test_same_outputs_as_seqio(seqio_results, index):
    jobs, results = seqio_results
    job, want = jobs[index], results[index]
    got = _ours(job)
    assert len(got) == len(want), f"{job['converter']} {job['kwargs']}: {len(got)} rows, seqio {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        assert a == b, f"{job['converter']} {job['kwargs']}: row {i} differs"
