"""``eval`` / ``infer`` on a trained model folder without its gin files: the run's own config.gin.

``t5x-launch train`` writes the run's whole configuration into ``config.gin``.
Given only ``--gin.CHECKPOINT_PATH`` (a model folder or one of its
``checkpoint_<step>`` folders), ``eval`` and ``infer`` parse that file first,
then their run file (``runs/eval.gin`` / ``runs/infer.gin``), then the
training run's task, lengths and partitioning again (the run file's defaults
for them must not win over what the model was trained on), then the user's
own bindings, which win over everything.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
from collections.abc import Sequence

from t5x.launch._errors import ConfigurationError
from t5x.launch._gin_config import GinConfigError, _statements

# What the trained model and its data are: carried from config.gin over the run file's defaults.
CARRIED_MACROS = (
    "MIXTURE_OR_TASK_NAME",
    "MIXTURE_OR_TASK_MODULE",
    "TASK_FEATURE_LENGTHS",
    "USE_CACHED_TASKS",
    "NUM_PARTITIONS",
)
# A run that bound its training data directly (no macro): the parameter that stands for each macro.
_TRAIN_DATA_PARAMETERS = {
    "MIXTURE_OR_TASK_NAME": "mixture_or_task_name",
    "MIXTURE_OR_TASK_MODULE": "module",
    "TASK_FEATURE_LENGTHS": "task_feature_lengths",
}
# Files a training run may leave for its model: t5x-launch train's, then t5x-launch convert's.
CONFIG_NAMES = ("config.gin", "model.gin")
_TOP_LEVEL = re.compile(r"^([A-Za-z_][\w./]*)\s*=")


@dataclasses.dataclass(frozen=True)
class ReusedConfig:
    """The gin files and bindings that evaluate (or infer from) a trained model folder.

    Attributes:
      config_gin: the training run's config file that is reused.
      model_dir: the model folder (holding ``checkpoint_<step>`` folders).
      files: the files to parse, in order (config.gin, then the run file).
      bindings: carried training values, a default output folder, then the user's.
      carried: macro -> the value text carried over from ``config_gin``.
      output_dir: the output folder when the user gave none (else None).
    """

    config_gin: pathlib.Path
    model_dir: pathlib.Path
    files: tuple[str, ...]
    bindings: tuple[str, ...]
    carried: dict[str, str]
    output_dir: pathlib.Path | None

    def summary(self, command: str) -> str:
        """One line: which config.gin this command reuses, and what it took from it."""
        shown = ", ".join(
            f"{name}={value}" for name, value in self.carried.items() if name != "NUM_PARTITIONS"
        )
        where = f"; writing to {self.output_dir}" if self.output_dir is not None else ""
        return f"[t5x-launch] {command}: reusing the training config {self.config_gin} ({shown}){where}"


def is_step_folder(path: pathlib.Path) -> bool:
    """A ``checkpoint_<step>`` folder: its ``checkpoint`` index (T5X) or its Orbax ``state`` item."""
    return (path / "checkpoint").is_file() or (path / "state").is_dir()


def model_folder_of(checkpoint_path: str, macro: str = "CHECKPOINT_PATH") -> pathlib.Path:
    """The model folder that ``checkpoint_path`` names or is a step folder of.

    Raises:
      ConfigurationError: the path does not exist, or is neither a step folder nor
        a folder holding complete ``checkpoint_<step>`` folders (names what it
        holds instead).
    """
    from t5x.checkpointing import Checkpointer

    path = pathlib.Path(checkpoint_path).expanduser()
    if path.is_file() and path.name == "checkpoint":
        path = path.parent
    if not path.exists():
        raise ConfigurationError(
            f"{macro}={checkpoint_path} does not exist: expected a model folder or a checkpoint_<step> folder"
        )
    if not path.is_dir():
        raise ConfigurationError(
            f"{macro}={checkpoint_path} is a file, not a checkpoint: expected a model folder or a "
            "checkpoint_<step> folder (with its 'checkpoint' index file)"
        )
    if is_step_folder(path):
        return path.parent
    if Checkpointer(path, async_save=False).all_steps():
        return path
    held = sorted(p.name for p in path.iterdir())[:8]
    raise ConfigurationError(
        f"{macro}={checkpoint_path} is not a checkpoint: expected a checkpoint_<step> folder holding a "
        "'checkpoint' index file, or a model folder holding complete checkpoint_<step> folders; it holds "
        + (", ".join(held) if held else "nothing")
    )


def _literal_statements(text: str) -> dict[str, tuple[str, int]]:
    """Top-level ``NAME = literal`` statements of a gin file: name -> (value text, line).

    Values that are not Python literals (``@configurable()``, ``%MACRO``) are
    left out; a value may span lines (gin's pretty printer wraps long ones).
    """
    lines = text.splitlines()
    found: dict[str, tuple[str, int]] = {}
    index = 0
    while index < len(lines):
        match = _TOP_LEVEL.match(lines[index])
        if match is None:
            index += 1
            continue
        name, value, start = match.group(1), lines[index][match.end() :], index
        # Continuation lines until the value parses (bounded: a broken file is gin's to report).
        while index + 1 < len(lines) and index - start < 50:
            try:
                ast.literal_eval(value.strip())
                break
            except (ValueError, SyntaxError):
                if _TOP_LEVEL.match(lines[index + 1]):
                    break
                index += 1
                value += "\n" + lines[index]
        try:
            ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            index += 1
            continue
        found[name] = (" ".join(part.strip() for part in value.strip().splitlines()), start + 1)
        index += 1
    return found


def carried_values(config_gin: pathlib.Path) -> dict[str, str]:
    """The training run's task, lengths and partitioning in ``config_gin``, as gin value text."""
    statements = _literal_statements(config_gin.read_text(encoding="utf-8", errors="replace"))
    carried = {name: statements[name][0] for name in CARRIED_MACROS if name in statements}
    for macro, parameter in _TRAIN_DATA_PARAMETERS.items():
        if macro in carried:
            continue
        for name, (value, _) in statements.items():
            if name.startswith("train/") and name.endswith(f"DatasetConfig.{parameter}"):
                carried[macro] = value
                break
    return carried


def _bound_macro(bindings: Sequence[str], name: str) -> object | None:
    """The last literal value bound to macro ``name`` by ``bindings`` (None when unbound)."""
    value = None
    for binding in bindings:
        for statement in _statements(binding):
            if not statement.arg_name and not statement.scope and statement.selector == name:
                value = statement.value
    return value


def _scoped_copies(config_text: str, bindings: Sequence[str]) -> list[str]:
    """The user's unscoped parameter bindings again under each scope config.gin binds them in.

    config.gin binds the model's parameters in its scope (``MODEL/models.T5Config.emb_dim``),
    which wins over an unscoped ``--gin.models.T5Config.emb_dim``; the copy makes the user's win.
    """
    bound = [
        (m.group(1), m.group(2))
        for m in re.finditer(r"^([\w./]+)/([\w.]+) =", config_text, flags=re.M)
        if "." in m.group(2)
    ]
    copies = []
    for binding in bindings:
        for statement in _statements(binding):
            if not statement.arg_name or statement.scope:
                continue
            name = f"{statement.selector}.{statement.arg_name}"
            value = str(binding).split("=", 1)[1].strip()
            for scope, selector in bound:
                if selector == name or selector.endswith("." + name):
                    copies.append(f"{scope}/{selector} = {value}")
    return copies


def reuse_training_config(
    command: str,
    run_file: str,
    gin_files: Sequence[str],
    bindings: Sequence[str],
    *,
    output_macro: str,
    output_subdir: str,
) -> ReusedConfig | None:
    """How ``command`` reuses the model folder's config.gin, or None when the user gave the model's files.

    Reuse applies when no gin file other than ``run_file`` is named.

    Args:
      command: ``eval`` or ``infer`` (for messages).
      run_file: the command's shipped run file (``runs/eval.gin``).
      gin_files: the user's ``--gin_file`` values.
      bindings: the user's bindings (``--gin.X`` and ``--gin_bindings``), last wins.
      output_macro: the command's output folder macro (``EVAL_OUTPUT_DIR``).
      output_subdir: its default under the model folder when the user sets none.

    Raises:
      GinConfigError: no CHECKPOINT_PATH, a CHECKPOINT_PATH that is not a
        checkpoint, or a model folder without a config.gin (each named).
    """
    if any(pathlib.PurePath(f).as_posix().removeprefix("./") != run_file for f in gin_files):
        return None
    checkpoint = _bound_macro(bindings, "CHECKPOINT_PATH")
    if not isinstance(checkpoint, str) or not checkpoint:
        raise GinConfigError(
            f"{command} needs a checkpoint: --gin.CHECKPOINT_PATH=DIR (a model folder written by t5x-launch "
            f"train, whose config.gin is reused, or one of its checkpoint_<step> folders); or the model's gin "
            f"files, e.g. --gin_file=models/t5_1_1/small.gin --gin_file={run_file} --gin.MIXTURE_OR_TASK_NAME=..."
        )
    model_dir = model_folder_of(checkpoint)
    config = next((model_dir / name for name in CONFIG_NAMES if (model_dir / name).is_file()), None)
    if config is None:
        raise GinConfigError(
            f"no config.gin in the model folder {model_dir} (t5x-launch train writes one) to reuse: pass the "
            f"model's gin file and the task, e.g. --gin_file=models/t5_1_1/small.gin --gin_file={run_file} "
            "--gin.MIXTURE_OR_TASK_NAME=... --gin.TASK_FEATURE_LENGTHS=\"{'inputs': 512, 'targets': 114}\""
        )
    carried = carried_values(config)
    extra = [f"{name} = {value}" for name, value in carried.items()]
    output_dir = None
    if _bound_macro(bindings, output_macro) is None:
        output_dir = model_dir / output_subdir
        extra.append(f"{output_macro} = {str(output_dir)!r}")
    scoped = _scoped_copies(config.read_text(encoding="utf-8", errors="replace"), bindings)
    return ReusedConfig(
        config_gin=config,
        model_dir=model_dir,
        files=(str(config), run_file),
        bindings=(*extra, *bindings, *scoped),
        carried=carried,
        output_dir=output_dir,
    )
