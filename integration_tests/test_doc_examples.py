"""Every ```python example in the READMEs and docs/ runs.

Each block runs alone, as a user would paste it: in a fresh interpreter, in an empty
temporary folder, with a time limit. A block that cannot run on its own (it needs a
trained checkpoint, an accelerator, a cluster) is marked in the markdown by a comment on
the line before its fence, ``<!-- not-tested: why -->``; NOT_TESTED below must list
exactly those blocks, so that a new untested example is a visible decision.

The blocks start together (at most MAX_PARALLEL at a time) when the first test asks for
a result, because most of their time is interpreter and library start-up.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC_GLOBS = ("README.md", "packages/*/README.md", "docs/*.md")
TIMEOUT_S = 300
MAX_PARALLEL = 4

# (file, first line of the block's code) -> why it is not run. Keep in step with the markdown.
NOT_TESTED = {
    ("packages/tasks/README.md", "import t5x.tasks as tt"): "reads a cache built by `t5x-tasks cache`",
    ("packages/export/README.md", "import tensorflow as tf"): (
        "loads the SavedModel the block above writes (the export-tf session loads exports without JAX)"
    ),
}

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_NOT_TESTED = re.compile(r"<!--\s*not-tested:\s*(.*?)\s*-->")


@dataclasses.dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    code: str
    not_tested: str | None  # the reason given in the markdown

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def first_line(self) -> str:
        return next(line.strip() for line in self.code.splitlines() if line.strip())


def python_blocks(path: pathlib.Path) -> list[Block]:
    """The ```python blocks of one markdown file, with their not-tested marks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, language, start = fence.group(1), fence.group(2), i
        i += 1
        body = []
        while i < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[i]):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        if i == len(lines):
            raise AssertionError(f"{path}:{start + 1}: a code fence is never closed")
        i += 1
        if language != "python":
            continue
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        mark = _NOT_TESTED.search(lines[before]) if before >= 0 else None
        blocks.append(
            Block(
                path=str(path.relative_to(ROOT)),
                line=start + 1,
                code="\n".join(body) + "\n",
                not_tested=mark.group(1) if mark else None,
            )
        )
    return blocks


def all_blocks() -> list[Block]:
    files = sorted({p for pattern in DOC_GLOBS for p in ROOT.glob(pattern)})
    return [block for path in files for block in python_blocks(path)]


BLOCKS = all_blocks()
RUNNABLE = [b for b in BLOCKS if b.not_tested is None]


def _run(block: Block) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": "default"}
    env.pop("PYTHONPATH", None)  # the installed packages, not a source tree
    with tempfile.TemporaryDirectory(prefix="doc-example-") as cwd:
        script = pathlib.Path(cwd) / "example.py"
        script.write_text(block.code, encoding="utf-8")
        try:
            return subprocess.run(
                [sys.executable, str(script)],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            out = (
                (e.stdout or b"").decode(errors="replace")
                if isinstance(e.stdout, bytes)
                else (e.stdout or "")
            )
            return subprocess.CompletedProcess(e.cmd, -1, out, f"timed out after {TIMEOUT_S} s")


@pytest.fixture(scope="session")
def example_runs(request) -> Iterator[dict[str, concurrent.futures.Future]]:
    """Starts every selected example at once; each test then waits for its own."""
    selected = [item.callspec.params["block"] for item in request.session.items if _is_example(item)]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=MAX_PARALLEL)
    yield {block.id: pool.submit(_run, block) for block in selected}
    pool.shutdown(cancel_futures=True)


def _is_example(item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and isinstance(callspec.params.get("block"), Block)


@pytest.mark.slow  # together about 140 CPU-seconds: mostly importing TensorFlow / JAX and compiling
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_example_runs(block: Block, example_runs):
    result = example_runs[block.id].result()
    assert result.returncode == 0, (
        f"the python example at {block.id} failed (exit {result.returncode}):\n"
        f"--- code ---\n{block.code}--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-5000:]}"
    )


def test_untested_examples_are_the_listed_ones():
    marked = {(b.path, b.first_line): b.not_tested for b in BLOCKS if b.not_tested is not None}
    assert all(marked.values()), f"a not-tested mark gives no reason: {marked}"
    assert marked == NOT_TESTED, (
        "the <!-- not-tested: ... --> marks in the docs differ from NOT_TESTED in this file:\n"
        f"marked in the docs: {marked}\nlisted here: {NOT_TESTED}"
    )


def test_the_docs_have_examples():
    # Guards the extraction itself: the package READMEs carry runnable examples.
    assert len(RUNNABLE) >= 8, [b.id for b in RUNNABLE]


def test_extraction_reads_fences_and_marks(tmp_path, monkeypatch):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n```python\nprint(1)\n```\n\n<!-- not-tested: needs a TPU -->\n\n```python\nimport jax\n```\n"
        "```bash\nls\n```\n- item\n\n  ```python\n  x = 2\n  ```\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    blocks = python_blocks(doc)
    assert [(b.line, b.code, b.not_tested) for b in blocks] == [
        (2, "print(1)\n", None),
        (8, "import jax\n", "needs a TPU"),
        (16, "x = 2\n", None),
    ]
