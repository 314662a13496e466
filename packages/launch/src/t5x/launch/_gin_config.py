"""Gin flags: files, bindings and search paths, parsed with errors that help."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.metadata
import importlib.util  # gin's resource reader uses it without importing it
import inspect
import io
import logging
import os
import pathlib
import re
import tokenize
import types
import typing
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import gin
from gin import config_parser

from t5x.launch._errors import UserError

CONFIGS_DIR = pathlib.Path(__file__).parent / "configs"
_UNKNOWN_CONFIGURABLE = re.compile(r"No configurable matching '([^']+)'")
_UNKNOWN_PARAMETER = re.compile(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'")
_MISSING_MACRO = re.compile(r"No bindings specified for '([^'/]+)/gin\.macro'")
_MISSING_ATTRIBUTE = re.compile(
    r"Couldn't resolve selector ([\w.]+); <module '([\w.]+)'.*has no attribute (\w+)"
)


class GinConfigError(UserError, ValueError):
    """A gin file or binding is wrong; the message names it and the closest known names."""


# ---- gin extensions: other distributions' gin files, names and jobs ----------------------------

GIN_EXTENSIONS_GROUP = "t5x.launch.gin_extensions"


@dataclasses.dataclass(frozen=True)
class GinExtension:
    """What an installed distribution adds to gin parsing (found by entry point, not imported here).

    A distribution registers one under the entry-point group ``t5x.launch.gin_extensions``
    (e.g. t5x-upstream, which runs upstream t5x gin files). Launch never imports such a
    distribution by name, so the layering stays one-way.

    Attributes:
      search_paths: folders searched for gin files after the shipped configs.
      prepare: called before every parse (e.g. to make modules importable by gin files).
      jobs: command (``train``, ``eval``, ``infer``) -> a job function that a config may
        bind instead of launch's own; it runs when the parsed config binds it.
      explain: error message -> a hint to append (or None).
    """

    search_paths: Sequence[str] = ()
    prepare: Callable[[], None] | None = None
    jobs: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    explain: Callable[[str], str | None] | None = None


@functools.cache
def gin_extensions() -> tuple[GinExtension, ...]:
    """The gin extensions of the installed distributions (loaded once)."""
    found = []
    for entry in sorted(importlib.metadata.entry_points(group=GIN_EXTENSIONS_GROUP), key=lambda e: e.name):
        extension = entry.load()
        if not isinstance(extension, GinExtension):
            raise TypeError(
                f"entry point {entry.name} = {entry.value} in {GIN_EXTENSIONS_GROUP} is not a GinExtension"
            )
        found.append(extension)
    return tuple(found)


def _is_bound(fn: Callable[..., Any]) -> bool:
    """Whether the parsed config binds a parameter of ``fn`` (in any scope)."""
    configurable = gin.config._INVERSE_REGISTRY.get(fn)  # gin offers no public lookup
    if configurable is None:
        return False
    return any(selector == configurable.selector for _, selector in gin.config._CONFIG)


def configured_job(command: str, default: Callable[..., Any]) -> Callable[..., Any]:
    """The job a parsed config binds for ``command``: an extension's, when bound, else ``default``."""
    if _is_bound(default):
        return default
    for extension in gin_extensions():
        job = extension.jobs.get(command)
        if job is not None and _is_bound(job):
            return job
    return default


class GinBinding(str):
    """A binding ``"NAME = VALUE"`` that remembers the command-line flag it came from."""

    flag: str

    def __new__(cls, binding: str, flag: str) -> GinBinding:
        self = super().__new__(cls, binding)
        self.flag = flag
        return self


def describe_binding(binding: str) -> str:
    """The flag a binding came from (``--gin.NAME=VALUE``), else the binding quoted."""
    flag = getattr(binding, "flag", None)
    return flag if flag else f"the binding {str(binding)!r}"


@dataclasses.dataclass(frozen=True)
class GinArgs:
    """The gin part of a command line."""

    files: tuple[str, ...] = ()
    bindings: tuple[str, ...] = ()
    search_paths: tuple[str, ...] = ()
    # Macros the command reads itself (e.g. its output folder), which a binding may set although
    # no config refers to them.
    read_macros: tuple[str, ...] = ()


def split_gin_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Pulls ``--gin.NAME=VALUE`` flags out of ``argv``.

    Returns:
      ``(other_args, bindings)`` where each binding is ``"NAME = VALUE"``. A value
      that is not a gin literal or reference (e.g. a bare path) is quoted, so
      ``--gin.MODEL_DIR=/tmp/run`` works as well as ``--gin.MODEL_DIR=\\"/tmp/run\\"``.
    """
    rest: list[str] = []
    bindings: list[str] = []
    for arg in argv:
        if arg.startswith("--gin.") and "=" in arg:
            name, value = arg[len("--gin.") :].split("=", 1)
            bindings.append(GinBinding(f"{name} = {_as_gin_value(value)}", arg))
        else:
            rest.append(arg)
    return rest, bindings


def _as_gin_value(value: str) -> str:
    if value.startswith(("@", "%")):
        return value
    try:
        gin.config.parse_value(value)
    except (ValueError, SyntaxError, tokenize.TokenError):
        # A broken literal (an unclosed bracket or quote) is left for gin to report, not made a string.
        return value if value.lstrip().startswith(("{", "[", "(", "'", '"')) else repr(value)
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
    # An extension knows names of its own world (e.g. an upstream t5x name and what replaces it).
    for extension in gin_extensions():
        extra = extension.explain(message) if extension.explain is not None else None
        if extra:
            hint = f"{extra}\n{hint}" if hint else extra
    return f"{message}\n{hint}".strip()


def parse_gin(
    args: GinArgs, *, default_files: Sequence[str] = (), read_macros: Collection[str] = ("MODEL",)
) -> None:
    """Parses gin files then bindings, with the shipped configs searchable, and checks the result.

    Args:
      args: the gin flags; when ``args.files`` is empty ``default_files`` are used.
      default_files: files to parse when the user names none.
      read_macros: macros the caller reads itself (``macro_value``), which a
        binding may set although no config refers to them.

    A macro set by a command-line binding (a :class:`GinBinding`, from
    ``split_gin_flags``) must be referred to by some parsed config.

    Raises:
      GinConfigError: a file, binding or macro is wrong (names it, the file and
        line, and the closest known names): a syntax error (quoting the line or
        binding), an unknown configurable or parameter, a macro set by a binding
        that no config refers to, or a value whose type differs from the
        parameter's annotation (``int``, ``float``, ``str``, ``bool``, optional).
    """
    gin.clear_config()
    extensions = gin_extensions()
    for extension in extensions:
        if extension.prepare is not None:
            extension.prepare()
    extension_paths = [str(path) for extension in extensions for path in extension.search_paths]
    for path in (*args.search_paths, str(CONFIGS_DIR), *extension_paths, "."):
        gin.add_config_file_search_path(path)
    files = list(args.files) or list(default_files)
    # gin logs an error for every search path a file is not in before finding it.
    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        for path in files:
            try:
                gin.parse_config_file(path)
            except tokenize.TokenError as error:
                raise GinConfigError(_explain_token_error_in_file(path, error)) from None
            except SyntaxError as error:
                raise GinConfigError(_explain_syntax_error(error, error.filename or path)) from None
        # One binding at a time, so that an error names the flag it came from.
        for binding in args.bindings:
            try:
                gin.parse_config(str(binding))
            except (SyntaxError, tokenize.TokenError) as error:
                raise GinConfigError(
                    _explain_syntax_error(error, describe_binding(binding), binding)
                ) from None
            except (ValueError, KeyError, AttributeError, NameError) as error:
                raise GinConfigError(f"in {describe_binding(binding)}: {_explain(error)}") from None
    except (ValueError, KeyError, OSError, SyntaxError, AttributeError, NameError, ImportError) as error:
        if isinstance(error, GinConfigError):
            raise
        raise GinConfigError(_explain(error)) from None
    finally:
        quiet.setLevel(level)
    check_command_line_macros(args.bindings, (*read_macros, *args.read_macros))
    check_value_types(args.bindings)


def _explain_syntax_error(error: Exception, where: str, binding: str | None = None) -> str:
    """``where: gin syntax error: what`` and the offending line."""
    if isinstance(error, tokenize.TokenError):
        what = str(error.args[0]) if error.args else "cannot split into tokens"
        line_number = error.args[1][0] if len(error.args) > 1 else 1
        text = None
    else:
        what = str(error.msg) if isinstance(error, SyntaxError) else str(error)
        line_number = getattr(error, "lineno", None) or 1
        text = getattr(error, "text", None)
    if binding is not None:
        lines = str(binding).splitlines() or [""]
        if text is None or len(lines) == 1:
            text = lines[min(max(line_number, 1), len(lines)) - 1]
        if what.startswith("unexpected EOF"):
            what += " (a bracket or quote left open?)"
        quoted = f"\n    {text.rstrip()}" if text and text.strip() not in where else ""
        return f"gin syntax error in {where}: {what}{quoted}"
    location = f"{where}:{line_number}"
    what = what.split("\n")[0]
    return f"{location}: gin syntax error: {what}" + (f"\n    {text.rstrip()}" if text else "")


def _resolve_gin_file(path: str) -> str | None:
    prefixes = [""] if os.path.isabs(path) else list(gin.config._LOCATION_PREFIXES)
    for prefix in prefixes:
        candidate = os.path.join(prefix, path)
        if os.path.isfile(candidate):
            return candidate
    return None


def _untokenizable(path: str, seen: set[str]) -> tuple[str, int, str, str] | None:
    """The file (this one or one it includes) Python's tokenizer rejects: path, line, text, why."""
    resolved = _resolve_gin_file(path)
    if resolved is None or resolved in seen:
        return None
    seen.add(resolved)
    text = pathlib.Path(resolved).read_text(encoding="utf-8", errors="replace")
    try:
        for _ in tokenize.generate_tokens(io.StringIO(text).readline):
            pass
    except tokenize.TokenError as error:
        line = error.args[1][0] if len(error.args) > 1 else 1
        lines = text.splitlines()
        return resolved, line, lines[line - 1] if 0 < line <= len(lines) else "", str(error.args[0])
    for included in re.findall(r"^\s*include\s+['\"]([^'\"]+)['\"]", text, flags=re.M):
        found = _untokenizable(included, seen)
        if found is not None:
            return found
    return None


def _explain_token_error_in_file(path: str, error: tokenize.TokenError) -> str:
    found = _untokenizable(path, set())
    if found is None:
        return f"{path}: gin syntax error: {error.args[0] if error.args else error}"
    where, line, text, what = found
    if what.startswith("unexpected EOF"):
        what += " (a bracket or quote left open before the end of the file?)"
        return f"{where}: gin syntax error: {what}"
    return f"{where}:{line}: gin syntax error: {what}" + (f"\n    {text.rstrip()}" if text.strip() else "")


# ---- command-line macros no config refers to --------------------------------------------------


def _statements(binding: str) -> Iterator[config_parser.BindingStatement]:
    """The binding statements of an already-parsed binding string."""
    parser = config_parser.ConfigParser(str(binding), gin.config.ParserDelegate(skip_unknown=True))
    for statement in parser:
        if isinstance(statement, config_parser.BindingStatement):
            yield statement


def _macro_name(reference: Any) -> str | None:
    """``NAME`` for a reference ``%NAME`` (None for other references)."""
    if (
        isinstance(reference, gin.config.ConfigurableReference)
        and reference.configurable.wrapped is gin.config.macro
    ):
        return reference.scoped_selector.rsplit("/", 1)[0]
    return None


def referenced_macros() -> set[str]:
    """Macros some parsed config refers to (``%NAME``), wherever the reference was parsed."""
    names = set()
    for reference in gin.config.iterate_references(gin.config._CONFIG):
        name = _macro_name(reference)
        if name is not None:
            names.add(name)
    return names


def defined_macros() -> set[str]:
    """Macros the parsed configs set (``NAME = VALUE``)."""
    return {scope for scope, selector in gin.config._CONFIG if selector == "gin.macro"}


def check_command_line_macros(bindings: Sequence[str], read_macros: Collection[str] = ()) -> None:
    """Refuses a macro set on the command line that no parsed config refers to.

    Such a macro would change nothing (most often it is misspelt). Only
    bindings that came from a flag (:class:`GinBinding`, as made by
    ``split_gin_flags``) are checked. Call after parsing every file and binding.

    Raises:
      GinConfigError: naming each such macro, its flag and the closest known macros.
    """
    set_by: dict[str, str] = {}
    for binding in bindings:
        if not getattr(binding, "flag", None):
            continue  # a program's own binding, not the user's
        for statement in _statements(binding):
            if not statement.arg_name:
                name = f"{statement.scope}/{statement.selector}" if statement.scope else statement.selector
                set_by[name] = describe_binding(binding)
    if not set_by:
        return
    used = referenced_macros() | set(read_macros)
    unknown = [name for name in set_by if name not in used]
    if not unknown:
        return
    known = sorted((used | defined_macros()) - set(unknown))
    lines = []
    for name in unknown:
        close = _closest(name, known)
        hint = f"Closest: {', '.join(close)}" if close else "No similar macro is known"
        lines.append(f"unknown gin macro {name} (set by {set_by[name]}): no config refers to it. {hint}")
    raise GinConfigError("\n".join(lines))


# ---- bound values against the parameters' annotated types ----------------------------------------

_SIMPLE_NAMES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool, "None": type(None)}


def simple_types(annotation: Any) -> tuple[type, ...] | None:
    """The types of an annotation made only of int, float, str, bool and None; else None.

    Takes annotations as objects or as strings (``from __future__ import annotations``).
    """
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        text = annotation.replace(" ", "").replace("typing.", "")
        if match := re.fullmatch(r"Optional\[(.+)\]", text):
            parts = [*match.group(1).split("|"), "None"]
        elif match := re.fullmatch(r"Union\[(.+)\]", text):
            parts = match.group(1).split(",")
        else:
            parts = text.split("|")
        if not parts or any(p not in _SIMPLE_NAMES for p in parts):
            return None
        return tuple(_SIMPLE_NAMES[p] for p in parts)
    if annotation is None:
        return (type(None),)
    if annotation in (int, float, str, bool):
        return (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        if all(m in (int, float, str, bool, type(None)) for m in members):
            return tuple(members)
    return None


def _fits(value: Any, allowed: tuple[type, ...]) -> bool:
    if value is None:
        return type(None) in allowed
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int):
        return int in allowed or float in allowed
    if isinstance(value, float):
        return float in allowed
    if isinstance(value, str):
        return str in allowed
    return False


def _type_names(allowed: tuple[type, ...]) -> str:
    names = [t.__name__ for t in allowed if t is not type(None)]
    optional = " or None" if type(None) in allowed else ""
    return " or ".join(names) + optional


_UNRESOLVED = object()


def _literal_value(value: Any, chain: list[str]) -> Any:
    """A bound value with macros followed to their literal (``_UNRESOLVED`` for other references)."""
    seen = set()
    while (name := _macro_name(value)) is not None:
        if name in seen:
            return _UNRESOLVED
        seen.add(name)
        chain.append(name)
        value = gin.config._CONFIG.get((name, "gin.macro"), {}).get("value", _UNRESOLVED)
    if isinstance(value, gin.config.ConfigurableReference):
        return _UNRESOLVED
    return value


def check_value_types(bindings: Sequence[str] = ()) -> None:
    """Checks each bound literal against the annotation of its parameter, where that is a simple type.

    Values bound through macros are followed to the macro's value; references
    to configurables (``@name()``) and ``%gin.REQUIRED`` are not checked.

    Raises:
      GinConfigError: naming the parameter, the expected type, the value, and
        the macro and flag it came from.
    """
    flag_of: dict[tuple[str, str, str], str] = {}
    macro_flag: dict[str, str] = {}
    for binding in bindings:
        for statement in _statements(binding):
            if not statement.arg_name:
                name = f"{statement.scope}/{statement.selector}" if statement.scope else statement.selector
                macro_flag[name] = describe_binding(binding)
                continue
            try:
                match = gin.config._REGISTRY.get_match(statement.selector)
            except (ValueError, KeyError):
                match = None
            if match is not None:
                flag_of[(statement.scope, match.selector, statement.arg_name)] = describe_binding(binding)
    problems = []
    for (scope, selector), params in list(gin.config._CONFIG.items()):
        if selector in ("gin.macro", "gin.constant"):
            continue
        configurable = gin.config._REGISTRY.get_match(selector)
        if configurable is None:
            continue
        try:
            signature = inspect.signature(configurable.wrapped)
        except (TypeError, ValueError):
            continue
        for param, bound in params.items():
            parameter = signature.parameters.get(param)
            allowed = simple_types(parameter.annotation) if parameter is not None else None
            if allowed is None:
                continue
            chain: list[str] = []
            value = _literal_value(bound, chain)
            if value is _UNRESOLVED or _fits(value, allowed):
                continue
            shown = selector.removeprefix("t5x.")  # as gin files name it: launch.train, models.T5Config
            key = f"{scope}/{shown}.{param}" if scope else f"{shown}.{param}"
            origin = ""
            if chain:
                flag = next((macro_flag[m] for m in reversed(chain) if m in macro_flag), None)
                origin = f" (from the macro {chain[-1]}" + (f", set by {flag})" if flag else ")")
            elif (scope, selector, param) in flag_of:
                origin = f" (set by {flag_of[(scope, selector, param)]})"
            problems.append(
                f"{key} expects {_type_names(allowed)}, got {value!r} ({type(value).__name__}){origin}"
            )
    if problems:
        raise GinConfigError("wrong value type:\n" + "\n".join(f"  {p}" for p in problems))


def explain_gin_error(error: Exception) -> GinConfigError:
    """Wraps an error gin raised while calling a configurable (e.g. a missing macro)."""
    return GinConfigError(_explain(error))


_BLOCK_HEADER = "# Parameters for "


def _split_config(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """A gin config string's import lines, and its ``# Parameters for X:`` blocks as (X, text)."""
    imports: list[str] = []
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith(_BLOCK_HEADER):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        elif line.startswith(("from ", "import ")):
            imports.append(line)
    return imports, [(b[0][len(_BLOCK_HEADER) :].rstrip(":"), "\n".join(b).rstrip()) for b in blocks]


def run_config_text() -> str:
    """``config.gin``'s text: the operative config, then the bindings the run set but never called.

    Gin's operative config holds only what was called. A training run that
    never decoded would otherwise drop the decoder's bindings (the demo's greedy
    ``temperature = 0.0``), and ``eval`` / ``infer`` / ``export`` reusing the
    file would decode differently from what the user configured.
    """
    operative = gin.operative_config_str()
    operative_imports, operative_blocks = _split_config(operative)
    full_imports, full_blocks = _split_config(gin.config_str())
    called = {name.rsplit("/", 1)[-1] for name, _ in operative_blocks}
    uncalled = [text for name, text in full_blocks if name.rsplit("/", 1)[-1] not in called]
    missing_imports = [line for line in full_imports if line not in operative_imports]
    if not uncalled and not missing_imports:
        return operative
    lines = operative.splitlines()
    at = max((i + 1 for i, line in enumerate(lines) if line in operative_imports), default=0)
    lines[at:at] = missing_imports
    extra = "\n\n".join(uncalled)
    note = "# Bound by the run's gin files but not called by it (kept for eval, infer and export):"
    return "\n".join(lines).rstrip() + ("\n\n" + note + "\n\n" + extra + "\n" if uncalled else "\n")


def write_config_gin(directory: pathlib.Path) -> pathlib.Path:
    """Writes this run's gin config (:func:`run_config_text`) as ``config.gin`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.gin"
    tmp = path.with_suffix(".gin.tmp")
    tmp.write_text(run_config_text())
    tmp.replace(path)
    return path
