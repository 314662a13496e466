"""Test, lint and benchmark sessions for the t5x monorepo.

Every folder ``packages/<name>/`` with a ``pyproject.toml`` gets a session
``tests-<name>`` that builds a fresh environment holding only that package, the
sibling packages it declares, and its ``test`` extra, then runs its tests. A new
package needs no change here.

``python3 -m nox`` runs the default sessions (everything CI runs);
``python3 -m nox -l`` lists them all.
"""

from __future__ import annotations

import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import nox

ROOT = pathlib.Path(__file__).parent
PACKAGES_DIR = ROOT / "packages"
MIN_PYTHON = (3, 12)

os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")  # use an interpreter on this machine
nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    major, minor = out.split()
    return int(major), int(minor)


def find_python() -> str:
    """Finds a Python >= 3.12: $T5X_PYTHON, then PATH, then pyenv and uv installs."""
    candidates = [os.environ.get("T5X_PYTHON", "")]
    # The oldest supported minor first: it is the one the whole dependency set is released for.
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in (12, 13, 14)]
    pyenv_root = os.environ.get("PYENV_ROOT", str(pathlib.Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{pyenv_root}/versions/3.1[2-9]*/bin/python3"))
    candidates += sorted(
        glob.glob(str(pathlib.Path.home() / ".local/share/uv/python/cpython-3.1[2-9]*/bin/python3"))
    )
    candidates.append(sys.executable)
    for candidate in filter(None, candidates):
        version = _version_of(candidate)
        if version and version >= MIN_PYTHON:
            return candidate
    raise RuntimeError(
        "No Python >= 3.12 found (looked at $T5X_PYTHON, python3.1x on PATH, pyenv and uv installs). "
        "Install one, or point T5X_PYTHON at it."
    )


PYTHON = find_python()


def _dist_to_folder() -> dict[str, pathlib.Path]:
    folders = {}
    for pyproject in sorted(PACKAGES_DIR.glob("*/pyproject.toml")):
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        folders[name] = pyproject.parent
    return folders


FOLDERS = _dist_to_folder()
PACKAGES = [folder.name for folder in FOLDERS.values()]


def _local_requirements(folder: pathlib.Path, extras: tuple[str, ...] = ()) -> set[pathlib.Path]:
    """The folders of the t5x packages `folder` needs, itself included, transitively."""
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in extras:
        requirements += project.get("optional-dependencies", {}).get(extra, [])
    needed = {folder}
    for requirement in requirements:
        dist = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")
        if dist in FOLDERS and FOLDERS[dist] not in needed:
            needed |= _local_requirements(FOLDERS[dist])
    return needed


def install_packages(session: nox.Session, *names: str, extras: str = "test") -> None:
    """Installs the named packages (with an extra) and the sibling packages they need."""
    folders: set[pathlib.Path] = set()
    targets = []
    for name in names:
        folder = PACKAGES_DIR / name
        folders |= _local_requirements(folder, tuple(filter(None, extras.split(","))))
        targets.append(f"{folder}[{extras}]" if extras else str(folder))
    siblings = [str(f) for f in sorted(folders) if f.name not in names]
    session.install(*siblings, *targets)


def _make_tests_session(name: str):
    def tests(session: nox.Session) -> None:
        install_packages(session, name)
        # Run from the package folder against the *installed* package, not its source tree.
        session.run("pytest", str(PACKAGES_DIR / name / "tests"), "-p", "no:cacheprovider", *session.posargs)

    tests.__doc__ = f"Tests of t5x-{name.replace('_', '-')} alone, in a fresh environment."
    return tests


for _name in PACKAGES:
    nox.session(name=f"tests-{_name}", python=PYTHON)(_make_tests_session(_name))


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def types(session: nox.Session) -> None:
    """mypy over every package's source."""
    install_packages(session, *PACKAGES, extras="")
    session.install("mypy>=1.10")
    env = {"MYPYPATH": os.pathsep.join(str(PACKAGES_DIR / name / "src") for name in PACKAGES)}
    modules = [arg for name in PACKAGES for arg in ("-p", f"t5x.{name}")]
    session.run("mypy", *modules, env=env)


@nox.session(python=PYTHON)
def layers(session: nox.Session) -> None:
    """import-linter (DESIGN §2 layering) and deptry (declared dependencies) per package."""
    install_packages(session, *PACKAGES)
    session.install("import-linter>=2.0", "deptry>=0.20")
    session.run("lint-imports", str(ROOT / "pyproject.toml"))
    for name in PACKAGES:
        session.run(
            "deptry",
            str(PACKAGES_DIR / name),
            "--config",
            str(PACKAGES_DIR / name / "pyproject.toml"),
            *_deptry_namespace_args(name),
        )


def _deptry_namespace_args(name: str) -> list[str]:
    """deptry options that account for the shared `t5x` namespace.

    Every t5x distribution is imported as `t5x.<name>`. A package that declares
    t5x siblings maps them all to the module `t5x` (which siblings it may import
    is import-linter's job); one without siblings treats `t5x` as its own.
    """
    siblings = [dist for dist in FOLDERS if _declares(name, dist)]
    # Helper modules next to the tests (imported by name) are the package's own.
    first_party = sorted(path.stem for path in (PACKAGES_DIR / name / "tests").glob("*.py"))
    if not siblings:
        first_party.append("t5x")
    args = [arg for module in first_party for arg in ("--known-first-party", module)]
    if siblings:
        args += ["--package-module-name-map", ",".join(f"{dist}=t5x" for dist in siblings)]
    return args


def _declares(name: str, dist: str) -> bool:
    """Whether package `name` declares the t5x distribution `dist` (in any extra)."""
    project = tomllib.loads((PACKAGES_DIR / name / "pyproject.toml").read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return any(re.match(rf"{re.escape(dist)}\b(?!-)", r.lower().replace("_", "-")) for r in requirements)


@nox.session(python=PYTHON)
def integration(session: nox.Session) -> None:
    """End-to-end tests in integration_tests/ against every package installed together."""
    install_packages(session, *PACKAGES)
    session.install("import-linter>=2.0")
    session.run("pytest", str(ROOT / "integration_tests"), "-p", "no:cacheprovider", *session.posargs)


@nox.session(python=PYTHON)
def beam(session: nox.Session) -> None:
    """Offline caching with a real Apache Beam runner, in its own environment.

    Beam pins numpy and protobuf below what the other packages use, so it never
    shares an environment with them.
    """
    install_packages(session, "tasks", "seqio", extras="beam,test")
    session.run(
        "pytest",
        str(PACKAGES_DIR / "tasks" / "tests" / "test_beam_cache.py"),
        str(PACKAGES_DIR / "seqio" / "tests" / "test_beam_utils.py"),
        "-p",
        "no:cacheprovider",
        *session.posargs,
    )


@nox.session(name="export-tf", python=PYTHON)
def export_tf(session: nox.Session) -> None:
    """t5x-export's SavedModels loaded by plain TensorFlow, in an environment without JAX.

    A writer environment (t5x-export and its siblings, so JAX) writes the SavedModels and
    the JAX model's outputs; this session's own environment holds TensorFlow,
    tensorflow-text (which pins that same TensorFlow), NumPy and pytest only, and checks
    the served outputs against them.
    """
    writer = ROOT / ".nox" / "export-writer"
    if not (writer / "bin" / "python").exists():
        session.run("uv", "venv", "-q", "-p", PYTHON, str(writer), external=True)
    export = PACKAGES_DIR / "export"
    needed = _local_requirements(export)
    siblings = sorted(str(f) for f in needed if f != export)
    writer_python = str(writer / "bin" / "python")
    # The writer environment is kept between runs: the t5x packages are rebuilt from this tree each time.
    rebuild = [f"--reinstall-package={dist}" for dist, folder in FOLDERS.items() if folder in needed]
    install = ["uv", "pip", "install", "-q", "-p", writer_python, *rebuild]
    session.run(*install, *siblings, f"{export}[sentencepiece]", external=True)
    exports = pathlib.Path(session.create_tmp()).resolve() / "exports"
    shutil.rmtree(exports, ignore_errors=True)
    tests = PACKAGES_DIR / "export" / "tests_tf"
    session.run(writer_python, str(tests / "write_exports.py"), str(exports), external=True)
    session.install("tensorflow>=2.16", "tensorflow-text>=2.16", "numpy>=1.26", "pytest>=8")
    env = {"T5X_EXPORT_DIR": str(exports)}
    session.run("pytest", str(tests / "test_load.py"), "-p", "no:cacheprovider", *session.posargs, env=env)


def wheel_build_command(folder: pathlib.Path, out_dir: pathlib.Path, python: str = PYTHON) -> list[str]:
    """The PEP 517 build of one package: its sdist, then its wheel from that sdist, into ``out_dir``.

    hatchling builds from the package folder alone; requirements on siblings
    (``t5x-interfaces>=1.0,<2``) stay names, found in ``out_dir`` at install time.
    integration_tests/test_wheel_install.py runs the same command.
    """
    return ["uv", "build", "-q", "-p", python, "--out-dir", str(out_dir), str(folder)]


@nox.session(python=PYTHON, default=False)
def wheels(session: nox.Session) -> None:
    """Every package's wheel and sdist into dist/ (or the folder after --): see docs/installing.md."""
    out = pathlib.Path(session.posargs[0]).resolve() if session.posargs else ROOT / "dist"
    # Older builds of these distributions go first: the folder holds this tree's builds only.
    for dist in FOLDERS:
        stem = dist.replace("-", "_")
        for stale in [*out.glob(f"{stem}-*.whl"), *out.glob(f"{stem}-*.tar.gz")]:
            stale.unlink()
    for folder in FOLDERS.values():
        session.run(*wheel_build_command(folder, out), external=True)


@nox.session(python=PYTHON, default=False)
def demo(session: nox.Session) -> None:
    """The built-in demo: trains a tiny model on a synthetic task and reports its accuracy."""
    install_packages(session, "launch", extras="")
    session.run("t5x-launch", "train", *session.posargs)


@nox.session(python=PYTHON, default=False)
def seqio_compat(session: nox.Session) -> None:
    """Optional: compares ids and converter outputs with the real seqio (installed beside ours)."""
    peer = ROOT / ".nox" / "seqio-peer"
    if not (peer / "bin" / "python").exists():
        session.run("uv", "venv", "-q", "-p", PYTHON, str(peer), external=True)
    peer_python = str(peer / "bin" / "python")
    # seqio, t5 and tensorflow-text pull a second TensorFlow unless installed without their deps.
    session.run(
        "uv", "pip", "install", "-q", "-p", peer_python, "tensorflow", "jax", "sentencepiece", "absl-py",
        "numpy", "tensorflow-datasets", "pyglove", "editdistance", "clu", "babel", "immutabledict",
        "nltk", "rouge-score", "sacrebleu", "scikit-learn", "scipy", "gin-config", external=True,
    )  # fmt: skip
    session.run(
        "uv", "pip", "install", "-q", "-p", peer_python, "--no-deps", "seqio==0.0.20", "t5",
        "tensorflow-text", "mesh-tensorflow", external=True,
    )  # fmt: skip
    names = [n for n in ("vocabularies", "feature_converters", "tasks") if n in PACKAGES]
    install_packages(session, *names)
    for name in names:
        session.run(
            "pytest",
            str(PACKAGES_DIR / name / "tests"),
            "-p",
            "no:cacheprovider",
            env={"T5X_SEQIO_PYTHON": peer_python},
        )


@nox.session(python=PYTHON, default=False)
def hf_interop(session: nox.Session) -> None:
    """Optional: converts tiny `transformers` T5 models both ways and matches their logits.

    PyTorch and `transformers` live in their own environment (a CPU build of torch;
    set T5X_HF_PYTHON to reuse one), driven from the tests through a subprocess.
    """
    peer_python = os.environ.get("T5X_HF_PYTHON")
    if not peer_python:
        peer = ROOT / ".nox" / "hf-peer"
        peer_python = str(peer / "bin" / "python")
        if not pathlib.Path(peer_python).exists():
            session.run(sys.executable, "-m", "venv", str(peer), external=True)
        session.run(
            peer_python,
            "-m",
            "pip",
            "install",
            "-q",
            "torch==2.13.0",
            "transformers",
            "safetensors",
            external=True,
        )
    install_packages(session, "models")
    test = PACKAGES_DIR / "models" / "tests" / "test_hf_interop.py"
    session.run("pytest", str(test), "-p", "no:cacheprovider", env={"T5X_HF_PYTHON": peer_python})
    # `t5x-launch convert` end to end: these tests import torch themselves, so it joins this env.
    install_packages(session, "launch", extras="test,hf")
    session.install("torch==2.13.0", "transformers")
    test = PACKAGES_DIR / "launch" / "tests" / "test_convert_hf_interop.py"
    session.run("pytest", str(test), "-p", "no:cacheprovider")


@nox.session(python=PYTHON, default=False)
def lm_eval(session: nox.Session) -> None:
    """Optional: the lm-evaluation-harness adapter, run through lm-eval's own evaluator (offline)."""
    install_packages(session, "launch", extras="test,lm-eval")
    test = PACKAGES_DIR / "launch" / "tests" / "test_lm_eval.py"
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    session.run("pytest", str(test), "-p", "no:cacheprovider", *session.posargs, env=offline)


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks (not run by CI): every tools/bench_*.py, arguments passed through.

    ``nox -s bench -- --quick`` is the smoke test instead: the suite (tools/bench.py) and the
    scaling table (tools/bench_scaling.py) in their quick modes, without peers.
    """
    install_packages(session, *PACKAGES, extras="")
    if session.posargs == ["--quick"]:
        for script in ("bench.py", "bench_scaling.py"):
            session.run("python", str(ROOT / "tools" / script), "--quick")
        return
    for script in sorted((ROOT / "tools").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)
