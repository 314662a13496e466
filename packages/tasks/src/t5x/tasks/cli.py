"""The ``t5x-tasks`` commands as functions, for programs that run them in-process.

``main(argv)`` is ``t5x-tasks`` (``list``, ``inspect``, ``cache``) and
``cache_main(argv)`` is ``t5x-tasks cache``; both return the exit code.
``t5x-launch inspect-task`` and ``cache-tasks`` call them.
"""

from t5x.tasks._cache_cli import main as cache_main
from t5x.tasks._cli import main

__all__ = ["cache_main", "main"]
