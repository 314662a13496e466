"""Makes ``import seqio`` resolve to ``t5x.seqio`` when the real seqio is not installed."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

ALIAS = "seqio"
TARGET = "t5x.seqio"


class _AliasLoader(importlib.abc.Loader):
    """Hands back the already-imported ``t5x.seqio[.sub]`` module instead of building a new one."""

    def __init__(self, target: str):
        self._target = target
        self._module: ModuleType | None = None
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        self._module = importlib.import_module(self._target)
        self._spec = self._module.__spec__
        return self._module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias spec onto the module; give it its own back so
        # that reloading and pickling keep working under the real name.
        if self._spec is not None:
            module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``seqio`` and ``seqio.<name>`` as ``t5x.seqio`` and ``t5x.seqio.<name>``."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):  # type: ignore[override]
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS) :]
        if importlib.util.find_spec(real) is None:
            return None
        is_package = real == TARGET or hasattr(importlib.import_module(real), "__path__")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=is_package)


def _installed_finder() -> _AliasFinder | None:
    for finder in sys.meta_path:
        if type(finder).__name__ == _AliasFinder.__name__ and type(finder).__module__ == __name__:
            return finder  # type: ignore[return-value]
    return None


def _real_seqio_available() -> bool:
    module = sys.modules.get(ALIAS)
    if module is not None:
        return getattr(module, "__name__", ALIAS) != TARGET
    try:
        return importlib.util.find_spec(ALIAS) is not None
    except (ImportError, ValueError):
        return False


def install_as_seqio() -> bool:
    """Lets ``import seqio`` (and ``import seqio.utils`` etc.) load this package.

    Does nothing when the real seqio can be imported: real code keeps precedence.
    Calling it again is harmless.

    Returns:
      True when ``seqio`` now names ``t5x.seqio``, False when the real seqio is used.
    """
    if _installed_finder() is not None:
        return True
    if _real_seqio_available():
        return False
    sys.meta_path.insert(0, _AliasFinder())
    return True
