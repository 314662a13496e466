"""Importing the package pulls in neither JAX nor TensorFlow; the tf path loads TensorFlow on first use."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(code: str, *extra_path: str) -> dict:
    env_path = ":".join(extra_path)
    prefix = f"import sys; sys.path[:0] = {env_path.split(':') if env_path else []!r}\n"
    result = subprocess.run(
        [sys.executable, "-c", prefix + textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_leaves_jax_and_tensorflow_out(sp_model_file):
    got = _run(
        f"""
        import json, sys
        import t5x.vocabularies as v
        sp = v.SentencePieceVocabulary({str(sp_model_file)!r}, extra_ids=3)
        byte = v.ByteVocabulary()
        ids = sp.encode("hello world")
        texts = [sp.decode(ids), byte.decode(byte.encode("x")), v.PassThroughVocabulary(9).decode([3])]
        loaded = [m for m in ("jax", "jaxlib", "tensorflow", "tokenizers", "flax") if m in sys.modules]
        print(json.dumps({{"loaded": loaded, "texts": texts}}))
        """
    )
    assert got == {"loaded": [], "texts": ["hello world", "x", "3"]}


def test_first_tf_call_imports_tensorflow(tmp_path):
    # A stand-in 'tensorflow' that fails on import shows exactly when the real one would load.
    stub = tmp_path / "stub"
    (stub / "tensorflow").mkdir(parents=True)
    (stub / "tensorflow" / "__init__.py").write_text("raise ImportError('stub tensorflow imported')\n")
    got = _run(
        """
        import json
        import t5x.vocabularies as v
        byte = v.ByteVocabulary()
        byte.encode("abc"); byte.decode([5, 6])
        try:
            byte.encode_tf("abc")
            outcome = "no import"
        except ImportError as e:
            outcome = str(e)
        print(json.dumps({"outcome": outcome}))
        """,
        str(stub),
    )
    assert got == {"outcome": "stub tensorflow imported"}
