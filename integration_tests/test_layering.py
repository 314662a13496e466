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
