"""Upstream's ``train`` / ``evaluate`` / ``infer`` scripts' keywords, run by t5x-launch's jobs.

Upstream run files call these as ``train_script.train`` (``import __main__ as
train_script``). Each keyword is either carried over to the launch job, accepted
and ignored where it cannot change the run's result (logged when set to
something other than upstream's default), or refused by name with what to do
instead (:class:`UnsupportedUpstreamOption`).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t5x import checkpoints, launch, optimizers, trainer, utils
from t5x.launch import ConfigurationError, JobResult

_LOG = logging.getLogger("t5x.upstream")


class UnsupportedUpstreamOption(ConfigurationError):
    """An upstream keyword or value whose meaning t5x-launch does not implement (named in the message)."""


def _refuse(option: str, value: Any, instead: str) -> UnsupportedUpstreamOption:
    return UnsupportedUpstreamOption(
        f"upstream option {option}={value!r} is not supported by t5x-launch: {instead}"
    )


def _ignored(option: str, value: Any, why: str) -> None:
    _LOG.warning("upstream option %s=%r is accepted and ignored: %s", option, value, why)


def _unwrapped(fn: Any) -> Any:
    """The function gin wrapped (a ``@name`` reference passes gin's wrapper)."""
    return inspect.unwrap(fn) if callable(fn) else fn


def _is_default(fn: Any, *defaults: Callable[..., Any]) -> bool:
    return fn is None or _unwrapped(fn) in defaults


# ---- data -------------------------------------------------------------------------------------


def _task_name(name: Any) -> str:
    if isinstance(name, str):
        return name
    found = getattr(name, "name", None)
    if isinstance(found, str):
        return found  # a Task or Mixture object, as upstream allows
    raise ConfigurationError(f"DatasetConfig.mixture_or_task_name must name a task or mixture, got {name!r}")


def _longest_lengths(cfg: utils.DatasetConfig) -> dict[str, int]:
    """Upstream's ``task_feature_lengths=None``: the longest example of each feature in the split."""
    import importlib

    import numpy as np

    import t5x.tasks

    if cfg.module:
        importlib.import_module(cfg.module)
    provider = t5x.tasks.get_mixture_or_task(_task_name(cfg.mixture_or_task_name))
    dataset = provider.get_dataset(
        sequence_length=None, split=cfg.split, use_cached=cfg.use_cached, shuffle=False, num_epochs=1
    )
    longest = dict.fromkeys(provider.output_features, 0)
    for example in dataset.as_numpy_iterator():
        for name in longest:
            value = example.get(name)
            if value is not None and np.ndim(value) == 1:
                longest[name] = max(longest[name], len(value))
    found = {name: length for name, length in longest.items() if length > 0}
    if not found:
        raise ConfigurationError(
            f"task_feature_lengths=None: split {cfg.split!r} of {_task_name(cfg.mixture_or_task_name)} "
            "has no examples to measure; set TASK_FEATURE_LENGTHS"
        )
    return found


def dataset_config(cfg: Any, *, who: str, measure: bool) -> launch.DatasetConfig:
    """t5x-launch's DatasetConfig for an upstream ``utils.DatasetConfig`` (launch's own passes through).

    Args:
      cfg: the dataset configuration.
      who: the keyword it came from, for messages (``train_dataset_cfg``).
      measure: ``task_feature_lengths=None`` is measured from the data (evaluation
        and inference); otherwise it is refused.
    """
    if isinstance(cfg, launch.DatasetConfig):
        return cfg
    if not isinstance(cfg, utils.DatasetConfig):
        raise ConfigurationError(f"{who} must be a utils.DatasetConfig, got {type(cfg).__name__}")
    if not cfg.trim_output_features:
        raise _refuse(
            f"{who}.trim_output_features", False, "features are always trimmed to task_feature_lengths"
        )
    if cfg.use_custom_packing_ops:
        _ignored(f"{who}.use_custom_packing_ops", True, "t5x-launch packs with its own (exact) packer")
    lengths = cfg.task_feature_lengths
    if lengths is None:
        if not measure:
            raise _refuse(
                f"{who}.task_feature_lengths", None, "training needs lengths, e.g. TASK_FEATURE_LENGTHS"
            )
        lengths = _longest_lengths(cfg)
        _LOG.info("%s: task_feature_lengths=None measured as %s", who, lengths)
    return launch.DatasetConfig(
        mixture_or_task_name=_task_name(cfg.mixture_or_task_name),
        task_feature_lengths=dict(lengths),
        split=cfg.split,
        batch_size=cfg.batch_size,
        shuffle=cfg.shuffle,
        seed=cfg.seed,
        use_cached=cfg.use_cached,
        pack=cfg.pack,
        module=cfg.module,
    )


# ---- checkpoints ------------------------------------------------------------------------------


def _check_checkpointer_cls(option: str, cls: Any, *, best_ok: bool = False) -> None:
    if cls is None:
        return
    if isinstance(cls, type) and issubclass(cls, checkpoints.SaveBestCheckpointer) and not best_ok:
        raise _refuse(
            option,
            "SaveBestCheckpointer",
            "keeping the best checkpoint by a metric is not implemented; keep the newest with "
            "utils.SaveCheckpointConfig.keep",
        )
    if not (isinstance(cls, type) and issubclass(cls, checkpoints.Checkpointer)):
        raise _refuse(option, cls, "only checkpoints.Checkpointer (t5x-launch's checkpointer) is supported")


def _restore_path(restore: utils.RestoreCheckpointConfig, who: str) -> str | None:
    path = restore.path
    if isinstance(path, str):
        return path or None
    paths = list(path or [])
    if len(paths) > 1:
        raise _refuse(f"{who}.path", paths, "give one checkpoint (a checkpoint_<step> or model folder)")
    return paths[0] if paths else None


def _check_restore(restore: utils.RestoreCheckpointConfig, who: str) -> None:
    if restore.assignment_map is not None:
        raise _refuse(
            f"{who}.assignment_map",
            restore.assignment_map,
            "checkpoints restore by parameter name; convert the checkpoint first (t5x-launch convert)",
        )
    if restore.fallback_to_scratch:
        raise _refuse(
            f"{who}.fallback_to_scratch", True, "every parameter of the model must be in the checkpoint"
        )
    if restore.state_transformation_fns:
        raise _refuse(f"{who}.state_transformation_fns", restore.state_transformation_fns, "not implemented")
    if restore.restore_dataset:
        raise _refuse(f"{who}.restore_dataset", True, "an initial checkpoint's data position is not restored")
    _check_checkpointer_cls(f"{who}.checkpointer_cls", restore.checkpointer_cls)


def _bound(cls: Any) -> dict[str, Any]:
    """The keywords gin binds to a configurable class reference (empty when none)."""
    import gin

    for candidate in getattr(cls, "__mro__", (cls,)):
        try:
            return dict(gin.get_bindings(candidate))
        except (ValueError, TypeError, KeyError):
            continue
    return {}


def _launch_metric_name(name: str) -> str:
    """Upstream's ``<summary folder>/<tag>`` metric name as t5x-launch writes it to metrics.jsonl."""
    if name.startswith("training_eval/"):
        return name[len("training_eval/") :]  # teacher-forced: <task>/<metric>
    if name.startswith("train/"):
        return name[len("train/") :]  # train scalars carry no prefix
    return name  # inference_eval/<task>/<metric> is the same


def _save_config(save: utils.SaveCheckpointConfig, total_steps: int) -> launch.SaveCheckpointConfig:
    _check_checkpointer_cls("SaveCheckpointConfig.checkpointer_cls", save.checkpointer_cls, best_ok=True)
    if save.state_transformation_fns:
        raise _refuse(
            "SaveCheckpointConfig.state_transformation_fns", save.state_transformation_fns, "not implemented"
        )
    # save_dataset: t5x-launch's checkpoints always hold the input position, so either value resumes.
    best: dict[str, Any] = {}
    cls = save.checkpointer_cls
    if isinstance(cls, type) and issubclass(cls, checkpoints.SaveBestCheckpointer):
        bound = {**checkpoints.SaveBestCheckpointer.DEFAULTS, **_bound(cls)}
        if bound.get("force_keep_period"):
            _ignored(
                "SaveBestCheckpointer.force_keep_period",
                bound["force_keep_period"],
                "steps divisible by it are not kept apart from the best and the newest",
            )
        best = dict(
            metric_name_to_monitor=_launch_metric_name(str(bound["metric_name_to_monitor"])),
            metric_mode=bound["metric_mode"],
            keep_checkpoints_without_metrics=bool(bound["keep_checkpoints_without_metrics"]),
        )
    return launch.SaveCheckpointConfig(
        dtype=save.dtype,
        period=save.period or total_steps,
        keep=save.keep if save.keep is not None or not best else 1,
        checkpoint_steps=list(save.checkpoint_steps or ()) or None,
        **best,
    )


def _restore_config(restore: utils.RestoreCheckpointConfig) -> launch.RestoreCheckpointConfig | None:
    """Upstream's restore rules for a new training run (None: from scratch, upstream's ``path=[]``)."""
    who = "RestoreCheckpointConfig"
    if restore.mode == "all":
        raise _refuse(f"{who}.mode", "all", "training starts from one checkpoint")
    if restore.state_transformation_fns:
        raise _refuse(f"{who}.state_transformation_fns", restore.state_transformation_fns, "not implemented")
    if restore.restore_dataset:
        raise _refuse(f"{who}.restore_dataset", True, "an initial checkpoint's data position is not restored")
    _check_checkpointer_cls(f"{who}.checkpointer_cls", restore.checkpointer_cls)
    paths = [restore.path] if isinstance(restore.path, str) else list(restore.path or [])
    paths = [str(p) for p in paths if p]
    if not paths:
        return None
    # The whole train state (parameters, optimizer slots, step), as upstream restores it.
    return launch.RestoreCheckpointConfig(
        path=paths[0] if len(paths) == 1 else paths,
        mode=restore.mode,
        assignment_map=[(str(p), r) for p, r in restore.assignment_map] if restore.assignment_map else None,
        strict=restore.strict,
        fallback_to_scratch=restore.fallback_to_scratch,
        dtype=restore.dtype,
    )


def checkpoint_config(cfg: utils.CheckpointConfig | None, total_steps: int) -> launch.CheckpointConfig:
    """t5x-launch's CheckpointConfig for upstream's save / restore pair (for training)."""
    save = cfg.save if cfg is not None else None
    restore = cfg.restore if cfg is not None else None
    return launch.CheckpointConfig(
        save=_save_config(save or utils.SaveCheckpointConfig(dtype=None), total_steps),
        restore=_restore_config(restore) if restore is not None else None,
    )


# ---- trainer, actions, evaluator --------------------------------------------------------------


def _trainer_settings(trainer_cls: Any) -> trainer.Trainer:
    if trainer_cls is None:
        return trainer.Trainer()
    if isinstance(trainer_cls, trainer.Trainer):
        return trainer_cls
    if isinstance(trainer_cls, type) and issubclass(trainer_cls, trainer.Trainer):
        return trainer_cls()  # gin injects learning_rate_fn and num_microbatches
    raise _refuse(
        "trainer_cls", trainer_cls, "use trainer.Trainer (its learning_rate_fn and num_microbatches)"
    )


def _check_actions(actions: Mapping[Any, Sequence[Any]] | None) -> dict[str, list[Any]]:
    """Upstream's ``{mode: [action, ...]}`` for t5x-launch's loop (which runs them as upstream does).

    ``trainer.BaseAction`` subclasses (upstream's and a user's own) are called
    ``run(train_state, metrics_by_task)``; any other object needs t5x.training's
    ``run(step, metrics_by_task)``.
    """
    out: dict[str, list[Any]] = {}
    for mode, listed in (actions or {}).items():
        name = getattr(mode, "name", mode)
        if name not in trainer.ActionMode.__members__:
            raise ConfigurationError(
                f"actions: unknown mode {mode!r}; expected one of {list(trainer.ActionMode.__members__)}"
            )
        for action in listed:
            if not callable(getattr(action, "run", None)):
                raise ConfigurationError(
                    f"actions[{name!r}]: {type(action).__name__} has no run method "
                    "(subclass trainer.BaseAction and define run(train_state, metrics_by_task))"
                )
        out.setdefault(str(name), []).extend(listed)
    return out


def _evaluator_examples(evaluator_cls: Any) -> int | None:
    """``num_examples`` bound to an upstream ``seqio.Evaluator`` reference (None: all)."""
    if evaluator_cls is None:
        return None
    import gin

    # A ``@seqio.Evaluator`` reference passes gin's subclass; the bindings are the class's own.
    for candidate in getattr(evaluator_cls, "__mro__", (evaluator_cls,)):
        try:
            return gin.get_bindings(candidate).get("num_examples")
        except (ValueError, TypeError, KeyError):
            continue
    return None


def _check_get_dataset_fn(get_dataset_fn: Callable[..., Any] | None) -> None:
    if _unwrapped(get_dataset_fn) is utils.get_deterministic_dataset:
        # Upstream's runs/pretrain_deterministic.gin: t5x-launch's pipeline already is.
        _LOG.info(
            "get_dataset_fn=get_deterministic_dataset: t5x-launch's input pipeline is deterministic by "
            "the run's seed and restarts at the checkpointed position"
        )
    elif not _is_default(get_dataset_fn, utils.get_dataset):
        raise _refuse(
            "get_dataset_fn", get_dataset_fn, "t5x-launch builds the input pipeline from train_dataset_cfg"
        )


def _random_seed(random_seed: int | None) -> int:
    if random_seed is not None:
        return int(random_seed)
    from t5x.partitioning import broadcast_seed

    # Upstream's None: a fresh seed each run, the same on every process.
    seed = broadcast_seed(None) % 2**31
    _LOG.warning("random_seed=None: this run uses random seed %d", seed)
    return seed


# ---- the scripts ------------------------------------------------------------------------------


def train(
    *,
    model: Any,
    train_dataset_cfg: Any,
    train_eval_dataset_cfg: Any = None,
    infer_eval_dataset_cfg: Any = None,
    checkpoint_cfg: utils.CheckpointConfig | None = None,
    partitioner: Any = None,
    trainer_cls: Any = None,
    model_dir: str,
    total_steps: int,
    eval_steps: int = 20,
    eval_period: int = 1000,
    stats_period: int | None = None,
    random_seed: int | None = None,
    use_hardware_rng: bool = False,
    summarize_config_fn: Callable[..., Any] | None = None,
    inference_evaluator_cls: Any = None,
    get_dataset_fn: Callable[..., Any] | None = None,
    concurrent_metrics: bool = True,
    actions: Mapping[str, Sequence[Any]] | None = None,
    train_eval_get_dataset_fn: Callable[..., Any] | None = None,
    run_eval_before_training: bool = False,
    train_state_initializer_cls: Any = None,
    use_gda: bool = True,
    use_jax_array: bool = True,
    use_orbax: bool = False,
    verify_matching_vocabs_fn: Callable[..., Any] | None = None,
    gc_period: int = 0,
) -> JobResult:
    """Upstream's ``train.train`` keywords, trained by ``t5x.launch.train``.

    Returns:
      t5x-launch's JobResult (upstream returns ``(step, train_state)``).

    Raises:
      UnsupportedUpstreamOption: a keyword or value t5x-launch does not implement.
    """
    _check_get_dataset_fn(get_dataset_fn)
    if not _is_default(train_eval_get_dataset_fn, utils.get_dataset):
        raise _refuse(
            "train_eval_get_dataset_fn",
            train_eval_get_dataset_fn,
            "evaluation data comes from train_eval_dataset_cfg",
        )
    if train_state_initializer_cls is not None:
        raise _refuse(
            "train_state_initializer_cls", train_state_initializer_cls, "initialisation is t5x-launch's"
        )
    launch_actions = _check_actions(actions)
    if use_hardware_rng:
        _ignored("use_hardware_rng", True, "dropout and initialisation use JAX's default PRNG")
    settings = _trainer_settings(trainer_cls)
    train_cfg = dataset_config(train_dataset_cfg, who="train_dataset_cfg", measure=False)
    eval_cfg = (
        dataset_config(train_eval_dataset_cfg, who="train_eval_dataset_cfg", measure=False)
        if train_eval_dataset_cfg is not None
        else None
    )
    infer_cfg = (
        dataset_config(infer_eval_dataset_cfg, who="infer_eval_dataset_cfg", measure=True)
        if infer_eval_dataset_cfg is not None
        else None
    )
    return launch.train(
        model=model,
        train_dataset_cfg=train_cfg,
        model_dir=model_dir,
        total_steps=total_steps,
        partitioner=partitioner,
        # An upstream OptimizerDef (Adafactor, OptaxWrapper, ...) trains as its Optax form.
        optimizer=optimizers.to_optax(getattr(model, "optimizer_def", None)),
        learning_rate_fn=settings.learning_rate_fn,
        checkpoint_cfg=checkpoint_config(checkpoint_cfg, total_steps),
        eval_period=eval_period if (eval_cfg is not None or infer_cfg is not None) else None,
        eval_batches=eval_steps,
        train_eval_dataset_cfg=eval_cfg,
        infer_eval_dataset_cfg=infer_cfg,
        max_inference_examples=_evaluator_examples(inference_evaluator_cls),
        random_seed=_random_seed(random_seed),
        num_microbatches=settings.num_microbatches,
        log_period=stats_period or min(eval_period or total_steps, total_steps),
        actions=launch_actions or None,
        run_eval_before_training=run_eval_before_training,
        gc_period=gc_period,
    )


def _restore_for_reading(restore: Any, who: str) -> tuple[str, str | int]:
    """The checkpoint path and launch's ``steps`` for an upstream RestoreCheckpointConfig."""
    if not isinstance(restore, utils.RestoreCheckpointConfig):
        raise ConfigurationError(
            f"{who} must be a utils.RestoreCheckpointConfig, got {type(restore).__name__}"
        )
    _check_restore(restore, who)
    path = _restore_path(restore, who)
    if path is None:
        raise ConfigurationError(
            f"{who}.path is empty: set CHECKPOINT_PATH to a checkpoint_<step> or model folder"
        )
    return path, "all" if restore.mode == "all" else "latest"


def evaluate(
    *,
    model: Any,
    dataset_cfg: Any,
    restore_checkpoint_cfg: Any,
    partitioner: Any = None,
    output_dir: str,
    inference_evaluator_cls: Any = None,
    summarize_config_fn: Callable[..., Any] | None = None,
    train_state_initializer_cls: Any = None,
    fallback_init_rng: int | None = None,
    use_orbax: bool = False,
) -> list[JobResult]:
    """Upstream's ``eval.evaluate`` keywords, run by ``t5x.launch.evaluate`` (inference metrics).

    As upstream, seqio's files (``<task>-<step:06d>.jsonl``, ``<task>-metrics.jsonl``)
    and the TensorBoard events go to ``output_dir/inference_eval``.
    """
    if train_state_initializer_cls is not None:
        raise _refuse(
            "train_state_initializer_cls", train_state_initializer_cls, "initialisation is t5x-launch's"
        )
    if fallback_init_rng is not None:
        raise _refuse("fallback_init_rng", fallback_init_rng, "every parameter must come from the checkpoint")
    cfg = dataset_config(dataset_cfg, who="dataset_cfg", measure=True)
    results: list[JobResult] = []
    for path, steps in _checkpoints_to_evaluate(restore_checkpoint_cfg):
        results += launch.evaluate(
            model=model,
            dataset_cfg=cfg,
            checkpoint_path=path,
            output_dir=os.path.join(output_dir, "inference_eval"),
            steps=steps,
            partitioner=partitioner,
            max_examples=_evaluator_examples(inference_evaluator_cls),
        )
    return results


def _checkpoints_to_evaluate(restore: Any) -> list[tuple[str, str]]:
    """``(checkpoint path, launch's steps)`` per evaluation that upstream's restore config asks for.

    ``mode='specific'`` evaluates each path of ``path`` (a checkpoint_<step> folder each; a model
    folder gives its latest step), ``'latest'`` a model folder's newest step, and ``'all'`` every
    step of a model folder (resuming: steps already in the output folder are skipped).
    """
    if isinstance(restore, utils.RestoreCheckpointConfig) and restore.mode == "specific":
        paths = [restore.path] if isinstance(restore.path, str) else list(restore.path or [])
        if len(paths) > 1:
            _check_restore(restore, "RestoreCheckpointConfig")
            return [(str(p), "latest") for p in paths]
    path, steps = _restore_for_reading(restore, "RestoreCheckpointConfig")
    return [(path, str(steps))]


def infer(
    *,
    mode: str,
    model: Any,
    dataset_cfg: Any,
    restore_checkpoint_cfg: Any,
    partitioner: Any = None,
    output_dir: str,
    checkpoint_period: int = 100,
    shard_id: int = 0,
    num_shards: int = 1,
    merge_chunked_results: bool = True,
    write_fn: Callable[..., Any] | None = None,
    checkpoint_ds_iter: bool = True,
    fallback_init_rng: int | None = None,
    merge_fn: Callable[..., Any] | None = None,
    train_state_initializer_cls: Any = None,
    use_orbax: bool = False,
) -> list[str]:
    """Upstream's ``infer.infer`` keywords, run by ``t5x.launch.infer``.

    ``mode`` ``'predict'``, ``'predict_with_aux'`` (the same lines: each
    prediction with its aux values) and ``'score'``; ``shard_id`` /
    ``num_shards`` split the split between jobs and ``checkpoint_period`` is
    the number of batches per resumable chunk, as upstream.
    ``checkpoint_ds_iter`` is accepted: a resumed job skips the examples it
    wrote either way.

    Returns:
      The JSON Lines files written, one per task
      (``<output_dir>/<task>-<mode>.jsonl-SSSSS-of-NNNNN``).
    """
    if mode not in ("predict", "score", "predict_with_aux"):
        raise ConfigurationError(f"infer mode must be 'predict', 'score' or 'predict_with_aux', got {mode!r}")
    if not merge_chunked_results:
        raise _refuse("merge_chunked_results", False, "each shard's chunks are always merged into its file")
    for option, value in (
        ("write_fn", write_fn),
        ("merge_fn", merge_fn),
        ("train_state_initializer_cls", train_state_initializer_cls),
    ):
        if value is not None:
            raise _refuse(option, value, "t5x-launch writes JSON Lines in input order itself")
    if fallback_init_rng is not None:
        raise _refuse("fallback_init_rng", fallback_init_rng, "every parameter must come from the checkpoint")
    path, steps = _restore_for_reading(restore_checkpoint_cfg, "RestoreCheckpointConfig")
    if steps == "all":
        raise _refuse(
            "RestoreCheckpointConfig.mode", "all", "infer reads one checkpoint (the latest of a model folder)"
        )
    return launch.infer(
        model=model,
        dataset_cfg=dataset_config(dataset_cfg, who="dataset_cfg", measure=True),
        checkpoint_path=path,
        output_dir=output_dir,
        mode=mode,
        partitioner=partitioner,
        shard_id=shard_id,
        num_shards=num_shards,
        checkpoint_period=checkpoint_period,
    )


def _constant_learning_rate(step: Any) -> float:
    del step
    return 1e-3


def precompile(
    *,
    model: Any,
    train_dataset_cfg: Any,
    partitioner: Any = None,
    model_dir: str,
    random_seed: int | None = None,
    get_dataset_fn: Callable[..., Any] | None = None,
) -> Any:
    """Upstream's ``precompile.precompile`` keywords, compiled by t5x-launch's precompile job.

    The train step and the initialisation are compiled into
    ``model_dir/compilation_cache``, where a later ``t5x-launch train`` of the
    same configuration finds them; as upstream, ``model_dir`` also gets the train
    step's HLO before and after optimisation (``lowered_hlo_pre_optimization``,
    ``lowered_hlo_post_optimization``: serialized ``HloModuleProto``s) and the
    mesh's device ids (``assignment``, a NumPy ``.npy``). The learning-rate schedule
    is part of the compiled step: a gin-configured ``trainer.Trainer``'s, else
    upstream's constant 1e-3 (whose cache entries then serve only a train with that
    schedule).
    """
    from t5x.launch import precompile as launch_precompile

    _check_get_dataset_fn(get_dataset_fn)
    settings = _trainer_settings(None)
    learning_rate_fn = settings.learning_rate_fn
    if learning_rate_fn is None:
        _LOG.info("precompile: no trainer.Trainer.learning_rate_fn bound; compiling with upstream's 1e-3")
        learning_rate_fn = _constant_learning_rate
    return launch_precompile(
        model=model,
        train_dataset_cfg=dataset_config(train_dataset_cfg, who="train_dataset_cfg", measure=False),
        model_dir=model_dir,
        partitioner=partitioner,
        optimizer=optimizers.to_optax(getattr(model, "optimizer_def", None)),
        learning_rate_fn=learning_rate_fn,
        random_seed=_random_seed(random_seed),
        num_microbatches=settings.num_microbatches,
        hlo_dump_dir=model_dir,
    )


_TFEXAMPLE_READERS = {"tfrecord": "TFRecordDataset"}


def create_task_from_tfexample_file(
    paths: Sequence[str],
    file_type: str,
    inputs_key: str,
    targets_key: str | None,
    features: Mapping[str, Any],
    task_id: str | None = None,
) -> str:
    """Registers a task reading text features of ``tf.train.Example`` files; returns its name.

    Upstream's ``runs/infer_from_tfexample_file.gin`` binds it as the dataset's
    ``mixture_or_task_name``: each example's ``inputs_key`` (and ``targets_key``,
    else an empty target) string is tokenized with ``features``' vocabularies and
    ends with EOS where the feature adds one. The split is ``'infer'``.

    Raises:
      ConfigurationError: a file type other than ``'tfrecord'`` (``'recordio'`` and
        ``'sstable'`` are Google-internal formats), or no file matching ``paths``.
    """
    import functools
    import hashlib

    import tensorflow as tf

    from t5x import seqio

    if file_type not in _TFEXAMPLE_READERS:
        raise ConfigurationError(
            f"create_task_from_tfexample_file: file_type={file_type!r} is not readable here; "
            f"expected one of {sorted(_TFEXAMPLE_READERS)} (write the examples as TFRecord files)"
        )
    patterns = [paths] if isinstance(paths, str) else list(paths)
    if not any(tf.io.gfile.glob(p) for p in patterns):
        raise ConfigurationError(f"create_task_from_tfexample_file: no file matches {patterns}")
    keys = {"inputs": inputs_key, "targets": targets_key}
    description = {k: tf.io.FixedLenFeature([], tf.string) for k in keys.values() if k}
    if task_id is None:
        task_id = hashlib.sha1(repr((patterns, file_type, keys)).encode()).hexdigest()[:12]
    name = f"infer_from_tfexample_file_{task_id}"
    seqio.TaskRegistry.remove(name)  # the same files again: re-registered with the current features
    seqio.TaskRegistry.add(
        name,
        source=seqio.TFExampleDataSource(
            {"infer": patterns},
            feature_description=description,
            reader_cls=getattr(tf.data, _TFEXAMPLE_READERS[file_type]),
        ),
        preprocessors=[
            functools.partial(seqio.preprocessors.rekey, key_map=keys),
            seqio.preprocessors.tokenize_and_append_eos,
        ],
        output_features=dict(features),
    )
    return name
