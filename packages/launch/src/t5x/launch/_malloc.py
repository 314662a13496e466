"""glibc malloc settings for XLA:CPU jobs: huge pages, and freed buffers kept for the next step.

Only for jobs on JAX's CPU backend (:func:`t5x.launch.job_runs_on_cpu`): on a TPU or GPU the
steps' buffers live in the device's memory, and the host process keeps glibc's defaults.

XLA:CPU allocates a step's large buffers afresh every step and frees them at its end. By
default glibc serves each large buffer with its own ``mmap`` and returns it with ``munmap``, so
every step the kernel hands out, and zeroes, several GiB of fresh pages (a float32 DEC-S
training step: ~6 GiB, 1.6 M page faults). The defaults:

- ``glibc.malloc.hugetlb=1`` (glibc >= 2.35) asks for 2 MiB pages: 65 k faults instead of
  1.6 M, DEC-S 12.3-12.4 s -> 9.4-10.9 s per step on the 2-core Xeon here.
- ``arena_max=1``, an unbounded ``trim_threshold`` and an ``mmap_threshold`` of 256 MiB serve
  every buffer below 256 MiB from the main heap and never give that memory back, so from the
  second step on a step reuses the pages of the one before. ``arena_max=1`` is needed because
  XLA allocates part of a step's buffers on its worker threads, and a thread's own arena maps
  any buffer over 64 MiB afresh (a jitted 4096^2 float32 program: 16 512 faults per call by
  default, 738 with huge pages, 9 keeping its 64 MiB buffers).
- Buffers of 256 MiB and more (above all the one block XLA allocates for a step's temporaries:
  DEC-S at 512 tokens 3.5 GiB, ENCDEC-S 0.9 GiB) are mapped afresh and given back each step.
  Kept on the heap as well (``mmap_max=0``, the earlier default), a step's block no longer fit
  the hole the last one left once small allocations had split it, and the heap grew by a second
  block: DEC-S peak resident 7.8 GiB instead of 4.3, ENCDEC-S 2.6 instead of 1.8 (the PyTorch
  peer: 4.6 / 2.1). Mapping the block afresh costs the time the kernel takes to zero its pages:
  DEC-S 7.5 s per step instead of 6.5, ENCDEC-S 2.0 s instead of 1.9.

The job's own input pipeline (tf.data, many threads) runs in the same process; with one arena
it did not get slower (ENCDEC-S's span-corruption pipeline used less CPU per token, not more;
seqio's own pipeline, measured as a peer, ran 2x slower, which is why benchmark peers get
:func:`user_environment`). docs/benchmarks.md ("Launcher defaults") has the figures.

glibc reads tunables once, when the process starts, so the launcher re-executes itself with
them set. Each tunable the user already set (e.g. ``glibc.malloc.hugetlb=0``,
``glibc.malloc.arena_max=8`` for more arenas, or ``glibc.malloc.mmap_max=0`` to keep every
buffer, the fastest steps for the most memory) keeps its value.
"""

from __future__ import annotations

import os
import pathlib
import platform
import sys
from collections.abc import Mapping, MutableMapping, Sequence

from t5x.launch._platform import job_runs_on_cpu

HUGEPAGES = "glibc.malloc.hugetlb"
# Where add_malloc_defaults keeps the user's own GLIBC_TUNABLES, for user_environment.
USER_TUNABLES = "T5X_USER_GLIBC_TUNABLES"
# Tunable -> value, added in this order unless the user named the tunable.
DEFAULTS = {
    HUGEPAGES: "1",
    "glibc.malloc.arena_max": "1",
    "glibc.malloc.mmap_threshold": str(256 << 20),
    "glibc.malloc.trim_threshold": str(2**63 - 1),
}
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
    """Appends each of :data:`DEFAULTS` to ``environ["GLIBC_TUNABLES"]`` that it does not name.

    The first time it changes ``environ`` it keeps the previous value (empty if unset) in
    ``T5X_USER_GLIBC_TUNABLES``.

    Returns:
      Whether ``environ`` changed.
    """
    tunables = environ.get("GLIBC_TUNABLES", "")
    named = {entry.split("=", 1)[0] for entry in tunables.split(":")}
    missing = [f"{name}={value}" for name, value in DEFAULTS.items() if name not in named]
    if not missing:
        return False
    environ.setdefault(USER_TUNABLES, tunables)
    environ["GLIBC_TUNABLES"] = ":".join(filter(None, [tunables, *missing]))
    return True


def user_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``environ`` (default ``os.environ``) with ``GLIBC_TUNABLES`` as the user set it.

    For programs that should run as they would outside ``t5x-launch``, such as a benchmark's
    peer: ``arena_max=1`` suits XLA but made seqio's multi-threaded pipeline 2x slower.
    """
    env = dict(os.environ if environ is None else environ)
    if USER_TUNABLES in env:
        user = env.pop(USER_TUNABLES)
        if user:
            env["GLIBC_TUNABLES"] = user
        else:
            env.pop("GLIBC_TUNABLES", None)
    return env


def restart_with_malloc_defaults(orig_argv: Sequence[str] | None = None) -> None:
    """Re-executes this process with :func:`add_malloc_defaults` when that changes anything.

    Only for a job on the CPU backend (:func:`t5x.launch.job_runs_on_cpu`) on Linux with
    glibc >= 2.35. Call it first thing in a program's entry point, before any thread starts: it replaces
    the process (same PID, same open files) and does not return when it re-executes.

    Args:
      orig_argv: the command line to run again (default ``sys.orig_argv``: the interpreter,
        its options, then the script or ``-m module`` and its arguments).
    """
    if not hugepages_supported() or not job_runs_on_cpu(os.environ):
        return  # TPU and GPU jobs keep glibc's defaults: their steps' buffers live on the device
    environ = dict(os.environ)
    if not add_malloc_defaults(environ):
        return
    command = list(sys.orig_argv if orig_argv is None else orig_argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *command[1:]], environ)
