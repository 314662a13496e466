"""The job behind ``t5x-launch train``, and what the eval and infer jobs share with it.

Each job takes its components as arguments (gin fills them in), checks them
against their contracts, and runs a loop from ``t5x.training``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from t5x import interfaces
from t5x.launch._assembly import check_components, check_vocabularies, feature_converter_for, get_provider
from t5x.launch._configs import CheckpointConfig, DatasetConfig, RestoreCheckpointConfig
from t5x.launch._errors import ConfigurationError
from t5x.launch._inference import InferenceReport
from t5x.launch._model_dir_lock import LOCK_NAME, ModelDirInUseError, ModelDirLock, acquire_model_dir_lock
from t5x.launch._platform import apply_cpu_kernels_override
from t5x.launch._preemption import Preempted
from t5x.launch._run_folder import new_model_dir, undo_early_failure


@dataclasses.dataclass
class JobResult:
    """What a job did, for the CLI to report and tests to check.

    Attributes:
      step: the train state's step at the end.
      losses: ``{step: loss}`` of the steps run here (train only).
      eval_metrics: dataset -> metric -> value (teacher-forced).
      inference: per-task inference metrics and example predictions.
      model_dir: where checkpoints, config.gin and metrics went.
      stop_reason: the train loop's (``"completed"``, ``"action"``, ...).
      stopped_by: the action that ended training early, with its mode.
    """

    step: int
    losses: dict[int, float] = dataclasses.field(default_factory=dict)
    eval_metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    inference: list[InferenceReport] = dataclasses.field(default_factory=list)
    model_dir: str = ""
    stop_reason: str = "completed"
    stopped_by: str | None = None


def _default_partitioner(partitioner: Any) -> Any:
    if partitioner is not None:
        return partitioner
    from t5x.partitioning import PjitPartitioner

    return PjitPartitioner(num_partitions=1)


def _default_optimizer(optimizer: Any) -> Any:
    if optimizer is not None:
        return optimizer
    from t5x.training import adafactor

    return adafactor()


def _iterator(
    model: Any, cfg: DatasetConfig, partitioner: Any, seed: int, *, train: bool
) -> tuple[Any, Any, Any]:
    import t5x.tasks

    provider = get_provider(cfg)
    check_vocabularies(model, provider)
    converter = feature_converter_for(model, pack=cfg.pack and train)
    layout = partitioner.get_data_layout(cfg.batch_size)
    iterator = t5x.tasks.get_input_iterator(
        provider,
        converter,
        cfg.task_feature_lengths,
        layout.per_shard_batch_size,
        split=cfg.split,
        shard_info=layout.shard_info,
        seed=cfg.seed if cfg.seed is not None else seed,
        shuffle=cfg.shuffle and train,
        num_epochs=None if train else 1,
        drop_remainder=train,
    )
    return provider, converter, iterator


def _input_shapes(converter: Any, cfg: DatasetConfig) -> dict[str, tuple[int, ...]]:
    lengths = converter.get_model_feature_lengths(cfg.task_feature_lengths)
    return {name: (cfg.batch_size, length) for name, length in lengths.items()}


def _writers(model_dir: pathlib.Path, total_steps: int | None) -> Any:
    from t5x.training import ConsoleWriter, JsonlWriter, MultiWriter, TensorBoardWriter

    return MultiWriter(
        [
            TensorBoardWriter(str(model_dir / "train")),
            JsonlWriter(str(model_dir / "metrics.jsonl")),
            ConsoleWriter(total_steps=total_steps, stream=sys.stdout),  # plain lines when not a terminal
        ]
    )


def _write_model_info(directory: pathlib.Path, initialized: Any) -> None:
    """Writes ``model-info.txt``: every parameter and optimizer slot with its axes and partitioning."""
    import jax

    from t5x.checkpointing import write_model_info

    axes = interfaces.unflatten(
        {path: tuple(names) for path, names in (initialized.params_axes or {}).items()}
    )
    specs = jax.tree.map(lambda sharding: tuple(sharding.spec), initialized.shardings.params)
    if jax.process_index() == 0:
        path = directory / "model-info.txt"
        try:
            write_model_info(str(path), initialized.state.state_dict(), {"target": axes}, {"target": specs})
        except OSError as error:
            raise OSError(error.errno, f"cannot write {path}: {error.strerror}") from None


@contextlib.contextmanager
def _model_dir_lock(directory: pathlib.Path) -> Iterator[ModelDirLock | None]:
    """Holds the model folder's trainer lock on process 0 (None elsewhere) while inside.

    When process 0 cannot take it, every process raises, so that none of them
    trains alone.
    """
    import jax

    lock: ModelDirLock | None = None
    failure: BaseException | None = None
    if jax.process_index() == 0:
        try:
            lock = acquire_model_dir_lock(directory)
        except Exception as error:  # told to the other processes before it is raised
            failure = error
    if jax.process_count() > 1:
        import numpy as np
        from jax.experimental import multihost_utils

        locked = bool(multihost_utils.broadcast_one_to_all(np.int32(failure is None)))
        if not locked and failure is None:
            failure = ModelDirInUseError(
                f"process 0 could not take the lock of the model folder {directory} (see its output)",
                directory / LOCK_NAME,
                {},
            )
    if failure is not None:
        raise failure
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


def load_initial_params(trainer: Any, path: str, *, keep_step: bool = False) -> int:
    """Starts ``trainer`` from a checkpoint's parameters, keeping its fresh optimizer state.

    The restore rule of fine-tuning and of every adaptation recipe: only
    ``target`` (the parameters) is read into the model's own structure, cast to
    its dtypes and placed with its shardings; optimizer slots are not restored.
    Since the rule is by parameter name and shape, a checkpoint of a non-causal
    decoder loads into a causal one (and back): the attention mask is the
    model's, not the checkpoint's.

    Args:
      trainer: a ``t5x.training.Trainer`` whose state is replaced.
      path: a ``checkpoint_<step>`` folder or a model folder (latest step).
      keep_step: also set the state's step to the checkpoint's (the run counts
        on from there); otherwise the step stays as it is (0 for a new run).

    Returns:
      The checkpoint's step.

    Raises:
      ValueError: a parameter of the model is missing from the checkpoint or has
        another shape (names the parameter and both shapes).
    """
    import jax

    from t5x.checkpointing import load_t5x_checkpoint

    state = load_t5x_checkpoint(path)
    params = state["target"]
    expected = trainer.state.params
    flat_expected = jax.tree_util.tree_flatten_with_path(expected)[0]
    flat_found = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    for key_path, leaf in flat_expected:
        found = flat_found.get(key_path)
        name = "/".join(str(getattr(k, "key", k)) for k in key_path)
        if found is None:
            raise ValueError(f"initial checkpoint {path} has no parameter {name}")
        if tuple(found.shape) != tuple(leaf.shape):
            raise ValueError(
                f"initial checkpoint {path}: parameter {name} has shape {tuple(found.shape)}, the model expects {tuple(leaf.shape)}"
            )
    placed = jax.tree.map(
        lambda value, like, sharding: jax.device_put(value.astype(like.dtype), sharding),
        params,
        expected,
        trainer.state_shardings.params,
    )
    trainer.state = trainer.state.replace_params(placed)
    step = int(state["state"]["step"])
    if keep_step:
        like = trainer.state.step
        value = jax.device_put(jax.numpy.asarray(step, like.dtype), trainer.state_shardings.step)
        trainer.state = dataclasses.replace(trainer.state, step=value)
    return step


_STEP_FOLDER = re.compile(r"checkpoint_(\d+)")


def _flat_names(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"target/a/b": leaf}`` for a nested state dict (empty slots left out)."""
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat_names(value, f"{prefix}{key}/"))
        return out
    return {prefix[:-1]: tree}


def _find_checkpoint(cfg: RestoreCheckpointConfig) -> tuple[str, int] | None:
    """``(model folder, step)`` of the first path of ``cfg`` holding a checkpoint, or None."""
    from t5x.checkpointing import Checkpointer

    for path in cfg.paths:
        folder = pathlib.Path(path)
        match = _STEP_FOLDER.fullmatch(folder.name)
        if match and folder.is_dir():
            return str(folder.parent), int(match.group(1))
        if cfg.mode == "specific":
            if folder.exists():
                raise ConfigurationError(
                    f"RestoreCheckpointConfig.path {path!r}: mode 'specific' needs a checkpoint_<step> "
                    "folder; for a model folder's newest checkpoint use mode='latest'"
                )
            continue
        latest = Checkpointer(folder, async_save=False).latest_step() if folder.is_dir() else None
        if latest is not None:
            return str(folder), latest
    return None


def restore_initial_state(trainer: Any, cfg: RestoreCheckpointConfig) -> int | None:
    """Starts ``trainer`` from the checkpoint ``cfg`` names (upstream's RestoreCheckpointConfig rules).

    Parameters, optimizer slots and the step are read into the model's own
    structure, dtypes and shardings, after ``cfg.assignment_map``; what the
    map drops, and (with ``strict=False`` / ``fallback_to_scratch``) what the
    checkpoint lacks, keeps ``trainer``'s fresh value.

    Returns:
      The checkpoint's step, or None when no path holds a checkpoint and
      ``fallback_to_scratch`` let the run start from scratch.

    Raises:
      ConfigurationError: mode 'all'; no checkpoint at the paths; a parameter
        or (``strict``) optimizer slot missing or of another shape (each named).
    """
    from t5x.checkpointing import Checkpointer

    if cfg.mode == "all":
        raise ConfigurationError(
            "RestoreCheckpointConfig.mode='all' is for evaluation; training starts from one checkpoint "
            "(mode='latest' or 'specific')"
        )
    found = _find_checkpoint(cfg)
    if found is None:
        if cfg.fallback_to_scratch:
            print(
                f"[t5x-launch] warning: no checkpoint at {cfg.paths}; training from scratch "
                "(RestoreCheckpointConfig.fallback_to_scratch)",
                file=sys.stderr,
                flush=True,
            )
            return None
        raise ConfigurationError(
            f"RestoreCheckpointConfig.path {cfg.paths or cfg.path!r} holds no checkpoint (mode {cfg.mode!r}); "
            "give a checkpoint_<step> folder or a model folder with checkpoints, or set "
            "fallback_to_scratch=True to train from scratch"
        )
    model_dir, step = found
    where = os.path.join(model_dir, f"checkpoint_{step}")
    reader = Checkpointer(model_dir, restore_dtype=cfg.dtype, async_save=False)
    stored = {name: leaf for name, leaf in _flat_names(reader.restore(step, lazy=True).state).items()}
    rules = [(pattern, replacement) for pattern, replacement in (cfg.assignment_map or ())]
    fresh: list[str] = []
    missing_params: list[str] = []
    missing_slots: list[str] = []
    for name, leaf in _flat_names(trainer.state.state_dict()).items():
        key: str | None = name
        for pattern, replacement in rules:
            if re.fullmatch(pattern, name):
                key = None if replacement is None else re.sub(pattern, replacement, name)
                break
        if key is None:
            continue  # the map keeps it fresh
        source = stored.get(key)
        same = source is not None and tuple(getattr(source, "shape", ())) == tuple(getattr(leaf, "shape", ()))
        if same:
            continue
        shown = name if key == name else f"{name} (checkpoint name {key})"
        if source is not None and not name.startswith("state/"):
            raise ConfigurationError(
                f"{where}: parameter {shown} has shape {tuple(source.shape)}, the model expects "
                f"{tuple(leaf.shape)}"
            )
        if name == "state/step":
            fresh.append(name)
        elif name.startswith("state/"):
            (missing_slots if cfg.strict else fresh).append(name)
        else:
            (fresh if cfg.fallback_to_scratch else missing_params).append(name)
    if missing_params:
        raise ConfigurationError(
            f"{where} has no parameter {missing_params[0]}"
            + (f" (and {len(missing_params) - 1} more)" if len(missing_params) > 1 else "")
            + "; map it with RestoreCheckpointConfig.assignment_map, or set fallback_to_scratch=True "
            "to initialise missing parameters fresh"
        )
    if missing_slots:
        raise ConfigurationError(
            f"{where} has no optimizer slot {missing_slots[0]} of this shape"
            + (f" (and {len(missing_slots) - 1} more)" if len(missing_slots) > 1 else "")
            + " (saved with another optimizer?); set RestoreCheckpointConfig.strict=False to start "
            "those slots fresh, or assignment_map=[(r'state/param_states/.*', None)] for a fresh optimizer"
        )
    if any(not n.startswith("state/") for n in fresh):
        names = [n for n in fresh if not n.startswith("state/")]
        print(
            f"[t5x-launch] warning: {len(names)} parameters are not in {where} and start fresh "
            f"(fallback_to_scratch): {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}",
            file=sys.stderr,
            flush=True,
        )
    restored = reader.restore(
        step,
        target=trainer.state,
        shardings=trainer.state_shardings,
        assignment_map=[(re.escape(name), None) for name in fresh] + rules,
    )
    state = restored.state
    if cfg.dtype is not None:
        import jax

        # Values pass through ``dtype``; the train state keeps the model's dtypes (the compiled step's).
        state = dict(state)
        state["target"] = jax.tree.map(
            lambda value, like: value.astype(like.dtype), state["target"], trainer.state.params
        )
    trainer.state = trainer.state.restore_state(state)
    return step


def _print_stop(result: Any) -> None:
    if result.stop_reason in ("action", "early_stopping"):
        print(
            f"[t5x-launch] training stopped at step {result.step} by {result.stopped_by}; "
            "checkpoint saved (a normal end)",
            flush=True,
        )


def train(
    *,
    model: Any,
    train_dataset_cfg: DatasetConfig,
    model_dir: str,
    total_steps: int,
    partitioner: Any = None,
    optimizer: Any = None,
    learning_rate_fn: Callable[[Any], Any] | None = None,
    checkpoint_cfg: CheckpointConfig | None = None,
    eval_period: int | None = None,
    eval_batches: int | None = None,
    train_eval_dataset_cfg: DatasetConfig | None = None,
    infer_eval_dataset_cfg: DatasetConfig | None = None,
    max_inference_examples: int | None = None,
    random_seed: int = 0,
    num_microbatches: int | None = None,
    log_period: int = 10,
    show_predictions: int = 0,
    actions: Mapping[Any, Sequence[Any]] | None = None,
    run_eval_before_training: bool = False,
    gc_period: int = 0,
) -> JobResult:
    """Pretrains or fine-tunes ``model``, resuming from ``model_dir`` when it has checkpoints.

    Args:
      model: a Model.
      train_dataset_cfg: the training data.
      model_dir: checkpoints, ``config.gin``, ``model-info.txt`` and metrics go here.
      total_steps: the step to stop at.
      partitioner: default ``PjitPartitioner(num_partitions=1)``.
      optimizer: any Optax transformation (default T5X Adafactor).
      learning_rate_fn: step -> learning rate (None: the optimizer's own).
      checkpoint_cfg: save period, retention and the initial checkpoint
        (default ``CheckpointConfig()``; its ``save`` / ``restore`` take a
        SaveCheckpointConfig / RestoreCheckpointConfig).
      eval_period: steps between evaluations, teacher-forced and inference
        (None: at the end only).
      eval_batches: batches per teacher-forced evaluation (upstream's
        ``eval_steps``; None: the whole split).
      train_eval_dataset_cfg: data for teacher-forced evaluation.
      infer_eval_dataset_cfg: data for inference evaluation (decode and the
        task's metrics) every ``eval_period`` steps and at the end.
      max_inference_examples: at most this many examples for inference evaluation.
      random_seed: seeds initialisation, dropout and (by default) the data.
      num_microbatches: gradient accumulation.
      log_period: steps between metric writes.
      show_predictions: print this many predictions next to their targets
        (after the last inference evaluation).
      actions: ``{"TRAIN" | "TRAIN_EVAL" | "INFER_EVAL": [action, ...]}``
        (``t5x.training.EarlyStoppingAction``, ``TerminateOnNanAction`` or
        any object with ``run(step, metrics_by_task) -> bool``); an action
        returning True ends training with a checkpoint and a line saying so.
      run_eval_before_training: evaluate once before the first step.
      gc_period: collect garbage every this many steps with automatic
        collection off (0: Python's default).

    Only one trainer writes into a model folder: this one holds the lock file
    ``train.lock`` there while it runs (see ``t5x.launch._model_dir_lock``) and
    then removes the temporary folders of saves that crashed trainers left.

    Returns:
      A JobResult.

    Raises:
      ModelDirInUseError: another live trainer holds the model folder's lock.
      Preempted: a SIGTERM or SIGINT stopped training after the current step;
        its checkpoint is saved (``Preempted.step``), so the same call resumes.
    """
    import t5x.training
    from t5x.checkpointing import Checkpointer

    apply_cpu_kernels_override(model, os.environ)  # T5X_CPU_KERNELS, T5X_CACHE_DIR, CXX
    partitioner = _default_partitioner(partitioner)
    optimizer = _default_optimizer(optimizer)
    checkpoint_cfg = checkpoint_cfg or CheckpointConfig()
    save_cfg = checkpoint_cfg.save_config()
    restore_cfg = checkpoint_cfg.restore_config()
    by_best = bool(save_cfg.metric_name_to_monitor)
    directory = pathlib.Path(model_dir)
    # A run failing before its first checkpoint removes what it wrote and the folders it made.
    with (
        new_model_dir(directory),
        _model_dir_lock(directory) as lock,
        undo_early_failure(directory, held=lock is not None, keep=(LOCK_NAME,)),
    ):
        _, converter, train_iter = _iterator(model, train_dataset_cfg, partitioner, random_seed, train=True)
        checkpointer = Checkpointer(
            directory,
            keep=None if by_best else save_cfg.keep,  # the best-checkpoint rule deletes itself
            keep_every=save_cfg.keep_every,
            save_dtype=save_cfg.dtype,
        )
        if lock is not None:
            checkpointer.remove_abandoned_saves()  # only the lock's holder may
        check_components(
            model=model,
            partitioner=partitioner,
            checkpointer=checkpointer,
            feature_converter=converter,
            train_iterator=train_iter,
        )

        initialized = t5x.training.init_train_state(
            model, optimizer, partitioner, _input_shapes(converter, train_dataset_cfg), seed=random_seed
        )
        _write_model_info(directory, initialized)
        trainer = t5x.training.Trainer(
            model,
            partitioner,
            initialized.state,
            initialized.shardings,
            learning_rate_fn=learning_rate_fn,
            num_microbatches=num_microbatches,
            seed=random_seed,
            peak_flops=None,
        )
        if restore_cfg is not None and checkpointer.latest_step() is None:
            restore_initial_state(trainer, restore_cfg)

        eval_sources = {}
        if train_eval_dataset_cfg is not None:
            eval_cfg = train_eval_dataset_cfg

            def eval_batches_fn() -> Any:
                return _iterator(model, eval_cfg, partitioner, random_seed, train=False)[2]

            eval_sources[eval_cfg.mixture_or_task_name] = eval_batches_fn
        writer = _writers(directory, total_steps)
        loop_checkpointer: Any = checkpointer
        loop_writer: Any = writer
        if by_best:
            from t5x.launch._best_checkpoints import BestCheckpointKeeper, MetricRecorder
            from t5x.training import MultiWriter

            recorder = MetricRecorder(str(save_cfg.metric_name_to_monitor), directory / "metrics.jsonl")
            loop_checkpointer = BestCheckpointKeeper(
                checkpointer,
                recorder,
                keep=int(save_cfg.keep or 1),
                mode=save_cfg.metric_mode,
                keep_without_metrics=save_cfg.keep_checkpoints_without_metrics,
                keep_every=save_cfg.keep_every,
            )
            loop_writer = MultiWriter([writer, recorder])
        inference_eval = None
        if infer_eval_dataset_cfg is not None:
            from t5x.launch._eval_job import TrainingInferenceEval

            inference_eval = TrainingInferenceEval(
                model,
                partitioner,
                infer_eval_dataset_cfg,
                directory / "inference_eval",
                max_examples=max_inference_examples,
                writer=loop_writer,
                seed=random_seed,
            )

        try:
            result = t5x.training.train(
                trainer,
                train_iter,
                total_steps=total_steps,
                checkpointer=loop_checkpointer,
                checkpoint_period=save_cfg.period,
                checkpoint_steps=save_cfg.checkpoint_steps,
                eval_sources=eval_sources or None,
                eval_period=eval_period,
                eval_batches=eval_batches,
                inference_eval=inference_eval,
                metric_writer=loop_writer,
                log_period=log_period,
                actions=actions,
                run_eval_before_training=run_eval_before_training,
                gc_period=gc_period,
            )
            loop_checkpointer.wait_until_finished()
            if result.signal is not None:
                raise Preempted(result.signal, step=result.step)
            reports = inference_eval.reports if inference_eval is not None else []
            job = JobResult(
                step=result.step,
                losses=result.losses,
                eval_metrics=result.eval_metrics,
                inference=list(reports),
                model_dir=str(directory),
                stop_reason=result.stop_reason,
                stopped_by=result.stopped_by,
            )
            if show_predictions:
                _print_examples(reports, show_predictions)
            _print_stop(result)
        finally:
            if inference_eval is not None:
                inference_eval.close()
            checkpointer.close()
            writer.close()
    return job


def _print_inference(reports: list[InferenceReport], show: int, step: int | None = None) -> None:
    at = "" if step is None else f" step {step}:"
    for report in reports:
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(report.metrics.items()))
        print(f"[inference eval]{at} {report.task} ({report.num_examples} examples): {metrics}", flush=True)
    _print_examples(reports, show)


def _print_examples(reports: list[InferenceReport], show: int) -> None:
    for report in reports:
        for example in report.examples[:show]:
            mark = "✓" if example["prediction"] == example["target"] else "✗"
            print(
                f"  {mark} input: {example['input']!r}\n    target: {example['target']!r}\n    prediction: {example['prediction']!r}"
            )
    sys.stdout.flush()


def _restore_params(
    model: Any,
    partitioner: Any,
    converter: Any,
    cfg: DatasetConfig,
    checkpoint_path: str,
    step: int | None,
    seed: int,
) -> tuple[Any, int]:
    """Loads parameters of ``step`` (the latest when None) from a model or step folder."""
    import jax

    import t5x.training
    from t5x.checkpointing import load_t5x_checkpoint

    initialized = t5x.training.init_train_state(
        model, t5x.training.sgd(0.0), partitioner, _input_shapes(converter, cfg), seed=seed, materialize=False
    )
    state = load_t5x_checkpoint(checkpoint_path, step=step)
    params = jax.tree.map(
        lambda value, like, sharding: jax.device_put(value.astype(like.dtype), sharding),
        state["target"],
        initialized.shapes.params,
        initialized.shardings.params,
    )
    return params, int(state["state"]["step"])
