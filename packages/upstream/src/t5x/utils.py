"""Upstream t5x's ``t5x.utils`` names that gin files configure, as plain records.

The records keep upstream's field names and defaults; ``t5x.upstream`` turns them
into t5x-launch's own configuration when a job runs, refusing by name what would
change a run's meaning here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax.core
import jax
import numpy as np
from flax import traverse_util
from flax.linen import partitioning as flax_partitioning

from t5x import checkpoints, training

_log = logging.getLogger(__name__)

_SAVE_DTYPES = (None, "float32", "bfloat16")
_RESTORE_DTYPES = (None, "float32", "bfloat16", "float16")
_RESTORE_MODES = ("specific", "latest", "all")


@dataclasses.dataclass
class DatasetConfig:
    """Which Task or Mixture a job reads, and how (upstream's fields and defaults).

    ``task_feature_lengths=None`` (upstream's "use the longest example") is allowed
    for evaluation and inference.
    """

    mixture_or_task_name: Any
    task_feature_lengths: Mapping[str, int] | None
    split: str
    batch_size: int
    shuffle: bool
    seed: int | None
    use_cached: bool = False
    pack: bool = False
    use_custom_packing_ops: bool = False
    module: str | None = None
    use_memory_cache: bool = True
    trim_output_features: bool = True


@dataclasses.dataclass
class SaveCheckpointConfig:
    """When and how checkpoints are saved (upstream's fields and defaults)."""

    dtype: str | None = "float32"
    period: int | None = None
    keep: int | None = None
    keep_dataset_checkpoints: int | None = None
    save_dataset: bool = False
    checkpointer_cls: Any = None
    state_transformation_fns: Sequence[Callable[..., Any]] = ()
    use_gda: bool = True
    checkpoint_manager_cls: Any = None
    checkpoint_steps: Sequence[int] | None = None  # further steps to save at

    def __post_init__(self) -> None:
        if self.dtype not in _SAVE_DTYPES:
            raise ValueError(f"SaveCheckpointConfig.dtype must be one of {_SAVE_DTYPES}, got {self.dtype!r}")


@dataclasses.dataclass
class RestoreCheckpointConfig:
    """Which checkpoint a job starts from (upstream's fields and defaults).

    ``path`` is a checkpoint folder or a model folder; an empty list (upstream
    pretraining's value) means "start from scratch".
    """

    path: str | Sequence[str]
    mode: str = "latest"
    assignment_map: Sequence[tuple[str, str | None]] | None = None
    strict: bool = True
    fallback_to_scratch: bool = False
    dtype: str | None = None
    restore_dataset: bool = False
    checkpointer_cls: Any = None
    state_transformation_fns: Sequence[Callable[..., Any]] = ()
    use_gda: bool = True
    checkpoint_manager_cls: Any = None

    def __post_init__(self) -> None:
        if self.mode not in _RESTORE_MODES:
            raise ValueError(
                f"RestoreCheckpointConfig.mode must be one of {_RESTORE_MODES}, got {self.mode!r}"
            )
        if self.dtype not in _RESTORE_DTYPES:
            raise ValueError(
                f"RestoreCheckpointConfig.dtype must be one of {_RESTORE_DTYPES}, got {self.dtype!r}"
            )


@dataclasses.dataclass
class CheckpointConfig:
    """Saving and restoring together, as upstream's train script takes them."""

    save: SaveCheckpointConfig | None = None
    restore: RestoreCheckpointConfig | None = None


def create_learning_rate_scheduler(
    factors: str = "constant * linear_warmup * rsqrt_decay",
    base_learning_rate: float = 0.5,
    warmup_steps: int = 1000,
    decay_factor: float = 0.5,
    steps_per_decay: int = 20000,
    steps_per_cycle: int = 100000,
    step_offset: int = 0,
    min_learning_rate: float = 1e-8,
) -> Callable[[Any], Any]:
    """Upstream's factor-string schedule (``t5x.training.create_learning_rate_scheduler``).

    A function of its own rather than the same object, so that gin registers the
    upstream name separately from t5x-launch's configs.
    """
    return training.create_learning_rate_scheduler(
        factors=factors,
        base_learning_rate=base_learning_rate,
        warmup_steps=warmup_steps,
        decay_factor=decay_factor,
        steps_per_decay=steps_per_decay,
        steps_per_cycle=steps_per_cycle,
        step_offset=step_offset,
        min_learning_rate=min_learning_rate,
    )


def _import_task_module(cfg: DatasetConfig) -> None:
    if cfg.module:
        import importlib

        importlib.import_module(cfg.module)


def _provider(cfg: DatasetConfig) -> Any:
    from t5x import seqio

    return seqio.maybe_get_mixture_or_task(cfg.mixture_or_task_name)  # a name, or the provider itself


def get_vocabulary(cfg: DatasetConfig) -> tuple[Any, Any]:
    """The ``(inputs, targets)`` vocabularies of the task or mixture ``cfg`` names.

    A task without an ``inputs`` feature (a language model's) gives its targets
    vocabulary for both, as upstream.

    Raises:
      ValueError: the provider has no ``targets`` feature.
    """
    _import_task_module(cfg)
    features = _provider(cfg).output_features
    if "targets" not in features:
        raise ValueError(
            f"{cfg.mixture_or_task_name!r} has no 'targets' feature (it has {sorted(features)}): "
            "a model needs targets to predict"
        )
    targets = features["targets"].vocabulary
    inputs = features["inputs"].vocabulary if "inputs" in features else targets
    return inputs, targets


def get_dataset(
    cfg: DatasetConfig,
    shard_id: int,
    num_shards: int,
    feature_converter_cls: Callable[..., Any],
    num_epochs: int | None = None,
    continue_from_last_checkpoint: bool = False,
    batching_fn: Callable[..., Any] | None = None,
) -> Any:
    """This host's batches of ``cfg``'s task: seqio's pipeline through the model's feature converter.

    Each of the ``num_shards`` data shards reads its own part of the examples and
    batches ``batch_size // num_shards`` of them (remainders dropped). A ``seed``
    of None draws one seed for the run, the same on every host.

    Raises:
      ValueError: ``continue_from_last_checkpoint`` (this pipeline does not know
        where a run stopped: t5x-launch's checkpoints hold the input position), or
        a batch size the shards do not divide.
    """
    from t5x import seqio

    if continue_from_last_checkpoint:
        raise ValueError(
            "get_dataset(continue_from_last_checkpoint=True) is not supported by this dataset function; "
            "t5x-launch checkpoints the input position itself"
        )
    if cfg.batch_size % num_shards:
        raise ValueError(
            f"Batch size ({cfg.batch_size}) must be divisible by number of shards ({num_shards})."
        )
    _import_task_module(cfg)
    seed = cfg.seed
    if seed is None:
        from t5x.partitioning import broadcast_seed

        seed = broadcast_seed(None) % 2**31  # a fresh seed, the same on every host
    converter = feature_converter_cls(pack=cfg.pack, use_custom_packing_ops=cfg.use_custom_packing_ops)
    dataset = seqio.get_dataset(
        _provider(cfg),
        cfg.task_feature_lengths,
        feature_converter=converter,
        dataset_split=cfg.split,
        use_cached=cfg.use_cached,
        shuffle=cfg.shuffle,
        num_epochs=num_epochs,
        shard_info=seqio.ShardInfo(index=shard_id, num_shards=num_shards),
        seed=seed,
        trim_output_features=cfg.trim_output_features,
    )
    rows = cfg.batch_size // num_shards
    if batching_fn is not None:
        return batching_fn(dataset, rows)
    return dataset.batch(rows, drop_remainder=True)


def get_deterministic_dataset(
    cfg: DatasetConfig,
    shard_id: int,
    num_shards: int,
    feature_converter_cls: Callable[..., Any],
    model_dir: str | None = None,
    start_step: int = 0,
    num_epochs: int | None = None,
    continue_from_last_checkpoint: bool = False,
) -> Any:
    """``get_dataset`` with a fixed seed (``cfg.seed``, else 0), from batch ``start_step`` on.

    Upstream's ``runs/pretrain_deterministic.gin`` names this as the training
    ``get_dataset_fn``; under t5x-launch that run's data is read by t5x-launch's own
    pipeline, which is deterministic by its seed and restarts at the checkpointed
    position (``model_dir`` is not needed to find it).
    """
    del model_dir
    seeded = dataclasses.replace(cfg, seed=0 if cfg.seed is None else cfg.seed)
    dataset = get_dataset(
        seeded, shard_id, num_shards, feature_converter_cls, num_epochs, continue_from_last_checkpoint
    )
    return dataset.skip(start_step) if start_step else dataset


# --- Small helpers upstream users call directly ---------------------------------


def round_vocab_size_to_multiple(vocab_size: int, divisor: int = 128) -> int:
    """``vocab_size`` rounded up to a multiple of ``divisor`` (embedding tables shard evenly)."""
    return -(-vocab_size // divisor) * divisor


def get_zeros_batch_like_spec(batch_spec: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A batch of zeros with the shape and dtype of each ``jax.ShapeDtypeStruct`` in ``batch_spec``."""
    return {name: np.zeros(spec.shape, spec.dtype) for name, spec in batch_spec.items()}


def get_zeros_batch_like_dataset(dataset: Any, batch_size: int | None = None) -> dict[str, np.ndarray]:
    """A batch of zeros shaped like a ``tf.data.Dataset``'s elements.

    With ``batch_size``, the leading dimension of every feature is replaced by it.
    """
    batch = {}
    for name, spec in dataset.element_spec.items():
        shape = tuple(spec.shape)
        if batch_size is not None:
            shape = (batch_size, *shape[1:])
        if any(dim is None for dim in shape):
            raise ValueError(
                f"get_zeros_batch_like_dataset: feature {name!r} has an unknown dimension: {shape}"
            )
        batch[name] = np.zeros(shape, spec.dtype.as_numpy_dtype)
    return batch


# --- Model summary -----------------------------------------------------------------


def _flat_by_path(tree: Any) -> dict[str, Any]:
    # None leaves stay (they are logged as such); names are "a/b/c", sorted like JAX sorts dict keys.
    if not isinstance(tree, Mapping):
        return {"": tree}
    flat = traverse_util.flatten_dict(flax.core.unfreeze(dict(tree)), keep_empty_nodes=True, sep="/")
    return dict(sorted(flat.items()))


def log_model_info(log_file: str | None, full_train_state: Any, partitioner: Any) -> None:
    """Logs every parameter and optimizer-state variable: size, logical shape and partition spec.

    With ``log_file``, the same lines are written there too. Only process 0 logs.
    """
    if jax.process_index() != 0:
        return
    state = full_train_state.state_dict()
    logical = partitioner.get_logical_axes(full_train_state).state_dict()
    mesh = partitioner.get_mesh_axes(full_train_state).state_dict()
    writer = open(log_file, "w") if log_file is not None else None  # noqa: SIM115 - closed below

    def emit(line: str) -> None:
        _log.info("%s", line)
        if writer is not None:
            writer.write(line + "\n")

    def emit_variables(prefix: str, values: Any, logical_axes: Any, mesh_axes: Any) -> None:
        values, logical_axes, mesh_axes = (_flat_by_path(t) for t in (values, logical_axes, mesh_axes))
        for path, value in values.items():
            name = f"{prefix}{path}".rstrip("/")
            if isinstance(value, Mapping) and not value:
                continue  # empty optimizer states (e.g. optax's EmptyState) have nothing to show
            if value is None:
                emit(f"Variable {name:<80} None")
                continue
            names = logical_axes.get(path)
            if names is None or len(names) != len(value.shape):
                shape = str(tuple(value.shape))
            else:
                shape = "(" + ", ".join(f"{axis}={dim}" for axis, dim in zip(names, value.shape)) + ")"
            spec = mesh_axes.get(path)
            spec = tuple(spec) if spec is not None else None
            emit(
                f"Variable {name:<80} size {int(np.prod(value.shape)):<12} shape {shape:<40} partition spec {spec}"
            )

    try:
        emit_variables("", state["target"], logical["target"], mesh["target"])
        sizes = [int(np.prod(v.shape)) for v in _flat_by_path(state["target"]).values() if v is not None]
        emit(f"Total number of parameters: {sum(sizes)}")
        emit("")
        for key in sorted(state["state"]):
            emit_variables(f"{key}/", state["state"][key], logical["state"][key], mesh["state"][key])
    finally:
        if writer is not None:
            writer.close()


def override_params_axes_names(
    model_variables: Any, params_axes_names_override: Sequence[tuple[str, tuple[str | None, ...]]]
) -> Any:
    """Replaces the logical axis names of parameters whose path fully matches a regex.

    ``params_axes_names_override`` is ``[(regex, names), ...]``; for each parameter the
    first full match wins. Returns the variables with a rewritten ``params_axes``
    collection (a FrozenDict when given one).
    """
    if "params_axes" not in model_variables:
        raise ValueError("Model variables do not contain a 'params_axes' collection to apply an override to.")
    frozen = isinstance(model_variables, flax.core.FrozenDict)
    variables = flax.core.unfreeze(model_variables)
    params = traverse_util.flatten_dict(variables["params"], sep="/")
    axes = traverse_util.flatten_dict(variables["params_axes"], sep="/")
    for path, value in params.items():
        for pattern, names in params_axes_names_override:
            if not re.fullmatch(pattern, path):
                continue
            if len(names) != np.ndim(value):
                raise ValueError(
                    f"Provided axis name override for {path} does not match param rank ({np.ndim(value)}): {names}"
                )
            axes[f"{path}_axes"] = flax_partitioning.AxisMetadata(names=tuple(names))
            break
    variables["params_axes"] = traverse_util.unflatten_dict(axes, sep="/")
    return flax.core.freeze(variables) if frozen else variables


# --- Evaluation on the training mixture ----------------------------------------------


def get_training_eval_datasets(
    cfg: DatasetConfig,
    shard_id: int,
    num_shards: int,
    eval_steps: int,
    feature_converter_cls: Any,
    deterministic: bool = False,
    model_dir: str | None = None,
    start_step: int = 0,
) -> dict[str, Any]:
    """``eval_steps`` batches of each task of the training mixture (and of the mixture itself).

    Every dataset is read whole (one shard, ``batch_size`` 1, enough epochs for
    ``eval_steps`` full batches), then this host keeps every ``num_shards``-th example
    from ``shard_id`` and batches ``batch_size // num_shards`` of them.
    """
    from t5x import seqio

    if deterministic:
        raise NotImplementedError(
            "get_training_eval_datasets(deterministic=True) is not supported: t5x-launch's input "
            "pipeline is deterministic by seed; call it with deterministic=False"
        )
    del model_dir, start_step  # only the deterministic pipeline reads them upstream
    if cfg.batch_size % num_shards:
        raise ValueError(
            f"Batch size ({cfg.batch_size}) must be divisible by number of shards ({num_shards})."
        )
    name = cfg.mixture_or_task_name
    provider = seqio.get_mixture_or_task(name) if isinstance(name, str) else name

    def eval_batches(config: DatasetConfig) -> Any:
        # Looked up at call time, so a replaced (or mocked) t5x.utils.get_dataset is used.
        whole = get_dataset(
            config,
            shard_id=0,
            num_shards=1,
            feature_converter_cls=feature_converter_cls,
            num_epochs=eval_steps * cfg.batch_size,
            continue_from_last_checkpoint=False,
        )
        examples = whole.unbatch().repeat().shard(num_shards, shard_id)
        return examples.batch(cfg.batch_size // num_shards, drop_remainder=True).take(eval_steps).cache()

    datasets = {}
    if isinstance(provider, seqio.Mixture):
        for task in provider.tasks:
            if cfg.split in task.splits:
                task_cfg = dataclasses.replace(cfg, mixture_or_task_name=task.name, batch_size=1)
                datasets[task.name] = eval_batches(task_cfg)
    if cfg.split in provider.splits:
        datasets[provider.name] = eval_batches(dataclasses.replace(cfg, batch_size=1))
    return datasets


# --- Restoring and initializing train states -------------------------------------------


_CHECKPOINT_DIR = re.compile(r"checkpoint_(\d+)")


def _checkpoint_dirs(model_dir: str) -> list[str]:
    """Upstream-layout checkpoint folders (``checkpoint_<step>/checkpoint``) in step order."""
    if not os.path.isdir(model_dir):
        return []
    found = []
    for entry in os.listdir(model_dir):
        match = _CHECKPOINT_DIR.fullmatch(entry)
        path = os.path.join(model_dir, entry)
        if match and os.path.exists(os.path.join(path, "checkpoint")):
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def _restore_paths(cfg: RestoreCheckpointConfig) -> list[str]:
    paths = [cfg.path] if isinstance(cfg.path, str) else list(cfg.path)
    if cfg.mode == "specific":
        return paths
    found = [
        d for path in paths for d in (_checkpoint_dirs(path) or ([path] if _is_checkpoint(path) else []))
    ]
    return found if cfg.mode == "all" else found[-1:]


def _is_checkpoint(path: str) -> bool:
    return os.path.exists(os.path.join(path, "checkpoint"))


def restore(
    checkpointer_or_manager: Any,
    paths: Sequence[str],
    restore_cfg: RestoreCheckpointConfig,
    fallback_state: Any = None,
) -> Any:
    """Restores each path with ``checkpointer_or_manager.restore``: one state for one path, else a list."""
    states = [
        checkpointer_or_manager.restore(
            path=path,
            fallback_state=fallback_state,
            state_transformation_fns=restore_cfg.state_transformation_fns,
        )
        for path in paths
    ]
    return states[0] if len(states) == 1 else states


class TrainStateInitializer:
    """Builds a train state from scratch or from checkpoints, partitioned by ``partitioner``.

    ``init_fn(rng, input_shapes, input_types)`` gives the model variables (a model's
    ``get_initial_variables``); with an ``optimizer_def`` they become a
    ``FlaxOptimTrainState``, without one an ``InferenceState``.
    """

    def __init__(
        self,
        optimizer_def: Any,
        init_fn: Callable[..., Any],
        input_shapes: Mapping[str, Sequence[int]],
        partitioner: Any,
        input_types: Mapping[str, Any] | None = None,
    ) -> None:
        from t5x import train_state as train_state_lib

        def initialize(rng: Any) -> Any:
            variables = init_fn(rng, input_shapes, input_types)
            if isinstance(variables, Mapping):
                variables = flax.core.freeze(variables)
            if optimizer_def is not None:
                return train_state_lib.FlaxOptimTrainState.create(optimizer_def, variables)
            return train_state_lib.InferenceState.create(variables)

        self._partitioner = partitioner
        self.global_train_state_shape = jax.eval_shape(initialize, jax.random.PRNGKey(0))
        self.train_state_axes = partitioner.get_mesh_axes(self.global_train_state_shape)
        self._partitioned_init = partitioner.partition(
            initialize, in_axis_resources=None, out_axis_resources=self.train_state_axes
        )

    def _placed(self, state: Any) -> Any:
        """A restored (host) train state placed on the mesh as ``train_state_axes`` say."""
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = getattr(self._partitioner, "mesh", None)
        if mesh is None:
            return state

        def place(spec: Any, value: Any) -> Any:
            if value is None or not isinstance(value, (np.ndarray, np.generic, jax.Array)):
                return value
            return jax.device_put(value, NamedSharding(mesh, spec if spec is not None else PartitionSpec()))

        return jax.tree.map(
            place, self.train_state_axes, state, is_leaf=lambda x: x is None or isinstance(x, PartitionSpec)
        )

    def from_scratch(self, init_rng: Any) -> Any:
        """A freshly initialized (partitioned) train state."""
        _log.info("Initializing the train state from scratch")
        return self._partitioned_init(init_rng)

    def from_checkpoints(
        self, restore_cfgs: Sequence[RestoreCheckpointConfig], ds_iter: Any = None, init_rng: Any = None
    ) -> Iterator[Any]:
        """The states of the first config that finds checkpoints (one per path it resolves to).

        ``mode='latest'`` restores a model folder's newest ``checkpoint_<step>``,
        ``'all'`` each of them, ``'specific'`` exactly the paths given.
        """
        for cfg in restore_cfgs:
            paths = _restore_paths(cfg)
            if not paths:
                _log.info("No checkpoints found under %s; trying the next restore config", cfg.path)
                continue
            fallback = (
                self.from_scratch(init_rng) if cfg.fallback_to_scratch and init_rng is not None else None
            )
            checkpointer_cls = cfg.checkpointer_cls or checkpoints.Checkpointer
            checkpointer = checkpointer_cls(
                train_state=self.global_train_state_shape,
                partitioner=self._partitioner,
                checkpoints_dir="",
                dataset_iterator=ds_iter if cfg.restore_dataset else None,
                restore_dtype=cfg.dtype,
            )
            restored = restore(checkpointer, paths, cfg, fallback_state=fallback)
            for state in restored if isinstance(restored, list) else [restored]:
                yield self._placed(state)
            return

    def from_checkpoint(
        self, ckpt_cfgs: Sequence[RestoreCheckpointConfig], *, ds_iter: Any = None, init_rng: Any = None
    ) -> Any:
        """The one state ``from_checkpoints`` restores, or None; more than one is an error."""
        states = list(self.from_checkpoints(ckpt_cfgs, ds_iter=ds_iter, init_rng=init_rng))
        if len(states) > 1:
            raise ValueError(
                f"Expected at most 1 checkpoint but got {len(states)} for config(s): {ckpt_cfgs}"
            )
        return states[0] if states else None

    def from_checkpoint_or_scratch(
        self, ckpt_cfgs: Sequence[RestoreCheckpointConfig], *, init_rng: Any, ds_iter: Any = None
    ) -> Any:
        """The restored state when a config finds a checkpoint, else a fresh one."""
        restored = self.from_checkpoint(ckpt_cfgs, ds_iter=ds_iter, init_rng=init_rng)
        return restored if restored is not None else self.from_scratch(init_rng)


__all__ = [
    "CheckpointConfig",
    "DatasetConfig",
    "RestoreCheckpointConfig",
    "SaveCheckpointConfig",
    "TrainStateInitializer",
    "create_learning_rate_scheduler",
    "get_dataset",
    "get_training_eval_datasets",
    "get_zeros_batch_like_dataset",
    "get_zeros_batch_like_spec",
    "log_model_info",
    "override_params_axes_names",
    "restore",
    "round_vocab_size_to_multiple",
]
