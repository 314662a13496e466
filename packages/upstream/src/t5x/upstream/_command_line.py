"""Upstream's command lines (``python -m t5x.train ...``, ``python -m t5x.main --run_mode=...``) run by t5x-launch.

Upstream's binaries take absl flags; the gin flags (``--gin_file``,
``--gin_bindings``, ``--gin_search_paths``, ``--gin.NAME=VALUE``) mean the same to
``t5x-launch``, and the rest are translated: ``--tfds_data_dir`` and
``--seqio_additional_cache_dirs`` set where data is found, the multi-process GPU
flags set the process's place in the job, and logging flags are dropped (logs go to
the console). A flag with no meaning here is named, with exit code 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# run_mode (upstream's t5x/main.py) -> t5x-launch command
RUN_MODES = {"train": "train", "eval": "eval", "infer": "infer", "precompile": "precompile"}
_GIN_FLAGS = ("--gin_file", "--gin_bindings", "--gin_search_paths")
_LOGGING_FLAGS = (
    "--alsologtostderr",
    "--logtostderr",
    "--nologtostderr",
    "--noalsologtostderr",
    "--v",
    "--verbosity",
)
# upstream flag -> the environment variable t5x-launch reads
_ENV_FLAGS = {
    "--tfds_data_dir": "TFDS_DATA_DIR",
    "--coordinator_address": "T5X_COORDINATOR_ADDRESS",
    "--process_count": "T5X_NUM_PROCESSES",
    "--process_index": "T5X_PROCESS_ID",
}


class UpstreamFlagError(ValueError):
    """A flag of upstream's binaries that ``t5x-launch`` has no equivalent for."""


def _split(arg: str, rest: list[str]) -> tuple[str, str | None]:
    """``--name=value`` or ``--name value`` (the value taken from ``rest``); a boolean flag has None."""
    name, eq, value = arg.partition("=")
    if eq:
        return name, value
    if name in (
        *_GIN_FLAGS,
        *_ENV_FLAGS,
        "--seqio_additional_cache_dirs",
        "--run_mode",
        "--v",
        "--verbosity",
    ):
        if not rest:
            raise UpstreamFlagError(f"{name} needs a value")
        return name, rest.pop(0)
    return name, None


def translate(argv: Sequence[str], command: str | None) -> tuple[list[str], dict[str, str], list[str]]:
    """``(t5x-launch arguments, environment to set, seqio cache folders)`` for upstream's ``argv``.

    ``command`` is the binary's (``train`` for ``t5x.train``), None for ``t5x.main``,
    whose ``--run_mode`` names it.

    Raises:
      UpstreamFlagError: an unknown flag, a missing value or a missing or unknown run mode.
    """
    rest, launch_args, env, cache_dirs = list(argv), [], {}, []
    while rest:
        arg = rest.pop(0)
        if arg.startswith("--gin.") or not arg.startswith("--"):
            if not arg.startswith("--"):
                raise UpstreamFlagError(f"unexpected argument {arg!r} (upstream's binaries take flags only)")
            launch_args.append(arg)
            continue
        name, value = _split(arg, rest)
        if name in _GIN_FLAGS:
            launch_args.append(f"{name}={value}")
        elif name in _ENV_FLAGS:
            env[_ENV_FLAGS[name]] = str(value)
        elif name == "--seqio_additional_cache_dirs":
            cache_dirs += [d for d in str(value).split(",") if d]
        elif name == "--run_mode":
            command = str(value).lower()
        elif name in ("--multiprocess_gpu", "--nomultiprocess_gpu") or name in _LOGGING_FLAGS:
            continue  # the process flags alone say it; logs go to the console
        else:
            raise UpstreamFlagError(
                f"unknown flag {name}: t5x-launch takes upstream's gin flags (--gin_file, --gin_bindings, "
                "--gin_search_paths, --gin.NAME=VALUE), --tfds_data_dir, --seqio_additional_cache_dirs and "
                "the multi-process flags"
            )
    if command is None:
        raise UpstreamFlagError(f"--run_mode is required: one of {sorted(RUN_MODES)}")
    if command not in RUN_MODES:
        raise UpstreamFlagError(f"--run_mode={command!r}: expected one of {sorted(RUN_MODES)}")
    return [RUN_MODES[command], *launch_args], env, cache_dirs


def run(command: str | None) -> int:
    """Runs this process's upstream command line as ``t5x-launch`` (see the module docstring)."""
    from t5x.launch.cli import main

    try:
        launch_args, env, cache_dirs = translate(sys.argv[1:], command)
    except UpstreamFlagError as error:
        program = f"t5x.{command}" if command else "t5x.main"
        print(f"python -m {program}: {error}", file=sys.stderr, flush=True)
        return 2
    os.environ.update(env)
    if cache_dirs:
        from t5x import seqio

        seqio.add_global_cache_dirs(cache_dirs)
    sys.argv = ["t5x-launch", *launch_args]
    return main()
