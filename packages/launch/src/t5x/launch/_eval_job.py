"""The job behind ``t5x-launch eval``: every metric of a task's eval split, for one or many checkpoints.

Decoding, scoring and the metrics run through ``t5x.tasks.Evaluator`` (predict,
score and predict-with-aux metrics of every task of a mixture); its loggers
write seqio's files into the output folder:

* ``<task>-metrics.jsonl``: one JSON line per evaluated step;
* ``<task>-<step:06d>.jsonl``: one line per example, with the input and target
  text, the postprocessed prediction and the score;
* ``<task>/events.out.tfevents.*``: TensorBoard scalars ``eval/<metric>``.

With ``steps="all"`` the steps already in every task's metrics file are
skipped, so a run stopped half-way continues where it stopped, and checkpoints
saved while it runs are evaluated too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from t5x.launch._assembly import (
    check_components,
    check_prompts,
    check_vocabularies,
    feature_converter_for,
    get_provider,
)
from t5x.launch._configs import DatasetConfig
from t5x.launch._errors import ConfigurationError
from t5x.launch._inference import DecodeProgress, InferenceReport
from t5x.launch._jobs import JobResult, _default_partitioner, _input_shapes, _print_inference
from t5x.launch._platform import apply_cpu_kernels_override
from t5x.launch._reuse_config import is_step_folder, model_folder_of

STEP_MODES = ("latest", "all", "specific")


# ---- which checkpoints ------------------------------------------------------------------------


def _step_of(folder: pathlib.Path) -> int | None:
    suffix = folder.name.removeprefix("checkpoint_")
    return int(suffix) if folder.name.startswith("checkpoint_") and suffix.isdigit() else None


def complete_steps(model_dir: pathlib.Path) -> list[int]:
    """The complete checkpoint steps of a model folder, ascending."""
    from t5x.checkpointing import Checkpointer

    return Checkpointer(model_dir, async_save=False).all_steps()


def logged_steps(output_dir: pathlib.Path, task_names: list[str]) -> set[int]:
    """Steps that every task's ``<task>-metrics.jsonl`` in ``output_dir`` already holds."""
    done: set[int] | None = None
    for name in task_names:
        path = output_dir / f"{name}-metrics.jsonl"
        steps: set[int] = set()
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    step = json.loads(line).get("step")
                except (json.JSONDecodeError, AttributeError):
                    continue  # a line cut short by a kill: that step is evaluated again
                if isinstance(step, int):
                    steps.add(step)
        done = steps if done is None else done & steps
    return done or set()


def _check_steps(steps: str | int) -> None:
    if isinstance(steps, int) and not isinstance(steps, bool):
        return
    if steps not in STEP_MODES:
        raise ConfigurationError(
            f"EVAL_STEPS (evaluate's steps) must be 'latest', 'all', 'specific' or a step number, got {steps!r}"
        )


# ---- the model's callables for the Evaluator --------------------------------------------------


def _allgather_pairs(pairs: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """Every process's ``(index, output)`` pairs (the Evaluator's gather across hosts)."""
    from jax.experimental import multihost_utils

    payload = np.frombuffer(pickle.dumps(pairs), dtype=np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int64(payload.size))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: payload.size] = payload
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    out: list[tuple[int, Any]] = []
    for row, size in zip(gathered, sizes, strict=True):
        out.extend(pickle.loads(row[: int(size)].tobytes()))
    return out


class ModelCallables:
    """``predict_with_aux(batch)`` and ``score(batch)`` over this process's rows, for the Evaluator.

    Each takes a batch of ``per_shard_batch_size`` rows (this process's part of
    a ``batch_size`` step) and returns its rows' outputs, computed with the
    current ``params``. A program is compiled once per batch shape and kind, and
    serves every later ``params`` of the same layout (the checkpoints of an
    ``eval``, the evaluations of a training run).
    """

    def __init__(
        self,
        model: Any,
        partitioner: Any,
        batch_size: int,
        *,
        seed: int = 0,
        decode_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        layout = partitioner.get_data_layout(batch_size)
        self._rows = layout.per_shard_batch_size
        self._first = layout.shard_id * self._rows
        self._model = model
        self._partitioner = partitioner
        self._seed = seed
        self._decode_kwargs = dict(decode_kwargs or {})
        self._compiled: dict[Any, Callable[..., Any]] = {}
        self._calls = 0
        self.params: Any = None

    def _program(self, kind: str, global_batch: Mapping[str, Any]) -> Callable[..., Any]:
        import jax

        from t5x.training import batch_shardings, sharding_for

        replicated = sharding_for(self._partitioner, ())
        params_shardings = jax.tree.map(
            lambda p: p.sharding if isinstance(p, jax.Array) else replicated, self.params
        )
        key = (
            kind,
            jax.tree.structure(self.params),
            tuple(jax.tree.leaves(params_shardings)),
            *sorted((k, v.shape, str(v.dtype)) for k, v in global_batch.items()),
        )
        if key not in self._compiled:
            model, decode_kwargs = self._model, self._decode_kwargs
            if kind == "score":

                def step(params: Any, batch: Any, rng: Any) -> Any:
                    del rng
                    return model.score_batch(params, batch)
            else:

                def step(params: Any, batch: Any, rng: Any) -> Any:
                    return model.predict_batch_with_aux(params, batch, rng, **decode_kwargs)

            self._compiled[key] = self._partitioner.partition(
                step,
                in_shardings=(params_shardings, batch_shardings(self._partitioner, global_batch), replicated),
                out_shardings=replicated,
            )
        return self._compiled[key]

    def _run(self, kind: str, batch: Mapping[str, np.ndarray]) -> Any:
        import jax

        if self.params is None:
            raise RuntimeError("ModelCallables: set params before calling")
        global_batch = self._partitioner.host_local_to_global(dict(batch))
        rng = jax.random.fold_in(jax.random.PRNGKey(self._seed), self._calls)
        self._calls += 1
        out = self._partitioner.global_to_host_local(
            self._program(kind, global_batch)(self.params, global_batch, rng)
        )
        return jax.tree.map(lambda a: np.asarray(a)[self._first : self._first + self._rows], out)

    def predict_with_aux(self, batch: Mapping[str, np.ndarray]) -> Any:
        tokens, aux = self._run("predict", batch)
        return tokens, dict(aux)

    def score(self, batch: Mapping[str, np.ndarray]) -> Any:
        return self._run("score", batch)


# ---- can this checkpoint's model serve the task? ----------------------------------------------


def _embedding_rows(params: Any) -> int | None:
    """Rows of the shared token embedding of a parameter tree (None when it has none)."""
    import jax

    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", k)) for k in path]
        if "token_embedder" in names and names[-1] == "embedding":
            return int(np.shape(leaf)[0])
    return None


def check_task_fits(
    model: Any, provider: Any, lengths: Mapping[str, int], checkpoint: str, params: Any
) -> None:
    """Checks that the checkpoint's model can read and write the task's features.

    Raises:
      ConfigurationError: naming the task, the checkpoint and expected vs
        actual: a vocabulary larger than the checkpoint's embedding, a task
        feature without a length, or a length below 1.
    """
    rows = _embedding_rows(params)
    for name, feature in provider.output_features.items():
        size = getattr(feature.vocabulary, "vocab_size", None)
        if rows is not None and isinstance(size, int) and size > rows:
            raise ConfigurationError(
                f"the task {provider.name}'s feature {name!r} has a vocabulary of {size} tokens, but the model "
                f"of {checkpoint} embeds only {rows} (token_embedder/embedding rows): this checkpoint cannot "
                "serve the task"
            )
        length = lengths.get(name)
        if length is None:
            raise ConfigurationError(
                f"TASK_FEATURE_LENGTHS {dict(lengths)} has no length for the task {provider.name}'s feature {name!r}"
            )
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ConfigurationError(f"TASK_FEATURE_LENGTHS[{name!r}] must be a positive int, got {length!r}")


def restore_params(
    model: Any,
    partitioner: Any,
    converter: Any,
    cfg: DatasetConfig,
    checkpoint: str,
    step: int | None,
    seed: int,
) -> tuple[Any, int]:
    """The parameters of ``step`` (the latest when None), placed as the model wants them.

    Raises:
      ConfigurationError: a parameter of the model is missing from the
        checkpoint or has another shape (names both, and the checkpoint).
    """
    import jax

    import t5x.training
    from t5x.checkpointing import load_t5x_checkpoint

    initialized = t5x.training.init_train_state(
        model, t5x.training.sgd(0.0), partitioner, _input_shapes(converter, cfg), seed=seed, materialize=False
    )
    state = load_t5x_checkpoint(checkpoint, step=step)
    found = dict(jax.tree_util.tree_flatten_with_path(state["target"])[0])
    for path, like in jax.tree_util.tree_flatten_with_path(initialized.shapes.params)[0]:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        value = found.get(path)
        where = f"{checkpoint}" + (f" (step {step})" if step is not None else "")
        if value is None:
            raise ConfigurationError(
                f"the checkpoint {where} has no parameter {name}: it was not written for the configured model"
            )
        if tuple(np.shape(value)) != tuple(like.shape):
            raise ConfigurationError(
                f"the checkpoint {where}: parameter {name} has shape {tuple(np.shape(value))}, the configured "
                f"model expects {tuple(like.shape)}: the checkpoint's model cannot serve this configuration"
            )
    params = jax.tree.map(
        lambda value, like, sharding: jax.device_put(np.asarray(value).astype(like.dtype), sharding),
        state["target"],
        initialized.shapes.params,
        initialized.shardings.params,
    )
    return params, int(state["state"]["step"])


# ---- the job ----------------------------------------------------------------------------------


def _as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else repr(value)


def _report(evaluator: Any, task: Any, metrics: Mapping[str, Any]) -> InferenceReport:
    examples = evaluator.cached_examples()[task.name]
    inferences = evaluator.last_inferences.get(task.name, {})
    targets = evaluator.cached_targets()[task.name]
    shown = []
    for i, example in enumerate(examples):
        row = {
            "input": _as_text(example.get("inputs_pretokenized", example.get("inputs", ""))),
            "target": _as_text(targets[i]),
        }
        if "predictions" in inferences:
            row["prediction"] = _as_text(inferences["predictions"][i])
        if "scores" in inferences:
            row["score"] = f"{inferences['scores'][i]:.4g}"
        shown.append(row)
    numbers = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
    }
    return InferenceReport(task.name, numbers, len(examples), shown)


def _longest(evaluator: Any) -> dict[str, int]:
    """The longest example of each task feature over the evaluated tasks (upstream's None lengths)."""
    lengths: dict[str, int] = {}
    for task in evaluator.eval_tasks:
        for example in evaluator.cached_examples()[task.name]:
            for name in task.output_features:
                if name in example and np.ndim(example[name]) == 1:
                    lengths[name] = max(lengths.get(name, 1), len(example[name]))
    return lengths


def _check_prompts(model: Any, tasks: Any) -> None:
    """Every task decoded for its prediction metrics gives a decoder-only model its prompt."""
    for task in tasks:
        if task.predict_metric_fns:
            check_prompts(model, task, f"the task {task.name}'s prediction metrics")


def make_evaluator(
    provider: Any,
    converter: Any,
    cfg: DatasetConfig,
    partitioner: Any,
    log_dir: pathlib.Path,
    *,
    max_examples: int | None,
    logger_cls: tuple[Any, ...],
) -> Any:
    """``t5x.tasks.Evaluator`` over ``cfg``'s split, this process's data shard, loggers on process 0.

    ``JSONLogger`` writes seqio's files into ``log_dir``: ``<task>-metrics.jsonl``
    and ``<task>-<step:06d>.jsonl``.
    """
    import jax

    import t5x.tasks

    layout = partitioner.get_data_layout(cfg.batch_size)
    return t5x.tasks.Evaluator(
        provider,
        converter,
        eval_split=cfg.split,
        use_cached=cfg.use_cached,
        seed=cfg.seed if cfg.seed is not None else 42,
        sequence_length=dict(cfg.task_feature_lengths) if cfg.task_feature_lengths else None,
        num_examples=max_examples,
        logger_cls=logger_cls if jax.process_index() == 0 else (),
        log_dir=str(log_dir),
        batch_size=layout.per_shard_batch_size,
        shard_info=layout.shard_info if layout.num_shards > 1 else None,
        gather_fn=_allgather_pairs if layout.num_shards > 1 else None,
    )


class TrainingInferenceEval:
    """Inference evaluation during training, as upstream's train does it with seqio's Evaluator.

    The Evaluator (its datasets read once) and the compiled programs are built at
    the first evaluation and reused. Each evaluation decodes (and scores) the
    split with the current parameters, writes seqio's files into ``log_dir``
    (``<task>-<step:06d>.jsonl``, ``<task>-metrics.jsonl``) and the metrics to
    ``writer`` as ``inference_eval/<task>/<metric>``.

    Attributes:
      reports: the last evaluation's reports, one per task.
    """

    def __init__(
        self,
        model: Any,
        partitioner: Any,
        cfg: DatasetConfig,
        log_dir: pathlib.Path,
        *,
        max_examples: int | None,
        writer: Any,
        seed: int,
    ) -> None:
        self._model = model
        self._partitioner = partitioner
        self._cfg = cfg
        self._log_dir = log_dir
        self._max_examples = max_examples
        self._writer = writer
        self._seed = seed
        self._evaluator: Any = None
        self._callables: ModelCallables | None = None
        self.reports: list[InferenceReport] = []
        self._provider = get_provider(cfg)
        _check_prompts(model, self._provider.tasks)  # before training, not at the first evaluation

    def _build(self) -> tuple[Any, ModelCallables]:
        import t5x.tasks

        if self._evaluator is None:
            converter = feature_converter_for(self._model, pack=False)
            self._evaluator = make_evaluator(
                self._provider,
                converter,
                self._cfg,
                self._partitioner,
                self._log_dir,
                max_examples=self._max_examples,
                logger_cls=(t5x.tasks.JSONLogger,),
            )
            self._callables = ModelCallables(
                self._model, self._partitioner, self._cfg.batch_size, seed=self._seed
            )
        assert self._callables is not None
        return self._evaluator, self._callables

    def __call__(self, step: int, params: Any) -> dict[str, dict[str, float]]:
        evaluator, callables = self._build()
        callables.params = params
        self.reports = run_evaluator(evaluator, callables, step)
        callables.params = None  # the train state's buffers are donated to the next step
        if self._writer is not None:
            for report in self.reports:
                if report.metrics:
                    scalars = {f"inference_eval/{report.task}/{k}": v for k, v in report.metrics.items()}
                    self._writer.write_scalars(step, scalars)
        _print_inference(self.reports, 0, step=step)
        return {report.task: report.metrics for report in self.reports}

    def close(self) -> None:
        if self._evaluator is not None:
            self._evaluator.close()


def evaluate(
    *,
    model: Any,
    dataset_cfg: DatasetConfig,
    checkpoint_path: str,
    output_dir: str,
    steps: str | int = "latest",
    partitioner: Any = None,
    max_examples: int | None = None,
    random_seed: int = 0,
    show_predictions: int = 0,
    decode_kwargs: Mapping[str, Any] | None = None,
) -> list[JobResult]:
    """Evaluates one, the latest or every checkpoint with all of the task's metrics.

    Args:
      model: the model the checkpoints were trained as.
      dataset_cfg: the task or mixture, its lengths, split and batch size.
      checkpoint_path: a ``checkpoint_<step>`` folder, or a model folder.
      output_dir: where the metrics, examples and TensorBoard files go.
      steps: ``"latest"``, ``"all"`` (every checkpoint, skipping steps already
        logged in ``output_dir``, then any saved meanwhile), a step number, or
        ``"specific"`` (``checkpoint_path`` must be a step folder); a step
        folder is always evaluated alone.
      partitioner: default ``PjitPartitioner(num_partitions=1)``.
      max_examples: at most this many examples per task (None: all).
      random_seed: seeds sampling decoders.
      show_predictions: print this many examples per task.
      decode_kwargs: passed to the model's ``predict_batch_with_aux``.

    Returns:
      One JobResult per checkpoint evaluated here (none when ``"all"`` finds
      every step already logged).

    Raises:
      ConfigurationError: a path that is not a checkpoint, a step that is not
        there, or a task the checkpoint's model cannot serve (each named).
    """
    import jax

    import t5x.tasks

    _check_steps(steps)
    apply_cpu_kernels_override(model, os.environ)
    partitioner = _default_partitioner(partitioner)
    converter = feature_converter_for(model, pack=False)
    check_components(model=model, partitioner=partitioner, feature_converter=converter)
    path = pathlib.Path(checkpoint_path)
    model_dir = model_folder_of(checkpoint_path)
    single = is_step_folder(path)
    if steps == "specific" and not single:
        raise ConfigurationError(
            f"steps='specific' evaluates one checkpoint_<step> folder, but CHECKPOINT_PATH={checkpoint_path} "
            f"is a model folder (steps {complete_steps(model_dir)}): name the step folder, or use 'latest' / 'all'"
        )
    if isinstance(steps, int) and not single and steps not in complete_steps(model_dir):
        raise ConfigurationError(
            f"no complete checkpoint for step {steps} in {model_dir}; it has steps {complete_steps(model_dir)}"
        )

    provider = get_provider(dataset_cfg)
    check_vocabularies(model, provider)
    out = pathlib.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    writes = jax.process_index() == 0
    evaluator = make_evaluator(
        provider,
        converter,
        dataset_cfg,
        partitioner,
        out,
        max_examples=max_examples,
        logger_cls=(t5x.tasks.JSONLogger, t5x.tasks.TensorBoardLogger),
    )
    _check_prompts(model, evaluator.eval_tasks)
    if not evaluator.eval_tasks:
        raise ConfigurationError(
            f"nothing to evaluate: no task of {provider.name} has a split {dataset_cfg.split!r} and metrics "
            "(metric_fns); pick another SPLIT or task"
        )
    names = [task.name for task in evaluator.eval_tasks]
    if not dataset_cfg.task_feature_lengths:
        dataset_cfg = dataclasses.replace(dataset_cfg, task_feature_lengths=_longest(evaluator))
        if writes:
            print(
                "[t5x-launch] eval: TASK_FEATURE_LENGTHS not set; the split's longest examples: "
                f"{dict(dataset_cfg.task_feature_lengths)}",
                flush=True,
            )

    def pending() -> list[int | None]:
        if single:
            return [None]
        if steps == "all":
            done = logged_steps(out, names)
            return [s for s in complete_steps(model_dir) if s not in done]
        return [steps if isinstance(steps, int) else None]

    callables = ModelCallables(
        model, partitioner, dataset_cfg.batch_size, seed=random_seed, decode_kwargs=decode_kwargs
    )
    results: list[JobResult] = []
    evaluated: set[int] = set()
    try:
        wanted = pending()
        while wanted:
            for step in wanted:
                results.append(
                    _evaluate_step(
                        model, partitioner, converter, dataset_cfg, evaluator, provider, str(path),
                        step, random_seed, callables, show_predictions, str(out),
                    )
                )  # fmt: skip
                # The folder's step and the step its state holds (the same, unless a folder was renamed).
                evaluated.update({results[-1].step} | ({step} if step is not None else set()))
            # Checkpoints saved meanwhile ("all"), never one evaluated here already.
            wanted = [s for s in pending() if s not in evaluated] if steps == "all" else []
    finally:
        evaluator.close()
    if steps == "all" and not results and writes:
        print(f"[t5x-launch] eval: every checkpoint in {model_dir} is already in {out}", flush=True)
    return results


def _evaluate_step(
    model: Any,
    partitioner: Any,
    converter: Any,
    cfg: DatasetConfig,
    evaluator: Any,
    provider: Any,
    checkpoint: str,
    step: int | None,
    seed: int,
    callables: ModelCallables,
    show_predictions: int,
    output_dir: str,
) -> JobResult:
    import jax

    params, restored = restore_params(model, partitioner, converter, cfg, checkpoint, step, seed)
    check_task_fits(model, provider, cfg.task_feature_lengths, checkpoint, params)
    callables.params = params
    reports = run_evaluator(evaluator, callables, restored)
    if jax.process_index() == 0:
        _print_inference(reports, show_predictions)
    return JobResult(step=restored, inference=reports, model_dir=output_dir)


def run_evaluator(evaluator: Any, callables: ModelCallables, step: int) -> list[InferenceReport]:
    """Runs the Evaluator with ``callables``' current params; one report per task (with progress lines)."""
    import jax

    progress: dict[tuple[str, str], DecodeProgress] = {}

    def on_batch(task: str, kind: str, done: int, total: int) -> None:
        key = (task, kind)
        if key not in progress:
            verb = "decoded" if kind == "predict" else "scored"
            progress[key] = DecodeProgress((), task, total=total, verb=verb)
        progress[key].advance_to(done, final=done >= total)

    future = evaluator.evaluate(
        compute_metrics=jax.process_index() == 0,
        step=step,
        predict_with_aux_fn=callables.predict_with_aux,
        score_fn=callables.score,
        on_batch=on_batch,
    )
    metrics = future.result() if future is not None else {}
    return [_report(evaluator, task, metrics.get(task.name, {})) for task in evaluator.eval_tasks]
