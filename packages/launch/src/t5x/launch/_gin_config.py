"""Gin flags: files, bindings and search paths, parsed with errors that help."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util  # gin's resource reader uses it without importing it
import inspect
import logging
import pathlib
import re
from collections.abc import Iterable, Sequence

import gin

CONFIGS_DIR = pathlib.Path(__file__).parent / "configs"
_UNKNOWN_CONFIGURABLE = re.compile(r"No configurable matching '([^']+)'")
_UNKNOWN_PARAMETER = re.compile(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'")
_MISSING_MACRO = re.compile(r"No bindings specified for '([^'/]+)/gin\.macro'")
_MISSING_ATTRIBUTE = re.compile(
    r"Couldn't resolve selector ([\w.]+); <module '([\w.]+)'.*has no attribute (\w+)"
)


class GinConfigError(ValueError):
    """A gin file or binding is wrong; the message names it and the closest known names."""


@dataclasses.dataclass(frozen=True)
class GinArgs:
    """The gin part of a command line."""

    files: tuple[str, ...] = ()
    bindings: tuple[str, ...] = ()
    search_paths: tuple[str, ...] = ()


def split_gin_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Pulls ``--gin.NAME=VALUE`` flags out of ``argv``.

    Returns:
      ``(other_args, bindings)`` where each binding is ``"NAME = VALUE"``. A value
      that is not a gin literal or reference (e.g. a bare path) is quoted, so
      ``--gin.MODEL_DIR=/tmp/run`` works as well as ``--gin.MODEL_DIR=\\"/tmp/run\\"``.
    """
    rest, bindings = [], []
    for arg in argv:
        if arg.startswith("--gin.") and "=" in arg:
            name, value = arg[len("--gin.") :].split("=", 1)
            bindings.append(f"{name} = {_as_gin_value(value)}")
        else:
            rest.append(arg)
    return rest, bindings


def _as_gin_value(value: str) -> str:
    if value.startswith(("@", "%")):
        return value
    try:
        gin.config.parse_value(value)
    except (ValueError, SyntaxError):
        return repr(value)
    return value


def known_configurables() -> list[str]:
    """Names of every registered configurable, short and module-qualified."""
    names: set[str] = set()
    for selector in gin.config._REGISTRY._selector_map:  # gin offers no public listing
        parts = selector.split(".")
        names.update(".".join(parts[i:]) for i in range(len(parts)))
    return sorted(names)


def required_macros_left() -> list[str]:
    """Macros still set to ``%gin.REQUIRED`` in the parsed config."""
    missing = []
    for (scope, selector), params in gin.config._CONFIG.items():
        value = params.get("value")
        if (
            selector == "gin.macro"
            and isinstance(value, gin.config.ConfigurableReference)
            and value.configurable.wrapped == gin.config._retrieve_constant
            and value.scoped_configurable_fn() is gin.REQUIRED
        ):
            missing.append(scope)
    return sorted(missing)


def macro_value(name: str) -> object:
    """The value of a macro, or ``gin.REQUIRED`` when it is unset or still required."""
    try:
        value = gin.query_parameter(f"{name}/macro.value")
    except ValueError:
        return gin.REQUIRED
    if isinstance(value, gin.config.ConfigurableReference):
        return value.scoped_configurable_fn()
    return value


def check_required_macros() -> None:
    """Raises GinConfigError naming every ``%gin.REQUIRED`` macro that was not set."""
    missing = required_macros_left()
    if missing:
        flags = " ".join(f"--gin.{name}=VALUE" for name in missing)
        raise GinConfigError(
            f"required macro{'s' if len(missing) > 1 else ''} not set: {', '.join(missing)}; set with {flags}"
        )


def _closest(name: str, candidates: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)


def _explain(error: Exception) -> str:
    message = str(error)
    hint = ""
    if match := _UNKNOWN_CONFIGURABLE.search(message):
        close = _closest(match.group(1), known_configurables())
        hint = (
            f"Closest known configurables: {', '.join(close)}."
            if close
            else "No similar configurable is registered."
        )
    elif match := _MISSING_ATTRIBUTE.search(message):
        module = importlib.import_module(match.group(2))
        close = _closest(match.group(3), [n for n in dir(module) if not n.startswith("_")])
        hint = f"Closest names in {match.group(2)}: {', '.join(close)}." if close else ""
    elif match := _UNKNOWN_PARAMETER.search(message):
        configurable = gin.config._REGISTRY.get_match(match.group(1))
        params = list(inspect.signature(configurable.wrapped).parameters) if configurable is not None else []
        close = _closest(match.group(2), params)
        hint = f"Closest parameters: {', '.join(close)}." if close else ""
    elif match := _MISSING_MACRO.search(message):
        hint = f"The macro {match.group(1)} is required: set it in a gin file or with --gin.{match.group(1)}=VALUE."
    return f"{message}\n{hint}".strip()


def parse_gin(args: GinArgs, *, default_files: Sequence[str] = ()) -> None:
    """Parses gin files then bindings, with the shipped configs searchable.

    Args:
      args: the gin flags; when ``args.files`` is empty ``default_files`` are used.
      default_files: files to parse when the user names none.

    Raises:
      GinConfigError: a file, binding or macro is wrong (names it, the file and
        line, and the closest known names).
    """
    gin.clear_config()
    for path in (*args.search_paths, str(CONFIGS_DIR), "."):
        gin.add_config_file_search_path(path)
    files = list(args.files) or list(default_files)
    # gin logs an error for every search path a file is not in before finding it.
    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        gin.parse_config_files_and_bindings(files, list(args.bindings), finalize_config=False)
    except (ValueError, KeyError, OSError, SyntaxError, AttributeError, NameError) as error:
        raise GinConfigError(_explain(error)) from None
    finally:
        quiet.setLevel(level)


def explain_gin_error(error: Exception) -> GinConfigError:
    """Wraps an error gin raised while calling a configurable (e.g. a missing macro)."""
    return GinConfigError(_explain(error))


def write_config_gin(directory: pathlib.Path) -> pathlib.Path:
    """Writes the operative gin config of this run as ``config.gin`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.gin"
    tmp = path.with_suffix(".gin.tmp")
    tmp.write_text(gin.operative_config_str())
    tmp.replace(path)
    return path
