"""install_as_seqio: ``import seqio`` and its submodules resolve to t5x.seqio."""

import importlib
import sys

import pytest

import t5x.seqio
from t5x.seqio import _alias


@pytest.fixture
def clean_alias():
    """Removes the alias finder and any ``seqio`` modules before and after the test."""

    def clean():
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _alias._AliasFinder)]
        for name in [n for n in sys.modules if n == "seqio" or n.startswith("seqio.")]:
            del sys.modules[name]

    clean()
    yield
    clean()


def test_import_seqio_resolves_to_the_facade(clean_alias):
    assert t5x.seqio.install_as_seqio() is True
    import seqio
    import seqio.preprocessors
    from seqio import utils as seqio_utils

    assert seqio is t5x.seqio
    assert seqio.preprocessors is t5x.seqio.preprocessors
    assert seqio_utils is t5x.seqio.utils
    assert importlib.import_module("seqio.test_utils") is t5x.seqio.test_utils
    # The module keeps its own spec, so reload and pickling see the real name.
    assert t5x.seqio.__spec__.name == "t5x.seqio"


def test_install_is_idempotent(clean_alias):
    assert t5x.seqio.install_as_seqio() is True
    assert t5x.seqio.install_as_seqio() is True
    assert sum(isinstance(f, _alias._AliasFinder) for f in sys.meta_path) == 1


def test_unknown_submodule_is_not_found(clean_alias):
    t5x.seqio.install_as_seqio()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("seqio.no_such_module")


def test_a_real_seqio_wins(clean_alias, tmp_path, monkeypatch):
    (tmp_path / "seqio").mkdir()
    (tmp_path / "seqio" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert t5x.seqio.install_as_seqio() is False
    import seqio

    assert seqio.REAL is True


def test_a_seqio_task_module_registers_in_the_core(clean_alias, tmp_path, monkeypatch):
    (tmp_path / "train.txt").write_text("hello\nworld\n")
    (tmp_path / "my_seqio_tasks.py").write_text(
        "import functools\n"
        "import seqio\n"
        "from seqio import preprocessors\n"
        "\n"
        "vocab = seqio.ByteVocabulary()\n"
        "seqio.TaskRegistry.add(\n"
        "    'module_task',\n"
        f"    source=seqio.TextLineDataSource({{'train': {str(tmp_path / 'train.txt')!r}}}),\n"
        "    preprocessors=[\n"
        "        seqio.map_over_dataset(lambda line: {'targets': line}),\n"
        "        preprocessors.tokenize,\n"
        "        preprocessors.append_eos,\n"
        "    ],\n"
        "    output_features={'targets': seqio.Feature(vocab)},\n"
        ")\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    t5x.seqio.install_as_seqio()
    import t5x.tasks as core

    try:
        importlib.import_module("my_seqio_tasks")
        ds = core.get_mixture_or_task("module_task").get_dataset(None, shuffle=False)
        assert [list(ex["targets"]) for ex in ds.as_numpy_iterator()] == [
            [107, 104, 111, 111, 114, 1],
            [122, 114, 117, 111, 103, 1],
        ]
    finally:
        core.TaskRegistry.remove("module_task")
        sys.modules.pop("my_seqio_tasks", None)
