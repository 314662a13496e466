"""Which errors are the user's to fix, and how ``t5x-launch`` words them.

An expected user error (a wrong flag, gin binding, path, task name, bad data or
a damaged checkpoint) is reported as one message and exit code 2; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import re
import sys

# Errors of the environment the user must fix, not bugs: a full, read-only or over-quota disk.
_ENVIRONMENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM}
)
# Errors other packages define, looked up only where their module is already imported: an error
# cannot come from a module nobody imported, and classifying must not import TensorFlow or JAX.
_KNOWN_ELSEWHERE = (
    ("t5x.tasks", "DataSourceError"),
    ("t5x.tasks", "UnknownNameError"),
    ("t5x.checkpointing", "CorruptIndexError"),
    ("t5x.checkpointing", "UnsafeSpecError"),
    ("t5x.checkpointing", "CheckpointIntegrityError"),
    ("t5x.checkpointing", "HfFolderError"),
    ("t5x.partitioning", "MeshError"),
)
# gin appends where a configurable was called from; that says nothing to the user.
_GIN_CALL_NOTE = re.compile(r"\n\s*In call to configurable '[^']*' \([^)]*\)")


class UserError(Exception):
    """A mistake in what the user asked for or gave (flags, config, paths, data, checkpoints).

    ``t5x-launch`` prints its message without a traceback and exits with code 2.
    Raise it (or a subclass) for failures the user can fix by changing their
    input; other exceptions are treated as bugs.
    """


class ConfigurationError(UserError, ValueError):
    """Components that each build but do not fit together (e.g. a task's vocabulary and the model's)."""


def _known_types() -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = [UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError]
    for module_name, name in _KNOWN_ELSEWHERE:
        module = sys.modules.get(module_name)
        cls = getattr(module, name, None) if module is not None else None
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def is_user_error(error: BaseException) -> bool:
    """True for the errors ``t5x-launch`` reports as one message (exit code 2)."""
    if isinstance(error, _known_types()):
        return True
    return isinstance(error, OSError) and error.errno in _ENVIRONMENT_ERRNOS


def user_error_message(error: BaseException) -> str:
    """The message of an expected error, without gin's call-site note or a KeyError's quotes."""
    from t5x.launch._gin_config import GinConfigError

    text = _GIN_CALL_NOTE.sub("", str(error)).strip()
    if isinstance(error, KeyError) and text[:1] in "'\"" and text[:1] == text[-1:]:
        # str() of a KeyError is the repr of its key (a message, for the errors counted here).
        with contextlib.suppress(ValueError, SyntaxError):
            text = str(ast.literal_eval(text))
    text = text or type(error).__name__
    if isinstance(error, GinConfigError):
        return f"gin configuration error:\n{text}"
    return text
