"""Runs a job on every worker of a Cloud TPU VM pod with gcloud."""

from __future__ import annotations

import pathlib
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence


def source_root(explicit: str | None = None) -> pathlib.Path:
    """The checkout whose ``packages/`` are copied to the workers.

    Raises:
      FileNotFoundError: neither ``explicit`` nor the checkout holding this file has
        a ``packages/`` folder.
    """
    candidates = [pathlib.Path(explicit)] if explicit else list(pathlib.Path(__file__).resolve().parents)
    for candidate in candidates:
        if (candidate / "packages" / "launch" / "pyproject.toml").exists():
            return candidate
    where = explicit or "the folders above the installed t5x.launch"
    raise FileNotFoundError(
        f"no t5x checkout (a folder with packages/launch/pyproject.toml) at {where}; pass --source=CHECKOUT"
    )


def tpu_commands(
    job_args: Sequence[str],
    *,
    tpu: str,
    zone: str,
    project: str | None = None,
    source: pathlib.Path,
    archive: pathlib.Path,
    jax_requirement: str = "jax[tpu]",
) -> list[list[str]]:
    """The commands that copy, install and run ``t5x-launch <job_args>`` on all workers.

    Every worker runs the same command and joins JAX's multi-controller runtime,
    which finds the pod's other workers by itself on TPU VMs.
    """
    if not job_args:
        raise ValueError("no job given: use `t5x-launch tpu --tpu=NAME --zone=ZONE -- train ...`")
    where = [f"--zone={zone}", *([f"--project={project}"] if project else []), "--worker=all"]
    remote_archive = "t5x-job.tgz"
    remote = " && ".join(
        [
            "rm -rf t5x-job && mkdir -p t5x-job",
            f"tar -xzf {remote_archive} -C t5x-job",
            f"python3 -m pip install -q {shlex.quote(jax_requirement)} t5x-job/packages/*",
            # Each worker joins the pod's jax.distributed runtime (TPU auto-detection).
            shlex.join(["env", "T5X_AUTO_DISTRIBUTED=1", "python3", "-m", "t5x.launch", *job_args]),
        ]
    )
    return [
        ["tar", "-czf", str(archive), "-C", str(source), "--exclude=__pycache__", "packages"],
        ["gcloud", "compute", "tpus", "tpu-vm", "scp", str(archive), f"{tpu}:{remote_archive}", *where],
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu, *where, f"--command={remote}"],
    ]


def run_tpu(
    job_args: Sequence[str],
    *,
    tpu: str,
    zone: str,
    project: str | None = None,
    source: str | None = None,
    dry_run: bool = False,
) -> int:
    """Runs (or, with ``dry_run``, prints) the TPU pod commands; returns the exit code."""
    archive = pathlib.Path(tempfile.gettempdir()) / "t5x-job.tgz"
    commands = tpu_commands(
        job_args, tpu=tpu, zone=zone, project=project, source=source_root(source), archive=archive
    )
    for command in commands:
        print(shlex.join(command), flush=True)
        if dry_run:
            continue
        code = subprocess.call(command)
        if code:
            print(f"[t5x-launch tpu] command failed with exit code {code}: {command[0]} ...", file=sys.stderr)
            return code
    return 0
