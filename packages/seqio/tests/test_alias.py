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
