"""The ``t5x-launch`` command as a function: ``main(argv)`` runs it in-process and returns the exit code."""

from t5x.launch._cli import main

__all__ = ["main"]
