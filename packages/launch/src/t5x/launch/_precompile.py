"""The job behind ``t5x-launch precompile``: compile the training programs ahead of time.

A large model's first train step can spend minutes in XLA's compiler. This job
builds the same programs ``train`` builds (the train state's init function and
the train step) from shapes alone, compiles them for this process's devices
and leaves the executables in JAX's persistent compilation cache. A ``train``
run with the same config and cache folder then loads them instead of compiling.

Nothing is read but the config: no checkpoint, no data (the batch shapes come
from the feature converter and the task feature lengths), and no parameter is
materialised (shapes come from ``jax.eval_shape``).

Topology: the programs are compiled for the devices this process sees. JAX's
cache key includes the device count and kind, so the entries serve a ``train``
on the same device setup only. For N CPU devices set
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` for both runs; another
accelerator's topology (a TPU pod slice from a CPU host) is not supported here.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from collections.abc import Callable
from typing import Any

from t5x.launch._assembly import feature_converter_for
from t5x.launch._configs import DatasetConfig
from t5x.launch._platform import apply_cpu_kernels_override

CACHE_FOLDER_NAME = "compilation_cache"
# The names JAX gives the cached executables of train's programs (``jit_<function>-<hash>-...``).
TRAIN_PROGRAMS = ("init_fn", "train_step")


def default_cache_dir(model_dir: str | os.PathLike[str]) -> pathlib.Path:
    """Where precompile writes and train looks when no ``COMPILATION_CACHE_DIR`` is set."""
    return pathlib.Path(model_dir) / CACHE_FOLDER_NAME


def enable_compilation_cache(directory: str | os.PathLike[str]) -> pathlib.Path:
    """Points JAX's persistent compilation cache at ``directory`` (created), caching every program.

    JAX's defaults skip programs that compile in under a second or are small,
    which on a CPU is most of a small model's: both limits are set to zero.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    path = pathlib.Path(directory).absolute()
    path.mkdir(parents=True, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != str(path):
        compilation_cache.reset_cache()  # once used, the cache keeps its first folder otherwise
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def cache_entries(directory: str | os.PathLike[str], program: str | None = None) -> list[str]:
    """The cached executables in ``directory`` (those of one program function when named)."""
    root = pathlib.Path(directory)
    if not root.is_dir():
        return []
    names = sorted(p.name for p in root.iterdir() if p.is_file() and p.name.endswith("-cache"))
    if program is None:
        return names
    return [n for n in names if n.startswith(f"jit_{program}-")]


@dataclasses.dataclass
class PrecompileResult:
    """What precompile did.

    Attributes:
      cache_dir: the persistent compilation cache folder.
      programs: ``{program: seconds}`` spent lowering and compiling each.
      new_entries: cache files this run added (none when it was already filled).
      input_shapes: the global batch shapes compiled for.
      num_devices: the devices the programs were compiled for.
    """

    cache_dir: str
    programs: dict[str, float]
    new_entries: list[str]
    input_shapes: dict[str, tuple[int, ...]]
    num_devices: int


def _structs(shapes: Any, shardings: Any) -> Any:
    """``jax.ShapeDtypeStruct`` leaves carrying their sharding (for lowering without arrays)."""
    import jax

    return jax.tree.map(
        lambda s, sharding: jax.ShapeDtypeStruct(
            s.shape, s.dtype, sharding=sharding, weak_type=getattr(s, "weak_type", False)
        ),
        shapes,
        shardings,
    )


def _compile_init(model: Any, partitioner: Any, input_shapes: Any, shardings: Any) -> None:
    """Compiles the program ``t5x.training.init_train_state`` runs, built the same way.

    It has to match init_train_state's program exactly (the cache key is the
    program), which test_precompile checks by a train run adding no init entry.
    """
    import jax

    from t5x.training import TrainState, sharding_for

    def variables_fn(rng: Any) -> dict[str, Any]:
        variables = dict(model.get_initial_variables(rng, input_shapes, None))
        return {k: v for k, v in variables.items() if not k.endswith("_axes")}

    # The optimizer init_train_state bound to the params' axes: `shardings` (a TrainState)
    # carries that very object, and the program's output structure must be the same.
    bound = shardings.optimizer
    rng = jax.random.PRNGKey(0)

    def init_fn(rng: Any) -> TrainState:
        return TrainState.create(bound, variables_fn(rng), params_axes=None)

    replicated = sharding_for(partitioner, ())
    program = partitioner.partition(init_fn, in_shardings=(replicated,), out_shardings=shardings)
    key = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=replicated)
    partitioner.compile(program, key)


def _dump_hlo(directory: pathlib.Path, lowered: Any, compiled: Any, partitioner: Any) -> None:
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    before = lowered.compiler_ir(dialect="hlo").as_serialized_hlo_module_proto()
    (directory / "lowered_hlo_pre_optimization").write_bytes(before)
    after = compiled.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()
    (directory / "lowered_hlo_post_optimization").write_bytes(after)
    with open(directory / "assignment", "wb") as f:
        np.save(f, partitioner.mesh.device_ids)


def precompile(
    *,
    model: Any,
    train_dataset_cfg: DatasetConfig,
    model_dir: str | None = None,
    cache_dir: str | None = None,
    partitioner: Any = None,
    optimizer: Any = None,
    learning_rate_fn: Callable[[Any], Any] | None = None,
    random_seed: int = 0,
    num_microbatches: int | None = None,
    hlo_dump_dir: str | None = None,
    **unused_train_args: Any,
) -> PrecompileResult:
    """Compiles ``train``'s init function and train step into the persistent compilation cache.

    Takes ``train``'s arguments (the command passes it train's gin bindings);
    those that do not shape the programs (checkpointing, evaluation, logging)
    are ignored.

    Args:
      model: the Model.
      train_dataset_cfg: only its batch size, lengths and packing are used.
      model_dir: the default cache folder is ``model_dir/compilation_cache``.
      cache_dir: the cache folder (overrides the default).
      partitioner: default ``PjitPartitioner(num_partitions=1)``, as train.
      optimizer: default T5X Adafactor, as train.
      learning_rate_fn: step -> learning rate (part of the train step).
      random_seed: the dropout seed (part of the train step).
      num_microbatches: gradient accumulation (part of the train step).
      hlo_dump_dir: also write the train step's HLO there, as upstream's precompile
        does: ``lowered_hlo_pre_optimization`` and ``lowered_hlo_post_optimization``
        (serialized ``HloModuleProto``s) and ``assignment`` (the mesh's device ids,
        a NumPy ``.npy`` file).

    Returns:
      A PrecompileResult.
    """
    import jax
    import numpy as np

    import t5x.training
    from t5x.launch._jobs import _default_optimizer, _default_partitioner, _input_shapes
    from t5x.training import batch_shardings

    if cache_dir is None:
        if model_dir is None:
            raise ValueError("precompile needs a cache folder: set COMPILATION_CACHE_DIR or MODEL_DIR")
        cache_dir = str(default_cache_dir(model_dir))
    path = enable_compilation_cache(cache_dir)
    before = set(cache_entries(path))

    apply_cpu_kernels_override(model, os.environ)  # as train does
    partitioner = _default_partitioner(partitioner)
    optimizer = _default_optimizer(optimizer)
    converter = feature_converter_for(model, pack=train_dataset_cfg.pack)
    shapes = _input_shapes(converter, train_dataset_cfg)
    initialized = t5x.training.init_train_state(
        model, optimizer, partitioner, shapes, seed=random_seed, materialize=False
    )
    timings: dict[str, float] = {}

    start = time.perf_counter()
    _compile_init(model, partitioner, shapes, initialized.shardings)
    timings["init_fn"] = time.perf_counter() - start

    # The feature converters' batches are int32; the train step is keyed by shape and dtype.
    batch = {k: jax.ShapeDtypeStruct(v, np.int32) for k, v in shapes.items()}
    batch = _structs(batch, batch_shardings(partitioner, batch))
    trainer = t5x.training.Trainer(
        model,
        partitioner,
        None,  # type: ignore[arg-type]  # no state: only its shardings are used to build the step
        initialized.shardings,
        learning_rate_fn=learning_rate_fn,
        num_microbatches=num_microbatches,
        seed=random_seed,
        peak_flops=None,
    )
    start = time.perf_counter()
    step: Any = trainer._build_train_step(batch)  # the program Trainer.train_step runs (partitioned)
    lowered = step.lower(_structs(initialized.shapes, initialized.shardings), batch)
    compiled = lowered.compile()
    timings["train_step"] = time.perf_counter() - start
    if hlo_dump_dir is not None:
        _dump_hlo(pathlib.Path(hlo_dump_dir), lowered, compiled, partitioner)

    added = sorted(set(cache_entries(path)) - before)
    return PrecompileResult(
        cache_dir=str(path),
        programs=timings,
        new_entries=added,
        input_shapes=shapes,
        num_devices=jax.device_count(),
    )
