"""t5x-upstream's gin extension for t5x-launch (entry point ``t5x.launch.gin_extensions``).

Importing this module is cheap: the scripts, seqio and JAX load in ``prepare``.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

from t5x.launch import GinExtension
from t5x.upstream._unsupported import explain_unsupported

GIN_DIR = pathlib.Path(__file__).parent / "gin"
# Upstream's run scripts' functions, bound by its run files as `train_script.train`, ...
SCRIPT_NAMES = ("train", "evaluate", "infer", "precompile", "create_task_from_tfexample_file")
# t5x-launch command -> the script function its upstream run file binds.
_COMMANDS = {"train": "train", "eval": "evaluate", "infer": "infer", "precompile": "precompile"}


def _scripts() -> dict[str, Any]:
    from t5x.upstream import _scripts

    return {name: getattr(_scripts, name) for name in SCRIPT_NAMES}


def prepare() -> None:
    """Makes upstream gin files' imports resolve: ``import seqio`` and ``import __main__ as train_script``.

    ``__main__`` gets upstream's script functions (``train``, ``evaluate``,
    ``infer``, ``precompile``, ``create_task_from_tfexample_file``) unless it
    defines them itself (a script of the user's keeps its own, as under upstream).
    """
    from t5x.seqio import install_as_seqio

    install_as_seqio()
    main = sys.modules.get("__main__")
    if main is None:
        return
    for name, script in _scripts().items():
        if not hasattr(main, name):
            setattr(main, name, script)


class _Jobs(dict):
    """command -> upstream script, loaded on first use (keeps the entry point import light)."""

    def get(self, command: str, default: Any = None) -> Any:
        if command == "export":
            # Upstream's export run file binds a library function, not a script's.
            from t5x import export_lib

            return export_lib.save
        name = _COMMANDS.get(command)
        if name is None:
            return default
        main = sys.modules.get("__main__")
        script = getattr(main, name, None) if main is not None else None
        # A user's own __main__.train is what the gin file binds, as under upstream.
        return script if callable(script) else _scripts()[name]


EXTENSION = GinExtension(
    search_paths=(str(GIN_DIR),),
    prepare=prepare,
    jobs=_Jobs(),
    explain=explain_unsupported,
)
