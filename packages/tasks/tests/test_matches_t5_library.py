"""Optional: our T5 objective functions give the T5 library's exact outputs for the same seeds.

Runs the T5 library in the peer interpreter named by ``T5X_SEQIO_PYTHON`` (a Python
with seqio and the ``t5`` library, as ``nox -s seqio_compat`` sets it); skipped when
the variable is unset.
"""

import json
import os
import subprocess
import textwrap

import pytest
import tensorflow as tf

import t5x.tasks as tt

PEER = os.environ.get("T5X_SEQIO_PYTHON", "")
CASES = [(n, s) for n in (2, 7, 40, 568) for s in ((1, 2, 3, 4), (9, 8, 7, 6))]

_PEER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    from t5.data import preprocessors as p

    class V:
        vocab_size = 1000

    cases = json.loads(sys.argv[1])
    out = []
    for n, s in cases:
        seeds = tf.constant([[s[0], s[1]], [s[2], s[3]]], tf.int64)
        spans = p.random_spans_noise_mask(n, 0.15, seeds)
        rolled = p.random_spans_noise_mask(n, 0.3, seeds, mean_noise_span_length=2.0, random_roll=True)
        iid = p.iid_noise_mask(n, 0.15, seeds)
        prefix = p.random_prefix_noise_mask(n, 0.5, seeds)
        tokens = tf.range(3, n + 3)
        out.append({
            "spans": spans.numpy().tolist(), "rolled": rolled.numpy().tolist(), "iid": iid.numpy().tolist(),
            "prefix": prefix.numpy().tolist(),
            "inputs": p.noise_span_to_unique_sentinel(tokens, spans, V(), None).numpy().tolist(),
            "targets": p.nonnoise_span_to_unique_sentinel(tokens, spans, V(), None).numpy().tolist(),
            "helper": p.random_spans_helper(inputs_length=n + 30, noise_density=0.15, mean_noise_span_length=3.0,
                                            extra_tokens_per_span_inputs=1, extra_tokens_per_span_targets=1),
        })
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(
    not PEER, reason="set T5X_SEQIO_PYTHON to a Python with the t5 library to compare against it"
)
def test_noise_functions_match_t5_library():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [PEER, "-c", _PEER_SCRIPT, json.dumps(CASES)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])

    class V:
        vocab_size = 1000

    for (n, s), want in zip(CASES, theirs, strict=True):
        seeds = tf.constant([[s[0], s[1]], [s[2], s[3]]], tf.int64)
        spans = tt.random_spans_noise_mask(n, 0.15, seeds)
        tokens = tf.range(3, n + 3)
        assert spans.numpy().tolist() == want["spans"], (n, s)
        rolled = tt.random_spans_noise_mask(n, 0.3, seeds, mean_noise_span_length=2.0, random_roll=True)
        assert rolled.numpy().tolist() == want["rolled"]
        assert tt.iid_noise_mask(n, 0.15, seeds).numpy().tolist() == want["iid"]
        assert tt.random_prefix_noise_mask(n, 0.5, seeds).numpy().tolist() == want["prefix"]
        assert tt.noise_span_to_unique_sentinel(tokens, spans, V(), None).numpy().tolist() == want["inputs"]
        assert (
            tt.nonnoise_span_to_unique_sentinel(tokens, spans, V(), None).numpy().tolist() == want["targets"]
        )
        assert list(tt.random_spans_helper(n + 30, 0.15, 3.0)) == want["helper"]
