"""Checking a whole checkpoint against its checksums, without a model."""

from __future__ import annotations

import dataclasses
import os
import time

from t5x.checkpointing import _format, _integrity, _manifest, _reader
from t5x.checkpointing._errors import CheckpointIntegrityError

_LISTED_PROBLEMS = 20


@dataclasses.dataclass(frozen=True)
class VerificationReport:
    """What :func:`verify_checkpoint` checked; ``str(report)`` is a short printable summary.

    Attributes:
      step_dir: the step folder checked.
      step: its step number (None when the folder name does not say).
      layout: ``"t5x"`` (msgpack index + zarr) or ``"orbax"``.
      arrays: arrays read in full (each decoded chunk by chunk).
      verified: arrays whose every chunk matched its recorded checksum.
      unverified: arrays read and decoded but with no checksums to compare
        (upstream T5X's checkpoints, ours from before checksums, Orbax's).
      chunks: chunks compared with a checksum.
      bytes: decoded bytes read.
      files: other files compared with a checksum (index, input states).
      inline: values stored inside the index (covered by the index's checksum).
      seconds: wall time.
    """

    step_dir: str
    step: int | None
    layout: str
    arrays: int
    verified: int
    unverified: int
    chunks: int
    bytes: int
    files: int
    inline: int
    seconds: float

    @property
    def fully_verified(self) -> bool:
        """Every array was compared with checksums (False for checkpoints without them)."""
        return self.unverified == 0

    def __str__(self) -> str:
        head = f"{self.step_dir} (step {self.step}, {self.layout} layout): "
        arrays = f"{_count(self.arrays, 'array')} ({_count(self.chunks, 'chunk')}, {_size(self.bytes)})"
        if self.fully_verified:
            return (
                head + f"OK: {arrays} and {_count(self.files, 'file')} match their "
                f"{_manifest.ALGORITHM} checksums, {_count(self.inline, 'value')} inline in the index "
                f"({self.seconds:.2f} s)"
            )
        return (
            head + f"UNVERIFIED: no {_manifest.MANIFEST_FILE} (written by upstream T5X, Orbax or "
            f"before checksums); {_count(self.arrays, 'array')} ({_size(self.bytes)}) read and decoded, "
            f"{self.verified} verified, {self.unverified} not ({self.seconds:.2f} s)"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def verify_checkpoint(path: str | os.PathLike[str], step: int | None = None) -> VerificationReport:
    """Checks a checkpoint's files against its checksums, without building a model.

    Every array folder must exist and resolve inside the step folder (links
    included); its ``.zarray`` must equal the one recorded at save and agree with
    the index's shape and dtype; every recorded chunk file must exist, decode
    and match its checksum; the index and the input-state files must match
    theirs. Arrays are read chunk by chunk (memory stays small). A checkpoint
    without checksums is still read through (every chunk must decode) and
    reported as unverified rather than refused.

    Args:
      path: a model folder (then ``step``, or the latest step), a step folder
        (either layout) or its ``checkpoint`` index file.
      step: the step to check in a model folder.

    Returns:
      A :class:`VerificationReport` (printable).

    Raises:
      FileNotFoundError: no checkpoint at ``path``.
      CheckpointIntegrityError: the problems found: its message is the one
        problem, or a count and a list (one line each); ``problems`` holds them all.
    """
    start = time.perf_counter()
    step_dir, found_step = _reader.locate(os.fspath(path), step)
    problems: list[CheckpointIntegrityError] = []
    quiet, _integrity.quiet = _integrity.quiet, True  # the report says it instead
    try:
        sources = _reader.read_sources(step_dir, verify=True, problems=problems)
    finally:
        _integrity.quiet = quiet
    layout = "t5x" if os.path.isfile(os.path.join(step_dir, _format.INDEX_FILE)) else "orbax"
    files = 0
    manifest = _manifest.load_manifest(step_dir) if layout == "t5x" else None
    if manifest is not None:
        files = 1  # the index: compared by read_sources
        for name in sorted(manifest.files):
            if name == _format.INDEX_FILE:
                continue
            file_path = os.path.join(step_dir, name)
            try:
                with open(file_path, "rb") as handle:
                    data = handle.read()
                manifest.check_file(name, data, file_path, required=True)
                files += 1
            except FileNotFoundError:
                problems.append(
                    CheckpointIntegrityError(
                        f"{file_path} is missing (recorded in {manifest.path})", path=file_path
                    )
                )
            except CheckpointIntegrityError as error:
                problems.append(error)
    arrays = verified = unverified = chunks = nbytes = inline = 0
    for source in sources.values():
        if not isinstance(source, _reader.LazyArray):
            continue
        if source.stored_inline:
            inline += 1
            continue
        problem = source.metadata_problem()
        if problem is not None:
            problems.append(problem)
            continue
        try:
            checked, size = source.read_chunkwise()
        except CheckpointIntegrityError as error:
            problems.append(error)
            continue
        except Exception as error:  # unverified layouts: a read failure is still damage
            problems.append(
                CheckpointIntegrityError(
                    f"{source.name}: cannot read its array in {step_dir}: {error}", name=source.name
                )
            )
            continue
        arrays += 1
        chunks += checked
        nbytes += size
        if source.verifies_chunks:
            verified += 1
        else:
            unverified += 1
    if problems:
        if len(problems) == 1:
            raise problems[0]
        listed = "\n".join(f"  - {problem}" for problem in problems[:_LISTED_PROBLEMS])
        more = (
            f"\n  ... and {len(problems) - _LISTED_PROBLEMS} more" if len(problems) > _LISTED_PROBLEMS else ""
        )
        summary = CheckpointIntegrityError(
            f"{len(problems)} problems in {step_dir}:\n{listed}{more}", path=step_dir
        )
        summary.problems = problems
        raise summary
    return VerificationReport(
        step_dir=step_dir,
        step=found_step,
        layout=layout,
        arrays=arrays,
        verified=verified,
        unverified=unverified,
        chunks=chunks,
        bytes=nbytes,
        files=files,
        inline=inline,
        seconds=time.perf_counter() - start,
    )
