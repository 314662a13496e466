"""Zero-shot evaluation by rank classification over prompted multiple-choice tasks.

Each prompted task expands an example into one row per option (the prompt as
``inputs``, the option as ``targets``); the model's own feature converter turns
the rows into model features and ``Model.score_batch`` gives each option's
log-likelihood; the option with the highest one is the model's answer. The
same code serves the three architectures of Wang et al. (2022): for an
encoder-decoder the prompt is the encoder input; for a decoder-only model the
prompt is the prefix and the option its continuation (with
``inputs_bidirectional_attention=True`` the prefix attends bidirectionally).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t5x.launch._assembly import check_vocabularies, feature_converter_for


@dataclasses.dataclass(frozen=True)
class ZeroShotReport:
    """Rank-classification accuracy of each prompted task and their median.

    Attributes:
      per_prompt: task name -> accuracy in percent, in evaluation order.
      median: median of ``per_prompt`` (percent).
      medians: for each requested mixture, the median accuracy of its tasks.
      num_examples: task name -> multiple-choice examples evaluated.
    """

    per_prompt: dict[str, float]
    median: float
    medians: dict[str, float] = dataclasses.field(default_factory=dict)
    num_examples: dict[str, int] = dataclasses.field(default_factory=dict)

    def format_table(self) -> str:
        """A plain-text table: one line per prompt, then each mixture's median and the overall median."""
        rows = [
            (name, f"{acc:6.2f}", str(self.num_examples.get(name, "")))
            for name, acc in self.per_prompt.items()
        ]
        rows += [(f"median of {name}", f"{acc:6.2f}", "") for name, acc in self.medians.items()]
        rows.append((f"median over {len(self.per_prompt)} prompts", f"{self.median:6.2f}", ""))
        width = max(len("task"), *(len(r[0]) for r in rows))
        lines = [f"{'task':<{width}}  accuracy  examples", f"{'-' * width}  --------  --------"]
        lines += [f"{name:<{width}}  {acc:>8}  {n:>8}" for name, acc, n in rows]
        return "\n".join(lines)


def _check_model(model: Any) -> None:
    missing = [m for m in ("score_batch", "feature_converter_cls") if not hasattr(model, m)]
    if missing:
        raise TypeError(
            f"evaluate_zero_shot: model {type(model).__name__} lacks {', '.join(missing)}; rank classification "
            "scores each option with Model.score_batch over the model's feature converter "
            "(use t5x.models.EncoderDecoderModel or DecoderOnlyModel)"
        )


def _resolve(task_names: Sequence[str] | None) -> tuple[list[Any], dict[str, list[str]]]:
    """The leaf tasks to evaluate (each once, in order) and, per requested mixture, its tasks."""
    import t5x.tasks
    from t5x.tasks.builtin import BUILTIN_MC_TASKS, register_builtin_tasks

    register_builtin_tasks()
    if task_names is None:
        task_names = BUILTIN_MC_TASKS
    if isinstance(task_names, str):
        raise TypeError(
            f"evaluate_zero_shot: task_names must be a list of names, got the string {task_names!r}"
        )
    if not task_names:
        raise ValueError(
            "evaluate_zero_shot: task_names is empty; give at least one task or mixture (or None)"
        )
    tasks: dict[str, Any] = {}
    groups: dict[str, list[str]] = {}
    for name in task_names:
        provider = t5x.tasks.get_mixture_or_task(name)  # UnknownNameError names close matches
        leaves = t5x.tasks.get_subtasks(provider)
        if isinstance(provider, t5x.tasks.Mixture):
            groups[name] = [t.name for t in leaves]
        for task in leaves:
            if not task.score_metric_fns:
                raise ValueError(
                    f"evaluate_zero_shot: task {task.name!r} has no score-based metric; zero-shot rank "
                    "classification needs a task built with t5x.tasks.rank_classification and the "
                    "t5x.tasks.metrics.rank_classification metric (e.g. the builtin_mc_* tasks)"
                )
            tasks.setdefault(task.name, task)
    return list(tasks.values()), groups


def _rows_of_first_examples(task: Any, split: str, num_examples: int) -> int:
    """How many rows the first ``num_examples`` examples of a rank-classification task expand into."""
    rows = 0
    for row in task.get_dataset(None, split=split, num_epochs=1, shuffle=False).as_numpy_iterator():
        if "idx" not in row:
            raise ValueError(
                f"evaluate_zero_shot: task {task.name!r} rows have no 'idx'; expand examples with "
                "t5x.tasks.rank_classification(mode='eval')"
            )
        if int(np.asarray(row["idx"]).reshape(-1)[0]) >= num_examples:
            break
        rows += 1
    return rows


def _bucket(length: int) -> int:
    return max(16, 1 << (length - 1).bit_length())


def evaluate_zero_shot(
    model: Any,
    params: Any,
    task_names: Sequence[str] | None = None,
    *,
    batch_size: int = 8,
    split: str = "validation",
    num_examples: int | None = None,
) -> ZeroShotReport:
    """Zero-shot rank-classification accuracy of a model on prompted multiple-choice tasks.

    Every option of every example is scored with ``model.score_batch`` (the
    log-likelihood of the option's target tokens, ``[batch]``) on the rows the
    model's feature converter makes (unpacked); the highest-scoring option is
    the prediction and ``t5x.tasks.metrics.rank_classification`` gives the
    accuracy. Rows are padded to power-of-two lengths, so tasks share
    compiled scoring programs.

    Args:
      model: a ``t5x.models.EncoderDecoderModel`` or ``DecoderOnlyModel``
        (causal, or non-causal with ``inputs_bidirectional_attention=True``).
      params: the model's parameter tree.
      task_names: registered rank-classification tasks or mixtures (a mixture
        stands for its tasks; each task is its own prompt). None: the
        built-in ``t5x.tasks.BUILTIN_MC_TASKS``.
      batch_size: rows per ``score_batch`` call.
      split: the split to evaluate.
      num_examples: evaluate only the first this many multiple-choice examples
        of each task (None: all).

    Returns:
      A ZeroShotReport with per-prompt accuracies (percent) and their median.

    Raises:
      TypeError: ``model`` cannot score targets, or ``task_names`` is a string.
      ValueError: an empty task list, a task that is not a rank-classification
        task, a missing split, a vocabulary that differs from the model's, or a
        bad ``batch_size`` / ``num_examples``.
      t5x.tasks.UnknownNameError: an unknown task or mixture (a KeyError).
    """
    import t5x.tasks

    _check_model(model)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"evaluate_zero_shot: batch_size must be a positive int, got {batch_size!r}")
    if num_examples is not None and (not isinstance(num_examples, int) or num_examples < 1):
        raise ValueError(
            f"evaluate_zero_shot: num_examples must be a positive int or None, got {num_examples!r}"
        )
    tasks, groups = _resolve(task_names)
    for task in tasks:
        check_vocabularies(model, task)
    for task in tasks:
        if split not in task.splits:
            raise ValueError(
                f"evaluate_zero_shot: task {task.name!r} has no split {split!r}; it has {list(task.splits)}"
            )
    converter = feature_converter_for(model, pack=False)

    def score_fn(batch: Mapping[str, np.ndarray]) -> list[float]:
        # Trailing padding changes no score (padding is masked and unweighted); padding every
        # task to a power-of-two length lets tasks share compiled scoring programs.
        padded = {
            k: np.pad(v, [(0, 0), (0, _bucket(v.shape[1]) - v.shape[1])]) if v.ndim == 2 else v
            for k, v in batch.items()
        }
        return np.asarray(model.score_batch(params, padded), np.float64).tolist()

    per_prompt: dict[str, float] = {}
    counts: dict[str, int] = {}
    for task in tasks:
        rows = None if num_examples is None else _rows_of_first_examples(task, split, num_examples)
        evaluator = t5x.tasks.Evaluator(
            task, converter, eval_split=split, num_examples=rows, batch_size=batch_size
        )
        try:
            future = evaluator.evaluate(compute_metrics=True, score_fn=score_fn)
            assert future is not None  # compute_metrics=True always gives one
            metrics = future.result()[task.name]
        finally:
            evaluator.close()
        if "accuracy" not in metrics:
            raise ValueError(
                f"evaluate_zero_shot: task {task.name!r} reported {sorted(metrics)} but no 'accuracy'; "
                "use the t5x.tasks.metrics.rank_classification metric"
            )
        per_prompt[task.name] = float(metrics["accuracy"])
        counts[task.name] = len(
            {int(np.asarray(ex["idx"]).reshape(-1)[0]) for ex in evaluator.cached_examples()[task.name]}
        )
    medians = {
        name: float(statistics.median(per_prompt[t] for t in members)) for name, members in groups.items()
    }
    return ZeroShotReport(
        per_prompt=per_prompt,
        median=float(statistics.median(per_prompt.values())),
        medians=medians,
        num_examples=counts,
    )


def load_checkpoint_params(model: Any, checkpoint_path: str, step: int | None = None) -> Any:
    """Loads a T5X checkpoint's parameters and checks that they fit ``model``.

    Args:
      model: the model the parameters are for.
      checkpoint_path: a model folder (latest step, or ``step``) or a
        ``checkpoint_<step>`` folder.
      step: the step to load from a model folder.

    Returns:
      The parameter tree (numpy leaves cast to the model's dtypes).

    Raises:
      FileNotFoundError: no checkpoint at the path.
      ValueError: the checkpoint's parameter names or shapes differ from the model's.
    """
    import jax

    from t5x.checkpointing import load_t5x_checkpoint

    converter = feature_converter_for(model, pack=False)
    shapes = {k: (1, v) for k, v in converter.get_model_feature_lengths({"inputs": 8, "targets": 8}).items()}
    expected = jax.eval_shape(lambda rng: model.get_initial_variables(rng, shapes), jax.random.PRNGKey(0))[
        "params"
    ]
    loaded = load_t5x_checkpoint(checkpoint_path, step=step)["target"]
    want = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(expected)}
    got = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(loaded)}
    if want.keys() != got.keys():
        missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
        raise ValueError(
            f"checkpoint {checkpoint_path} does not fit model {type(model).__name__}: "
            f"missing parameters {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected parameters {extra[:5]}{'...' if len(extra) > 5 else ''}"
        )
    for key, like in want.items():
        if tuple(np.shape(got[key])) != tuple(like.shape):
            raise ValueError(
                f"checkpoint {checkpoint_path}: parameter {key} has shape {tuple(np.shape(got[key]))}, "
                f"but the model expects {tuple(like.shape)}"
            )
    return jax.tree.map(lambda value, like: np.asarray(value).astype(like.dtype), loaded, expected)


def model_from_gin(
    gin_files: Sequence[str], gin_bindings: Sequence[str] = (), search_paths: Sequence[str] = ()
) -> Any:
    """Builds the model a gin configuration binds to the ``MODEL`` macro.

    Args:
      gin_files: gin files (shipped ones such as ``models/demo/tiny.gin`` are
        found by relative path), e.g. a model config or a run's ``config.gin``.
      gin_bindings: extra bindings ``"NAME = VALUE"``.
      search_paths: extra folders to find gin files in.

    Returns:
      The configured model.

    Raises:
      GinConfigError: a gin error, or no ``MODEL`` macro.
    """
    import gin

    from t5x.launch._gin_config import GinArgs, GinConfigError, check_required_macros, macro_value, parse_gin

    parse_gin(GinArgs(tuple(gin_files), tuple(gin_bindings), tuple(search_paths)))
    check_required_macros()
    model = macro_value("MODEL")
    if model is gin.REQUIRED or model is None:
        raise GinConfigError(
            f"the macro MODEL is not set by {list(gin_files)}: pass a model gin file, "
            "e.g. --gin_file=models/demo/tiny.gin"
        )
    return model
