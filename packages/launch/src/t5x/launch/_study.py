"""The architecture / objective study (Wang et al., 2022) at CPU size.

``run_study`` pretrains the nine tiny combinations {causal decoder, non-causal
decoder, encoder-decoder} x {full LM, prefix LM, span corruption} from the
shipped ``study/tiny/*.gin`` configs on the built-in corpus, evaluates each
zero-shot by rank classification on the built-in prompted multiple-choice
tasks, and collects the loss curves for a table and a plot.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

ARCHITECTURES = ("causal_decoder", "non_causal_decoder", "encoder_decoder")
OBJECTIVES = ("full_lm", "prefix_lm", "span_corruption")
SIZES = ("paper", "tiny")
# The per-token loss: comparable across objectives whose rows hold different numbers of targets.
LOSS_METRIC = "loss_per_nonpadding_target_token"


def grid_config(architecture: str, objective: str, size: str = "tiny") -> str:
    """The shipped gin file of one study combination, e.g. ``study/tiny/causal_decoder_full_lm.gin``.

    Raises:
      ValueError: an unknown architecture, objective or size.
    """
    for what, value, known in (
        ("architecture", architecture, ARCHITECTURES),
        ("objective", objective, OBJECTIVES),
        ("size", size, SIZES),
    ):
        if value not in known:
            raise ValueError(f"unknown study {what} {value!r}; expected one of {known}")
    return f"study/{size}/{architecture}_{objective}.gin"


@dataclasses.dataclass
class StudyRun:
    """One pretrained combination.

    Attributes:
      architecture: one of ``ARCHITECTURES``.
      objective: one of ``OBJECTIVES``.
      model_dir: its checkpoints, config.gin and metrics.jsonl.
      curve: ``[(step, loss per target token)]`` at every logged step.
      zero_shot_median: median rank-classification accuracy (percent) across
        prompts, or None when zero-shot evaluation did not run.
      zero_shot: per-prompt accuracy (percent).
      seconds: wall time of training and evaluation.
    """

    architecture: str
    objective: str
    model_dir: str
    curve: list[tuple[int, float]]
    zero_shot_median: float | None = None
    zero_shot: dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    @property
    def final_loss(self) -> float:
        """The last logged loss per target token (NaN when nothing was logged)."""
        return self.curve[-1][1] if self.curve else float("nan")


@dataclasses.dataclass
class StudyResult:
    """The study's runs, where its plot went, and why zero-shot is missing if it is."""

    runs: list[StudyRun]
    plot_path: str | None = None
    zero_shot_note: str | None = None

    def format_table(self) -> str:
        """The comparison table: architecture, objective, final loss, zero-shot median."""
        header = ("architecture", "objective", "steps", "final loss/token", "zero-shot median %")
        rows = []
        for run in self.runs:
            steps = run.curve[-1][0] if run.curve else 0
            accuracy = "unavailable" if run.zero_shot_median is None else f"{run.zero_shot_median:.1f}"
            rows.append((run.architecture, run.objective, str(steps), f"{run.final_loss:.4f}", accuracy))
        widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in (header, *rows)
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if self.zero_shot_note:
            lines.append(f"zero-shot: {self.zero_shot_note}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable record of the study."""
        return {
            "runs": [dataclasses.asdict(run) | {"final_loss": run.final_loss} for run in self.runs],
            "plot_path": self.plot_path,
            "zero_shot_note": self.zero_shot_note,
        }


def read_loss_curve(model_dir: str | pathlib.Path, metric: str = LOSS_METRIC) -> list[tuple[int, float]]:
    """``[(step, value)]`` of ``metric`` from a run's ``metrics.jsonl`` (train lines only)."""
    path = pathlib.Path(model_dir) / "metrics.jsonl"
    curve = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if metric in record and "step" in record:
            curve.append((int(record["step"]), float(record[metric])))
    return curve


def zero_shot_median(model: Any, params: Any, task_names: Sequence[str] | None) -> tuple[Any, str | None]:
    """Runs zero-shot rank classification, isolated so that the study survives its absence.

    Returns:
      ``(report, None)``, or ``(None, reason)`` when the evaluator is not
      available in this installation.
    """
    try:
        from t5x.launch._zero_shot import evaluate_zero_shot

        return evaluate_zero_shot(model, params, task_names), None
    except (ImportError, NotImplementedError) as error:
        return None, f"unavailable ({type(error).__name__}: {error or 'not implemented'})"


def plot_loss_curves(runs: Sequence[StudyRun], path: str | pathlib.Path) -> str:
    """Saves one PNG with every run's loss curve (colour: architecture, line style: objective).

    Raises:
      ImportError: matplotlib is missing (install ``t5x-launch[study]``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "the study's loss plot needs matplotlib: pip install --find-links dist 't5x-launch[study]' "
            "(run in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md), "
            "or pass --no_plot"
        ) from error
    colours = dict(zip(ARCHITECTURES, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    styles = dict(zip(OBJECTIVES, ("-", "--", ":"), strict=True))
    figure, axes = plt.subplots(figsize=(8, 5))
    for run in runs:
        if not run.curve:
            continue
        steps, losses = zip(*run.curve, strict=True)
        axes.plot(
            steps,
            losses,
            color=colours[run.architecture],
            linestyle=styles[run.objective],
            label=f"{run.architecture} / {run.objective}",
        )
    axes.set_xlabel("step")
    axes.set_ylabel("training loss per target token")
    axes.set_title("Architecture x objective (tiny models, built-in corpus)")
    axes.legend(fontsize="small")
    figure.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path)


def _train_one(config: str, model_dir: pathlib.Path, steps: int, bindings: Sequence[str]) -> tuple[Any, Any]:
    """Pretrains one combination from its gin file; returns ``(model, params)``."""
    import gin

    import t5x.launch
    from t5x.checkpointing import load_t5x_checkpoint
    from t5x.launch._gin_config import (
        GinArgs,
        check_required_macros,
        macro_value,
        parse_gin,
        write_config_gin,
    )

    period = max(1, steps // 20)
    parse_gin(
        GinArgs(
            files=(config,),
            bindings=(
                f"MODEL_DIR = {str(model_dir)!r}",
                f"TRAIN_STEPS = {steps}",
                f"CHECKPOINT_PERIOD = {steps}",
                f"launch.train.log_period = {period}",
                *bindings,
            ),
        )
    )
    check_required_macros()
    gin.get_configurable(t5x.launch.train)()
    write_config_gin(model_dir)
    model = macro_value("MODEL")
    params = load_t5x_checkpoint(str(model_dir))["target"]
    return model, params


def run_study(
    model_dir: str | pathlib.Path,
    *,
    steps: int = 100,
    architectures: Sequence[str] = ARCHITECTURES,
    objectives: Sequence[str] = OBJECTIVES,
    zero_shot: bool = True,
    zero_shot_tasks: Sequence[str] | None = None,
    plot: bool = True,
    bindings: Sequence[str] = (),
    log: Callable[[str], None] = print,
) -> StudyResult:
    """Pretrains each tiny combination, evaluates it zero-shot, and plots the loss curves.

    Args:
      model_dir: one sub-folder per combination (``<architecture>_<objective>``),
        plus ``study.json`` and ``loss_curves.png``.
      steps: training steps of each combination.
      architectures: which architectures (default: all three).
      objectives: which objectives (default: all three).
      zero_shot: run rank classification on the built-in prompted tasks.
      zero_shot_tasks: task names (None: the built-in prompted multiple-choice tasks).
      plot: save ``loss_curves.png`` (needs matplotlib).
      bindings: extra gin bindings for every run, e.g. ``"BATCH_SIZE = 8"``.
      log: where progress lines go.

    Returns:
      A StudyResult; ``format_table()`` gives the comparison table.

    Raises:
      ValueError: an unknown architecture or objective, or ``steps < 1``.
      ImportError: ``plot`` without matplotlib (checked before training).
      Preempted: a SIGTERM or SIGINT stopped a combination's training (after
        saving its checkpoint); no further combination starts. Called again
        with the same ``model_dir``, the study resumes: finished combinations
        are not trained again.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    configs = [(a, o, grid_config(a, o)) for a in architectures for o in objectives]
    if plot:
        try:
            import matplotlib  # noqa: F401  # fail before minutes of training, not after
        except ImportError as error:
            raise ImportError(
                "the study's loss plot needs matplotlib: pip install --find-links dist 't5x-launch[study]' "
                "(run in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md), "
                "or pass --no_plot"
            ) from error
    root = pathlib.Path(model_dir)
    root.mkdir(parents=True, exist_ok=True)
    result = StudyResult(runs=[])
    for architecture, objective, config in configs:
        start = time.perf_counter()
        directory = root / f"{architecture}_{objective}"
        log(f"[study] {architecture} x {objective}: {steps} steps ({config})")
        model, params = _train_one(config, directory, steps, bindings)
        run = StudyRun(architecture, objective, str(directory), read_loss_curve(directory))
        if zero_shot:
            report, note = zero_shot_median(model, params, zero_shot_tasks)
            if report is not None:
                run.zero_shot_median = float(report.median)
                run.zero_shot = dict(report.per_prompt)
            else:
                result.zero_shot_note = note
        run.seconds = time.perf_counter() - start
        result.runs.append(run)
        accuracy = "" if run.zero_shot_median is None else f", zero-shot median {run.zero_shot_median:.1f}%"
        log(
            f"[study] {architecture} x {objective}: loss {run.final_loss:.4f}{accuracy} ({run.seconds:.0f} s)"
        )
    if not zero_shot:
        result.zero_shot_note = "not run (--no_zero_shot)"
    if plot:
        result.plot_path = plot_loss_curves(result.runs, root / "loss_curves.png")
    (root / "study.json").write_text(json.dumps(result.to_json(), indent=2))
    return result
