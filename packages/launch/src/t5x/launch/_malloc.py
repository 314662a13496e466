"""Transparent huge pages for the jobs' large buffers (glibc's ``malloc.hugetlb`` tunable).

XLA:CPU allocates every large buffer of a step afresh, and glibc serves each with a new
``mmap``: the step then pays a page fault per 4 KiB the first time it writes there. On the
2-core Xeon here that is ~0.3 s per GiB, and a float32 DEC-S training step writes several
GiB of fresh buffers (a ``[4096, 32128]`` logits array alone is 0.5 GiB): 12.3-12.4 s per
step with 4 KiB pages, 9.4-10.9 s with ``glibc.malloc.hugetlb=1`` (glibc >= 2.35 then asks
the kernel for 2 MiB pages on those mappings). PyTorch's step was no faster with it.

glibc reads tunables once, when the process starts, so the launcher re-executes itself
with the tunable set. A user's own ``glibc.malloc.hugetlb`` setting (e.g. ``=0``) wins.
"""

from __future__ import annotations

import os
import pathlib
import platform
import sys
from collections.abc import MutableMapping, Sequence

TUNABLE = "glibc.malloc.hugetlb"
_THP_MODE = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


def hugepages_supported() -> bool:
    """Whether this is Linux with glibc >= 2.35 and transparent huge pages not turned off."""
    if sys.platform != "linux":
        return False
    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(int(part) for part in version.split(".")[:2]) < (2, 35):
        return False
    try:
        return "[never]" not in _THP_MODE.read_text()
    except OSError:
        return False


def add_malloc_defaults(environ: MutableMapping[str, str]) -> bool:
    """Adds ``glibc.malloc.hugetlb=1`` to ``environ["GLIBC_TUNABLES"]`` unless it names that tunable.

    Returns:
      Whether ``environ`` changed.
    """
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(entry.split("=", 1)[0] == TUNABLE for entry in tunables.split(":")):
        return False
    environ["GLIBC_TUNABLES"] = ":".join(filter(None, [tunables, f"{TUNABLE}=1"]))
    return True


def restart_with_malloc_defaults(orig_argv: Sequence[str] | None = None) -> None:
    """Re-executes this process with :func:`add_malloc_defaults` when that changes anything.

    Call it first thing in a program's entry point, before any thread starts: it replaces
    the process (same PID, same open files) and does not return when it re-executes.

    Args:
      orig_argv: the command line to run again (default ``sys.orig_argv``: the interpreter,
        its options, then the script or ``-m module`` and its arguments).
    """
    if not hugepages_supported():
        return
    environ = dict(os.environ)
    if not add_malloc_defaults(environ):
        return
    command = list(sys.orig_argv if orig_argv is None else orig_argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *command[1:]], environ)
