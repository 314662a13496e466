"""The layering contracts of DESIGN §2 catch real violations.

The contracts in the root pyproject.toml are run by import-linter against a
copy of the packages' sources renamed to a private top-level package (so the
installed `t5x` cannot mix in), first as they are, then with one deliberate
violation per contract kind.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROBE = "t5x_layering_probe"


def _copy_tree(tmp_path: pathlib.Path) -> pathlib.Path:
    target = tmp_path / PROBE
    for src in sorted(ROOT.glob("packages/*/src/t5x/*")):
        if src.is_dir():
            shutil.copytree(src, target / src.name, ignore=shutil.ignore_patterns("__pycache__"))
    for module in target.rglob("*.py"):
        module.write_text(re.sub(r"\bt5x\.", f"{PROBE}.", module.read_text()))
    config = (ROOT / "pyproject.toml").read_text()
    start = config.index("[tool.importlinter]")
    (tmp_path / "layers.toml").write_text(re.sub(r"\bt5x\b", PROBE, config[start:]))
    return target


def _lint(tmp_path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    lint_imports = pathlib.Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(lint_imports), str(tmp_path / "layers.toml"), "--no-cache"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def probe(tmp_path):
    return _copy_tree(tmp_path), tmp_path


def test_the_real_tree_keeps_every_contract(probe):
    _, tmp_path = probe
    result = _lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("package", "statement", "contract"),
    [
        ("vocabularies", "import jax", "Data packages never import JAX, Flax or Optax"),
        ("feature_converters", "import optax", "Data packages never import JAX, Flax or Optax"),
        ("interfaces", f"import {PROBE}.vocabularies", "Packages are layered as DESIGN §2 says"),
        ("models", f"import {PROBE}.partitioning", "Packages are layered as DESIGN §2 says"),
        ("models", f"import {PROBE}.tasks", "Packages depend only on the siblings DESIGN §2 allows"),
        ("training", f"import {PROBE}.models", "Training knows models and data only through t5x.interfaces"),
        (
            "launch",
            f"import {PROBE}.tasks._cli",
            "A package's private modules are imported only from inside it",
        ),
    ],
)
def test_a_deliberate_violation_breaks_its_contract(probe, package, statement, contract):
    target, tmp_path = probe
    if not (target / package).exists():
        pytest.fail(f"package {package} is missing from the tree")
    (target / package / "_violation.py").write_text(statement + "\n")
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout
    expected = re.sub(r"\bt5x\b", PROBE, contract)
    assert f"{expected} BROKEN" in result.stdout


# import-linter sees the packages' sources only. tools/ runs against them too, so the same rule
# is checked here by reading the import statements (lazy ones inside functions included).
# Benchmarks that time one package's internals on purpose are listed with what they time.
_PRIVATE_IMPORT = re.compile(r"^\s*(?:from|import)\s+t5x\.(\w+)\.(_\w+)", re.MULTILINE)
_BENCHMARKED_INTERNALS = {
    ("tools/bench_checkpoint.py", "checkpointing._integrity"): "the checksum's cost per chunk",
    ("tools/bench_checkpoint.py", "checkpointing._specs"): "chunk shapes and compressor settings",
    ("tools/bench_decode.py", "models._attention"): "a decoding step's attention to the KV cache alone",
    ("tools/bench_decode.py", "models._cpu_kernels"): "the CPU decode kernels one by one",
    ("tools/bench_decode.py", "models._joined"): "the joined decode kernels",
}


def _private_imports() -> dict[tuple[str, str], int]:
    """(file, package._module) -> line, for every import of another package's private module."""
    found: dict[tuple[str, str], int] = {}
    files = [*ROOT.glob("tools/*.py"), *ROOT.glob("packages/*/src/t5x/**/*.py")]
    for path in sorted(files):
        relative = path.relative_to(ROOT).as_posix()
        # The package is t5x.<name>, as the pattern reads it: the folder (or module) under t5x/.
        parts = path.relative_to(ROOT).parts
        owner = pathlib.Path(parts[4]).stem if relative.startswith("packages/") else None
        text = path.read_text()
        for match in _PRIVATE_IMPORT.finditer(text):
            package, module = match.groups()
            if package != owner:
                found.setdefault((relative, f"{package}.{module}"), text.count("\n", 0, match.start()) + 1)
    return found


def test_no_tool_or_package_imports_another_packages_private_modules():
    found = _private_imports()
    unexpected = {key: line for key, line in found.items() if key not in _BENCHMARKED_INTERNALS}
    assert not unexpected, "import the public names instead: " + ", ".join(
        f"{path}:{line} imports t5x.{module}" for (path, module), line in sorted(unexpected.items())
    )
    stale = sorted(set(_BENCHMARKED_INTERNALS) - set(found))
    assert not stale, f"no longer imported, remove from _BENCHMARKED_INTERNALS: {stale}"


def test_the_private_import_scan_finds_a_violation(tmp_path, monkeypatch):
    package = tmp_path / "packages" / "launch" / "src" / "t5x" / "launch"
    package.mkdir(parents=True)
    (package / "_own.py").write_text("from t5x.launch._cli import main\n")  # its own: fine
    (package / "_other.py").write_text("def f():\n    from t5x.tasks._cli import main\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "bench_x.py").write_text(
        '"""Uses `t5x.tasks._cli` (prose)."""\nimport t5x.models._x\n'
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert _private_imports() == {
        ("packages/launch/src/t5x/launch/_other.py", "tasks._cli"): 2,
        ("tools/bench_x.py", "models._x"): 2,
    }
