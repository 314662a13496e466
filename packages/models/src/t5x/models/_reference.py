"""A class named by its dotted path and imported only when used."""

from __future__ import annotations

import importlib
from typing import Any


class LazyReference:
    """Stands for ``module.attribute`` without importing it until called.

    ``t5x.models`` may not import ``t5x.feature_converters`` (a sibling on the
    data side of the layering), so models name their feature converter this way;
    the launcher, which knows every package, resolves it.

    Attributes:
      dotted_name: ``"package.module.Name"``.
    """

    def __init__(self, dotted_name: str) -> None:
        module, _, name = dotted_name.rpartition(".")
        if not module or not name:
            raise ValueError(f"dotted_name must look like 'package.module.Name', got {dotted_name!r}")
        self.dotted_name = dotted_name
        self._module = module
        self._name = name

    @property
    def __name__(self) -> str:
        """The referenced object's own name, as a class would have it."""
        return self._name

    def resolve(self) -> Any:
        """Imports and returns the referenced object.

        Raises:
          ImportError: naming the module and the distribution to install.
        """
        try:
            module = importlib.import_module(self._module)
        except ImportError as err:
            raise ImportError(
                f"{self.dotted_name} needs {self._module!r}; install its distribution "
                "(pip install --find-links dist "
                f"{self._module.split('.')[0]}-{self._module.split('.')[1].replace('_', '-')}; "
                "run in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md)"
            ) from err
        return getattr(module, self._name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Instantiates the referenced class."""
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"LazyReference({self.dotted_name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyReference) and other.dotted_name == self.dotted_name

    def __hash__(self) -> int:
        return hash(self.dotted_name)
