"""Importing t5x.tasks, registering tasks and `t5x-tasks list` stay cheap: no TensorFlow, no JAX."""

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
    import t5x.tasks as tt
    t1 = time.perf_counter()
    tf_after_import = "tensorflow" in sys.modules
    from t5x.vocabularies import ByteVocabulary
    vocab = ByteVocabulary(extra_ids=10)
    for i in range(100):
        tt.TaskRegistry.add(
            f"cost_{i}",
            tt.TextLineDataSource({"train": f"/nonexistent/{i}/*.txt"}),
            {"targets": tt.Feature(vocab)},
            preprocessors=[tt.tokenize, tt.append_eos],
        )
    tt.MixtureRegistry.add("cost_mixture", [f"cost_{i}" for i in range(100)], default_rate=1.0)
    from t5x.tasks.builtin import register_builtin_tasks
    register_builtin_tasks()
    t2 = time.perf_counter()
    tf_after_registering = "tensorflow" in sys.modules
    next(iter(tt.get_mixture_or_task("synthetic_copy").get_dataset(None, split="validation")))
    print(json.dumps({
        "import": t1 - t0,
        "register": t2 - t1,
        "tf_after_import": tf_after_import,
        "tf_after_registering": tf_after_registering,
        "tf_after_dataset": "tensorflow" in sys.modules,
        "culprits": culprits,
    }))
    """
)

_CLI_SCRIPT = textwrap.dedent(
    """
    import contextlib, io, json, sys, time
    t0 = time.perf_counter()
    from t5x.tasks._cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(["list", "--help"])
        except SystemExit:
            pass
        t1 = time.perf_counter()
        tf_after_help = "tensorflow" in sys.modules
        main(["list"])
    print(json.dumps({
        "help": t1 - t0,
        "tf_after_help": tf_after_help,
        "tf_after_list": "tensorflow" in sys.modules,
        "listed_builtin": "synthetic_sort_digits" in out.getvalue(),
    }))
    """
)


def _run(script: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_and_registering_100_tasks_need_no_tensorflow_or_jax():
    result = _run(_SCRIPT)
    assert result["culprits"] == []
    assert not result["tf_after_import"], result
    assert not result["tf_after_registering"], result
    assert result["tf_after_dataset"], result  # the first dataset is what loads it
    # Well under a second on an idle machine (TensorFlow alone takes seconds); generous for a loaded one.
    assert result["import"] + result["register"] < 2.0, result


def test_cli_help_and_list_need_no_tensorflow():
    result = _run(_CLI_SCRIPT)
    assert not result["tf_after_help"], result
    assert not result["tf_after_list"], result
    assert result["listed_builtin"], result
    assert result["help"] < 2.0, result
