import pytest
from tasks_testlib import text_task

import t5x.tasks as tt


def test_add_get_remove(vocab, clean_registry):
    task = text_task("reg_a", vocab, [("a", "b")])
    tt.TaskRegistry.add_provider("reg_a", task)
    assert tt.TaskRegistry.get("reg_a") is task
    assert tt.get_mixture_or_task("reg_a") is task
    assert "reg_a" in tt.TaskRegistry.names()
    with pytest.raises(ValueError, match="already registered"):
        tt.TaskRegistry.add_provider("reg_a", task)
    tt.TaskRegistry.remove("reg_a")
    assert "reg_a" not in tt.TaskRegistry.names()


def test_unknown_name_lists_closest(vocab, clean_registry):
    tt.TaskRegistry.add_provider("glue_mrpc_v2", text_task("glue_mrpc_v2", vocab, [("a", "b")]))
    with pytest.raises(KeyError) as info:
        tt.get_mixture_or_task("glue_mrcp_v2")
    message = str(info.value)
    assert "'glue_mrcp_v2'" in message and "glue_mrpc_v2" in message
    with pytest.raises(tt.UnknownNameError, match="synthetic_copy"):
        tt.TaskRegistry.get("synthetic_cpy")


def test_registering_does_no_io(vocab, clean_registry, tmp_path):
    # The pattern matches nothing: registration must succeed, reading must fail clearly.
    source = tt.TextLineDataSource({"train": str(tmp_path / "missing-*.txt")})
    task = tt.TaskRegistry.add(
        "reg_lazy", source, {"targets": tt.Feature(vocab)}, preprocessors=[tt.tokenize]
    )
    with pytest.raises(FileNotFoundError, match="missing-"):
        task.get_dataset(split="train")


def test_task_and_mixture_share_one_namespace(vocab, clean_registry):
    tt.TaskRegistry.add_provider("reg_b", text_task("reg_b", vocab, [("a", "b")]))
    with pytest.raises(ValueError, match="already registered"):
        tt.MixtureRegistry.add("reg_b", ["reg_b"], default_rate=1.0)


@pytest.mark.parametrize("bad", ["", "has space", None, "a*b"])
def test_bad_names_rejected(vocab, bad):
    with pytest.raises(ValueError, match="name"):
        text_task(bad, vocab, [("a", "b")])


def test_builtins_registered():
    for name in tt.BUILTIN_TASKS:
        assert name in tt.TaskRegistry.names()
    assert "synthetic_text_to_text" in tt.MixtureRegistry.names()
