"""No tracked file names a developer machine's paths or a work diary's numbering.

Users get the repository, not the machines it was written on: an absolute path of one
machine (its home or work folders, its peer interpreters) or the numbered entry labels
of a measurement diary mean nothing to them. Text files only; the patterns are
spelled in pieces so that this file does not match itself.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "an absolute developer-machine path": re.compile(r"(?<![\w.~-])/(?:" + "work|root|home" + r")/"),
    "a link to the steering folder": re.compile(r"\.\./" + "shared/"),
    "a diary number": re.compile(r"\b" + "session" + r"[- _]?\d+\b|\bnotes/s\d+\b", re.IGNORECASE),
    "a diary time of day": re.compile(r"\b\d{1,2}:\d{2}(?:[\u2013-]\d{1,2}:\d{2})? " + "UTC" + r"\b"),
}


def _tracked_files() -> list[pathlib.Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def _text(path: pathlib.Path) -> str | None:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):  # deleted in the working tree, or a submodule
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def test_no_tracked_file_names_machine_paths_or_diary_numbers():
    problems = []
    for path in _tracked_files():
        text = _text(path)
        if text is None:
            continue
        for line_number, line in enumerate(text.splitlines(), start=1):
            for what, pattern in FORBIDDEN.items():
                match = pattern.search(line)
                if match:
                    where = path.relative_to(ROOT)
                    problems.append(
                        f"{where}:{line_number}: {what} ({match.group(0)!r}): {line.strip()[:120]}"
                    )
    assert not problems, "tracked files mention machine paths or diary numbers:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "line, what",
    [
        ("--peer-python " + "/work" + "/peers/hf/bin/python", "an absolute developer-machine path"),
        ("cached under " + "/root" + "/.cache", "an absolute developer-machine path"),
        ("see [DESIGN](" + "../shared" + "/DESIGN.md)", "a link to the steering folder"),
        ("Latest run (" + "session" + " 10)", "a diary number"),
        ("the allocator (" + "Session" + "-7)", "a diary number"),
        ("02:37" + "\u201302:53 " + "UTC", "a diary time of day"),
    ],
)
def test_the_patterns_catch_what_they_are_for(line, what):
    assert FORBIDDEN[what].search(line)


@pytest.mark.parametrize(
    "line",
    [
        "python3 -m nox -s tests-vocabularies",
        "one nox session per package",
        "--gin.MODEL_DIR=/tmp/demo",
        "~/.cache/t5x",
        "gs://bucket/" + "work/x",
    ],
)
def test_ordinary_text_passes(line):
    assert not any(pattern.search(line) for pattern in FORBIDDEN.values())
