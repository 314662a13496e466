"""``PjitPartitioner``: jit with shardings from logical axis rules over a device mesh."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5x.interfaces import DataLayout
from t5x.partitioning._context import axis_rules
from t5x.partitioning._layout import ProcessChunks, process_chunks
from t5x.partitioning._mesh import MeshError, default_mesh
from t5x.partitioning._rules import (
    LogicalAxisRules,
    get_logical_axes,
    is_axes_leaf,
    logical_to_mesh_axes,
    logical_to_shardings,
    standard_logical_axis_rules,
)


class PartitionedFunction:
    """A jitted function that runs with its partitioner's mesh and rules in force.

    Call it like the original function; `lower` gives JAX's lowering for
    ahead-of-time compilation.
    """

    def __init__(self, jitted: Any, mesh: Mesh, rules: LogicalAxisRules):
        self.jitted = jitted
        self._mesh = mesh
        self._rules = rules

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with axis_rules(self._mesh, self._rules):
            return self.jitted(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Traces and lowers for arguments like ``args`` (arrays or ``ShapeDtypeStruct``s)."""
        with axis_rules(self._mesh, self._rules):
            return self.jitted.lower(*args, **kwargs)


def _tuple_argnums(argnums: int | Sequence[int]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def _mesh_axes_of(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _backend_devices(backend: str) -> list[Any]:
    try:
        return list(jax.devices(backend))
    except RuntimeError as error:
        available = sorted({d.platform for d in jax.devices()})
        raise MeshError(
            f"PjitPartitioner(backend={backend!r}): this machine has no {backend!r} devices "
            f"(available: {', '.join(available)}); set backend = None to use the default platform"
        ) from error


class PjitPartitioner:
    """Places data and programs on a ``('data', 'model')`` mesh by logical axis names.

    Implements the ``t5x.interfaces.Partitioner`` contract. Upstream t5x's
    configuration carries over: ``num_partitions`` or ``model_parallel_submesh``
    choose the model-parallel size, ``logical_axis_rules`` map names to mesh axes.

    Attributes:
      mesh: the ``jax.sharding.Mesh`` in use.
      logical_axis_rules: the rules in force, as a tuple of pairs.
    """

    def __init__(
        self,
        num_partitions: int | None = None,
        model_parallel_submesh: Sequence[int] | None = None,
        logical_axis_rules: LogicalAxisRules | None = None,
        *,
        mesh: Mesh | None = None,
        devices: Sequence[Any] | None = None,
        ici_mesh_shape: Sequence[int] | None = None,
        dcn_mesh_shape: Sequence[int] | None = None,
        backend: str | None = None,
        params_on_devices: bool = True,
        use_cpu_pjit: bool = False,
    ):
        """Builds the mesh and fixes the rules.

        Args:
          num_partitions: the size of the ``model`` axis (default 1); must divide
            the device count.
          model_parallel_submesh: a hardware tile for one model replica, e.g.
            ``(x, y, z, cores)`` on TPU; mutually exclusive with ``num_partitions``.
          logical_axis_rules: ``(logical name, mesh axes)`` pairs; by default
            `standard_logical_axis_rules()`.
          mesh: use this mesh instead of building one.
          devices: build the mesh over these devices (default: all).
          ici_mesh_shape: multi-slice ``(replica, data, model)`` sizes in a slice.
          dcn_mesh_shape: multi-slice ``(replica, data, model)`` sizes across slices;
            the ``batch`` rule then shards over ``('replica', 'data')``.
          backend: the JAX platform whose devices make the mesh (``'cpu'``, ``'gpu'``,
            ``'tpu'``; None: the default platform), as upstream.
          params_on_devices: upstream's switch for restoring parameters onto the
            devices; kept as the attribute of that name (this partitioner always
            places arrays on the mesh).
          use_cpu_pjit: accepted for upstream's configs; the mesh already spans the
            CPU devices when the platform is the CPU.

        Raises:
          ValueError: conflicting options, or a mesh that does not fit the devices.
        """
        # Upstream's older gin files write `model_parallel_submesh = ()` for "none".
        model_parallel_submesh = tuple(model_parallel_submesh) if model_parallel_submesh else None
        if num_partitions is not None and model_parallel_submesh is not None:
            raise MeshError(
                f"give num_partitions ({num_partitions}) or model_parallel_submesh "
                f"({tuple(model_parallel_submesh)}), not both"
            )
        if mesh is not None and (
            num_partitions or model_parallel_submesh or devices or ici_mesh_shape or backend
        ):
            raise MeshError(
                "an explicit mesh excludes num_partitions, model_parallel_submesh, devices, backend and "
                "ici/dcn shapes"
            )
        if backend is not None and devices is None:
            devices = _backend_devices(backend)
        self.params_on_devices = params_on_devices
        del use_cpu_pjit
        self.mesh: Mesh = mesh or default_mesh(
            num_partitions,
            model_parallel_submesh,
            devices=devices,
            ici_mesh_shape=ici_mesh_shape,
            dcn_mesh_shape=dcn_mesh_shape,
        )
        rules = list(standard_logical_axis_rules() if logical_axis_rules is None else logical_axis_rules)
        if "replica" in self.mesh.axis_names:
            rules = [(name, ("replica", "data") if name == "batch" else axes) for name, axes in rules]
        self.logical_axis_rules: tuple[tuple[str, Any], ...] = tuple((n, a) for n, a in rules)
        (batch_axes,) = logical_to_mesh_axes(("batch",), self.logical_axis_rules, self.mesh.axis_names)
        self._data_axes = _mesh_axes_of(batch_axes)
        self._data_chunks: ProcessChunks = process_chunks(self.mesh, self._data_axes)

    # ----------------------------------------------------------------- layout
    @property
    def data_axes(self) -> tuple[str, ...]:
        """The mesh axes the ``batch`` dimension is sharded over (empty: replicated)."""
        return self._data_axes

    @property
    def data_mesh_size(self) -> int:
        """How many devices split the batch (the data-parallel size)."""
        return self._data_chunks.mesh_size

    def get_data_layout(self, batch_size: int | None = None) -> DataLayout:
        """Says which data shard this process reads and how large its part is.

        Args:
          batch_size: the global batch size; by default the data-parallel size.

        Returns:
          The ``DataLayout``; ``per_shard_batch_size`` rows per process.

        Raises:
          ValueError: ``batch_size`` is not divisible by the data-parallel size.
        """
        chunks = self._data_chunks
        batch_size = chunks.mesh_size if batch_size is None else batch_size
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise MeshError(f"batch_size must be a positive int, got {batch_size!r}")
        if batch_size % chunks.mesh_size:
            raise MeshError(
                f"batch size {batch_size} is not divisible by the data-parallel size {chunks.mesh_size} "
                f"(mesh axes {self._data_axes} of mesh {dict(self.mesh.shape)}); use a multiple of "
                f"{chunks.mesh_size}"
            )
        process = jax.process_index()
        if process not in chunks.chunk_of_process:
            raise ValueError(f"process {process} has no devices in the mesh {dict(self.mesh.shape)}")
        shard = chunks.chunk_of_process[process]
        return DataLayout(
            batch_size=int(batch_size),
            shard_id=int(shard),
            num_shards=int(chunks.num_chunks),
            is_first_host_in_replica_set=chunks.first_process_of_chunk(shard) == process,
        )

    # -------------------------------------------------------------- shardings
    def get_mesh_axes(self, logical_axes: Any) -> Any:
        """Maps a tree of logical axis names to ``PartitionSpec``s in mesh axes.

        An upstream-style train state (one with ``as_logical_axes()``, e.g.
        ``t5x.train_state.FlaxOptimTrainState``) is first turned into its logical
        axes; its None leaves (the step, unpartitioned slots) stay None, as upstream.
        """
        if hasattr(logical_axes, "as_logical_axes"):
            return jax.tree.map(
                self.get_mesh_axes,
                logical_axes.as_logical_axes(),
                is_leaf=lambda x: isinstance(x, PartitionSpec),
            )
        return jax.tree.map(
            lambda s: s.spec if isinstance(s, NamedSharding) else s,
            self.get_sharding(logical_axes),
            is_leaf=lambda s: isinstance(s, jax.sharding.Sharding),
        )

    def get_sharding(self, logical_axes: Any) -> Any:
        """Maps a tree of logical axis names to ``jax.sharding.NamedSharding``s.

        Leaves may be tuples of names, ``PartitionSpec``s of names, Flax boxes
        with ``.names``, None (replicated), or ready ``Sharding``s.

        Raises:
          ValueError: an unknown logical name, naming it and the rules in force.
        """
        return logical_to_shardings(logical_axes, self.mesh, self.logical_axis_rules)

    def _jit_shardings(self, tree: Any) -> Any:
        if isinstance(tree, list):
            tree = tuple(tree)
        return self.get_sharding(tree)

    # ------------------------------------------------------------- compilation
    def partition(
        self,
        fn: Callable[..., Any],
        in_shardings: Any = None,
        out_shardings: Any = None,
        static_argnums: int | Sequence[int] = (),
        donate_argnums: int | Sequence[int] = (),
        **upstream_names: Any,
    ) -> PartitionedFunction:
        """Jits ``fn`` with these shardings, the mesh and the rules in force.

        Args:
          fn: the function.
          in_shardings: one logical-axes tree per non-static positional argument
            (a tuple), or one tree broadcast over all of them.
          out_shardings: a logical-axes tree (prefix) for the outputs.
          static_argnums: positions of arguments that are compile-time constants.
          donate_argnums: positions of arguments whose buffers may be reused.
          **upstream_names: ``in_axis_resources`` / ``out_axis_resources``,
            upstream's names for the two shardings.

        Returns:
          A callable `PartitionedFunction`.

        Raises:
          TypeError: an unknown keyword, or a sharding given under both names.
        """
        unknown = set(upstream_names) - {"in_axis_resources", "out_axis_resources"}
        if unknown:
            raise TypeError(f"partition() got unexpected keyword arguments {sorted(unknown)}")
        for name, current in (("in_axis_resources", in_shardings), ("out_axis_resources", out_shardings)):
            if name in upstream_names and current is not None:
                raise TypeError(f"partition() got both {name} and its new name {name[:-14]}shardings")
        in_shardings = upstream_names.get("in_axis_resources", in_shardings)
        out_shardings = upstream_names.get("out_axis_resources", out_shardings)

        # A fresh wrapper per call: JAX caches traces per function object, and the
        # rules in force during tracing are not part of its cache key.
        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        jitted = jax.jit(
            traced,
            in_shardings=self._jit_shardings(in_shardings),
            out_shardings=self._jit_shardings(out_shardings),
            static_argnums=_tuple_argnums(static_argnums),
            donate_argnums=_tuple_argnums(donate_argnums),
        )
        return PartitionedFunction(jitted, self.mesh, self.logical_axis_rules)

    def compile(self, partitioned_fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
        """Compiles ``partitioned_fn`` ahead of time for arguments like ``args``.

        Args:
          partitioned_fn: a function from `partition`.
          *args: arrays or ``jax.ShapeDtypeStruct``s shaped like the real arguments.

        Returns:
          The compiled executable; call it with the non-static arguments.
        """
        if not hasattr(partitioned_fn, "lower"):
            raise TypeError(f"compile needs a function from partition(), got {type(partitioned_fn).__name__}")
        return partitioned_fn.lower(*args).compile()

    # ------------------------------------------------------------- host data
    def _batch_axes_for(self, batch: Mapping[str, Any], logical_axes: Any) -> dict[str, Any]:
        def default(array: Any) -> tuple[str | None, ...]:
            rank = np.ndim(array)
            return ("batch",) + (None,) * (rank - 1) if rank else ()

        if logical_axes is None:
            return {k: default(v) for k, v in batch.items()}
        if is_axes_leaf(logical_axes):
            return {k: logical_axes for k in batch}
        if isinstance(logical_axes, Mapping):
            unknown = sorted(set(logical_axes) - set(batch))
            if unknown:
                raise ValueError(
                    f"logical_axes names features {unknown} that the batch {sorted(batch)} lacks"
                )
            return {k: logical_axes.get(k, default(v)) for k, v in batch.items()}
        raise TypeError(
            f"logical_axes must be None, a mapping or one axes tuple, got {type(logical_axes).__name__}"
        )

    def host_local_to_global(
        self, batch: Mapping[str, np.ndarray], logical_axes: Any = None
    ) -> dict[str, Any]:
        """Turns this process's part of a batch into global ``jax.Array``s.

        Args:
          batch: feature -> ``[per_shard_batch_size, ...]`` numpy array: this
            process's rows (processes of one data shard pass the same rows).
            Dimensions other than the first hold their full size.
          logical_axes: feature -> logical axes; default ``("batch", None, ...)``.

        Returns:
          feature -> ``[batch_size, ...]`` global array, sharded as the axes say.

        Raises:
          ValueError: the global batch is not divisible by the data-parallel size.
        """
        axes = self._batch_axes_for(batch, logical_axes)
        result = {}
        for key, local in batch.items():
            local = np.asarray(local)
            sharding = self.get_sharding(axes[key])
            spec = sharding.spec if isinstance(sharding, NamedSharding) else PartitionSpec()
            global_shape = list(local.shape)
            if local.ndim and len(spec) and spec[0] is not None:
                chunks = process_chunks(self.mesh, _mesh_axes_of(spec[0]))
                global_shape[0] = local.shape[0] * chunks.num_chunks
                if global_shape[0] % chunks.mesh_size:
                    raise ValueError(
                        f"feature {key!r}: global batch size {global_shape[0]} ({local.shape[0]} rows per "
                        f"process x {chunks.num_chunks} shards) is not divisible by the data-parallel size "
                        f"{chunks.mesh_size}"
                    )
            result[key] = jax.make_array_from_process_local_data(sharding, local, tuple(global_shape))
        return result

    def global_to_host_local(self, arrays: Any) -> Any:
        """Returns the full value of global arrays as numpy, on every process.

        Arrays spread over several processes are gathered (a collective: every
        process must call this with the same tree).
        """
        leaves, treedef = jax.tree.flatten(arrays)
        remote = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not x.is_fully_addressable]
        out = [None if i in remote else np.asarray(x) for i, x in enumerate(leaves)]
        if remote:
            gathered = multihost_utils.process_allgather([leaves[i] for i in remote], tiled=True)
            for i, value in zip(remote, gathered):
                out[i] = np.asarray(value)
        return jax.tree.unflatten(treedef, out)

    # ------------------------------------------------------------ initialise
    def _replicate(self, value: Any) -> Any:
        """Places a host value, the same on every process, on all devices of the mesh."""
        if not isinstance(value, (jax.Array, np.ndarray, np.generic)):
            return value
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            return value
        replicated = NamedSharding(self.mesh, PartitionSpec())
        if jax.process_count() == 1:
            return jax.device_put(value, replicated)
        if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            data = np.asarray(jax.random.key_data(value))
            placed = jax.make_array_from_process_local_data(replicated, data, data.shape)
            return jax.random.wrap_key_data(placed, impl=jax.random.key_impl(value))
        data = np.asarray(value)
        return jax.make_array_from_process_local_data(replicated, data, data.shape)

    def initialize(self, init_fn: Callable[..., Any], *args: Any, logical_axes: Any = None) -> Any:
        """Runs ``init_fn(*args)`` with each output created directly in its shards.

        No process ever holds a whole parameter: the shapes come from
        ``jax.eval_shape`` and the function is compiled with the output
        shardings, so each device computes only its part.

        Args:
          init_fn: returns a tree of arrays (e.g. ``model.init``); may return
            Flax boxes with logical ``.names``.
          *args: its arguments (e.g. a PRNG key), the same on every process;
            replicated.
          logical_axes: a tree of logical axes for the outputs; by default the
            names carried by Flax boxes in the output (other leaves replicated).

        Returns:
          The initialised tree of global ``jax.Array``s.
        """
        if logical_axes is None:
            logical_axes = get_logical_axes(jax.eval_shape(init_fn, *args))
        placed_args = tuple(self._replicate(a) for a in args)

        @functools.wraps(init_fn)
        def traced(*a: Any) -> Any:
            return init_fn(*a)

        jitted = jax.jit(traced, out_shardings=self.get_sharding(logical_axes))
        with axis_rules(self.mesh, self.logical_axis_rules):
            return jitted(*placed_args)


class ModelBasedPjitPartitioner(PjitPartitioner):
    """Upstream t5x's earlier name for `PjitPartitioner`; its 2022 gin files configure this one."""
