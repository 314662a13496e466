"""Importing the user modules that register tasks (``--module_import``)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence


class TaskModuleError(ValueError):
    """A ``--module_import`` module does not exist (its own failing imports are not this)."""


def import_task_modules(modules: Sequence[str], flag: str = "--module_import") -> None:
    """Imports each module, searching the current folder first (as ``python -m`` does).

    A console script's ``sys.path`` starts with its own folder, not the
    current one, so without this a task module next to the user would need
    ``PYTHONPATH=.``.

    Raises:
      TaskModuleError: a module (or its package) is not found; the message names it and ``flag``.
    """
    if modules and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name is None or not (module + ".").startswith(error.name + "."):
                raise  # the module exists; one of its own imports is missing
            raise TaskModuleError(
                f"cannot import the task module {module!r} ({flag}): no module named {error.name!r} "
                f"on the path (the current folder {os.getcwd()} is searched first)"
            ) from error
