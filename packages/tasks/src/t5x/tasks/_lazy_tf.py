"""TensorFlow, imported the first time one of its attributes is used.

Importing TensorFlow takes seconds. Defining and registering tasks, listing
them and ``--help`` never touch it; building the first dataset does. Modules
write ``from t5x.tasks._lazy_tf import tf`` and use ``tf`` as usual.
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any

__all__ = ["AUTOTUNE", "tf"]

# tf.data.AUTOTUNE, as a plain constant so default arguments need no TensorFlow.
AUTOTUNE = -1


class _LazyModule(types.ModuleType):
    """Stands in for a module and imports it on the first attribute access."""

    def __init__(self, name: str):
        super().__init__(name)
        self._loaded: types.ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)  # keeps copy, pickle and inspection from importing it
        module = self._loaded
        if module is None:
            module = self._loaded = importlib.import_module(self.__name__)
        return getattr(module, attr)


if TYPE_CHECKING:
    import tensorflow as tf
else:
    tf = _LazyModule("tensorflow")
