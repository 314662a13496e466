import json
import os
import subprocess
import sys
import textwrap

# TensorFlow itself imports jax (from tf.lite) when jax is installed, so the
# check records *who* imports jax/flax/optax: no frame of t5x may be on the stack.
_SCRIPT = textwrap.dedent(
    """
    import json, sys, time, traceback

    culprits = []

    class Watch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax"):
                stack = [f.name for f in traceback.extract_stack()]
                if any("/t5x/" in f for f in stack):
                    culprits.append(name)
            return None

    sys.meta_path.insert(0, Watch())
    t0 = time.perf_counter()
    import tensorflow
    t1 = time.perf_counter()
    import t5x.tasks as tt
    from t5x.vocabularies import ByteVocabulary
    vocab = ByteVocabulary(extra_ids=10)
    for i in range(100):
        tt.TaskRegistry.add(
            f"cost_{i}",
            tt.TextLineDataSource({"train": f"/nonexistent/{i}/*.txt"}),
            {"targets": tt.Feature(vocab)},
            preprocessors=[tt.tokenize, tt.append_eos],
        )
    t2 = time.perf_counter()
    next(iter(tt.get_mixture_or_task("synthetic_copy").get_dataset(None, split="validation")))
    print(json.dumps({"tf": t1 - t0, "ours": t2 - t1, "culprits": culprits}))
    """
)


def test_import_and_registering_100_tasks_is_cheap_and_jax_free():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", _SCRIPT], check=True, capture_output=True, text=True, env=env)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["culprits"] == []
    # "Well under a second" beyond TensorFlow's own import (generous for a loaded 2-core machine).
    assert result["ours"] < 1.0, result
