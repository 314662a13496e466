"""t5x-tasks flags: spellings shared with t5x-launch, task modules from the current folder, exclusions."""

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import t5x.tasks as tt
from t5x.tasks._beam_cache import tasks_to_cache
from t5x.tasks._cli import main
from t5x.tasks.builtin import BUILTIN_TASKS, register_builtin_tasks

TASK_MODULE = textwrap.dedent(
    """
    import t5x.tasks as tt
    from t5x.vocabularies import ByteVocabulary

    tt.TaskRegistry.add(
        "task_from_the_current_folder",
        tt.InMemoryDataSource({"train": [{"targets": "hello"}]}),
        {"targets": tt.Feature(ByteVocabulary())},
        preprocessors=[tt.tokenize],
    )
    """
)


def _tasks_cli(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = pathlib.Path(sys.executable).with_name("t5x-tasks")
    return subprocess.run([str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_a_task_module_in_the_current_folder_needs_no_pythonpath(tmp_path):
    (tmp_path / "my_tasks.py").write_text(TASK_MODULE)
    result = _tasks_cli(["list", "--module_import", "my_tasks"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "task_from_the_current_folder" in result.stdout
    assert "synthetic_sort_digits" in result.stdout  # the built-ins are listed too
    assert "deprecated" not in result.stderr
    # The old spelling still works, with a note naming the new one.
    old = _tasks_cli(["--module", "my_tasks", "list"], tmp_path)
    assert old.returncode == 0, old.stderr
    assert "task_from_the_current_folder" in old.stdout
    assert "--module is deprecated; use --module_import" in old.stderr


def test_an_unknown_task_module_is_named(capsys):
    assert main(["--module_import", "no_such_task_module_xyz", "list"]) == 2
    err = capsys.readouterr().err
    assert "cannot import the task module 'no_such_task_module_xyz' (--module_import)" in err


def _inspected_ids(capsys, *flags):
    assert main(["inspect", "synthetic_copy", "--split", "validation", "--n", "1", *flags]) == 0
    captured = capsys.readouterr()
    ids = [line for line in captured.out.splitlines() if line.startswith("targets: ids")]
    return ids, captured.err


def test_sequence_length_flag_and_its_old_spelling(capsys):
    full, _ = _inspected_ids(capsys)
    assert full and not full[0].startswith("targets: ids (4)")
    ids, err = _inspected_ids(capsys, "--sequence_length", "inputs=8", "targets=4")
    assert ids[0].startswith("targets: ids (4)") and "deprecated" not in err
    old_ids, err = _inspected_ids(capsys, "--sequence-length", "inputs=8", "targets=4")
    assert old_ids == ids
    assert "--sequence-length is deprecated; use --sequence_length" in err


@pytest.fixture
def three_tasks(vocab, clean_registry):
    for name in ("cache_a", "cache_b", "cache_c"):
        tt.TaskRegistry.add(
            name,
            tt.InMemoryDataSource({"train": [{"targets": "x"}]}),
            {"targets": tt.Feature(vocab)},
            preprocessors=[tt.tokenize, tt.CacheDatasetPlaceholder()],
        )
    tt.MixtureRegistry.add("cache_ab", ["cache_a", "cache_b"], default_rate=1.0)


def _names(tasks):
    return [t.name for t in tasks]


def test_excluded_tasks_apply_after_mixtures_expand(three_tasks):
    assert _names(tasks_to_cache(["cache_ab", "cache_c"])) == ["cache_a", "cache_b", "cache_c"]
    assert _names(tasks_to_cache(["cache_ab", "cache_c"], ["cache_b"])) == ["cache_a", "cache_c"]
    assert _names(tasks_to_cache(["cache_ab", "cache_c"], ["cache_ab"])) == ["cache_c"]
    assert _names(tasks_to_cache(["cache_a", "cache_ab"])) == ["cache_a", "cache_b"]  # each task once
    with pytest.raises(tt.UnknownNameError, match="cache_bb"):
        tasks_to_cache(["cache_ab"], ["cache_bb"])


def test_builtin_tasks_register_on_request_and_once():
    before = tt.TaskRegistry.names()
    assert set(BUILTIN_TASKS) <= set(before)
    register_builtin_tasks()
    assert tt.TaskRegistry.names() == before
    # The old names on t5x.tasks resolve to t5x.tasks.builtin's.
    assert tt.register_builtin_tasks is register_builtin_tasks
    assert "register_builtin_tasks" in dir(tt)
    with pytest.raises(tt.UnknownNameError, match=r"register_builtin_tasks\(\)"):
        tt.get_mixture_or_task("synthetic_nothing_like_it")


def test_feature_dtype_is_a_tf_dtype_from_any_spelling(vocab):
    default = tt.Feature(vocab)
    assert default.dtype is tf.int32 and default.dtype_name == "int32"
    for spelling in ("int64", np.int64, np.dtype("int64"), tf.int64):
        feature = tt.Feature(vocab, dtype=spelling)
        assert feature.dtype is tf.int64
        assert feature == tt.Feature(vocab, dtype="int64")
        assert hash(feature) == hash(tt.Feature(vocab, dtype="int64"))
    assert default != tt.Feature(vocab, dtype="int64")
    assert "dtype=int32" in repr(default)
    with pytest.raises(TypeError):
        tt.Feature(vocab, dtype="int33")
