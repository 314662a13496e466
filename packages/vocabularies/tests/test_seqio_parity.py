"""Optional: the same ids as seqio for the same model file, compared in seqio's own interpreter.

Runs only when ``T5X_SEQIO_PYTHON`` names a Python with seqio (and tensorflow-text)
installed, e.g. ``T5X_SEQIO_PYTHON=peers/seqio/bin/python``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import textwrap

import pytest

from t5x.vocabularies import ByteVocabulary, SentencePieceVocabulary

from .corpora import generate_lines

PEER = os.environ.get("T5X_SEQIO_PYTHON")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PEER, reason="set T5X_SEQIO_PYTHON to a Python with seqio to compare against it"),
]

PEER_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys
    import seqio
    import tensorflow as tf
    job = json.load(sys.stdin)
    out = {}
    for extra_ids in job["extra_ids"]:
        sp = seqio.SentencePieceVocabulary(job["model"], extra_ids=extra_ids)
        out[str(extra_ids)] = {
            "vocab_size": sp.vocab_size,
            "ids": [sp.encode(t) for t in job["texts"]],
            "ids_tf": sp.encode_tf(tf.constant(job["texts"])).to_list(),
            "decoded": [sp.decode(ids) for ids in job["decode"]],
            "sha256": hashlib.sha256(sp.sp_model).hexdigest(),
        }
    byte = seqio.ByteVocabulary(extra_ids=3)
    out["byte"] = {
        "vocab_size": byte.vocab_size,
        "ids": [byte.encode(t) for t in job["texts"]],
        "decoded": [byte.decode(byte.encode(t) + [1, 70]) for t in job["texts"]],
    }
    print(json.dumps(out))
    """
)


def _texts() -> list[str]:
    rng = random.Random(7)
    texts = generate_lines(11, 150)
    pool = "ab cd  \t\n ÄÖ ß 世界 €😀 ﬁ ⁇ <extra_id_0> <extra_id_2>x "
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(0, 30))) for _ in range(150)]
    texts += ["", " ", "  leading and trailing  ", "<extra_id_0>", "a<extra_id_1>b", "\u3000\xa0 x"]
    return texts


def test_same_ids_as_seqio(sp_model_file):
    texts = _texts()
    ours = {n: SentencePieceVocabulary(sp_model_file, extra_ids=n) for n in (0, 3, 100)}
    to_decode = [[*ours[3].encode(t), 1, 5] for t in texts[:40]]
    to_decode += [[5, 6, ours[3].vocab_size - 1, ours[3].vocab_size + 4, 0, 7]]
    job = {"model": str(sp_model_file), "extra_ids": [0, 3, 100], "texts": texts, "decode": to_decode}
    result = subprocess.run(
        [PEER, "-c", PEER_SCRIPT], input=json.dumps(job), capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = json.loads(result.stdout.strip().splitlines()[-1])
    for n, vocab in ours.items():
        peer = theirs[str(n)]
        assert vocab.vocab_size == peer["vocab_size"]
        assert vocab.encode_batch(texts) == peer["ids"]
        # tensorflow-text runs its own SentencePiece build; it agrees on these texts.
        assert vocab.encode_batch(texts) == peer["ids_tf"]
        assert hashlib.sha256(vocab.sp_model).hexdigest() == peer["sha256"]  # the same model proto bytes
        if n == 3:
            assert [vocab.decode(ids) for ids in to_decode] == peer["decoded"]
    byte = ByteVocabulary(extra_ids=3)
    assert byte.vocab_size == theirs["byte"]["vocab_size"]
    assert byte.encode_batch(texts) == theirs["byte"]["ids"]
    assert [byte.decode([*byte.encode(t), 1, 70]) for t in texts] == theirs["byte"]["decoded"]
