"""One of two local processes under jax.distributed; run by test_multiprocess.py.

Usage: python _two_process_worker.py PORT PROCESS_ID
Prints one JSON line of results on success; any failed check exits non-zero.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import t5x.partitioning as tp


def main(port: int, pid: int) -> None:
    tp.initialize_distributed(f"localhost:{port}", num_processes=2, process_id=pid, initialization_timeout=60)
    assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
    results = {"process": pid}

    # Data x model: model inside a process, data across the two processes.
    partitioner = tp.PjitPartitioner(
        num_partitions=2, logical_axis_rules=tp.standard_logical_axis_rules(1, 2)
    )
    layout = partitioner.get_data_layout(8)
    results["layout"] = [
        layout.shard_id,
        layout.num_shards,
        layout.per_shard_batch_size,
        layout.is_first_host_in_replica_set,
    ]
    full = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    start = layout.shard_id * layout.per_shard_batch_size
    local = {"x": full[start : start + layout.per_shard_batch_size]}
    batch = partitioner.host_local_to_global(local)
    assert batch["x"].shape == (8, 3) and not batch["x"].is_fully_addressable
    # Both local devices are one data row (replicated over 'model'): each holds this process's rows.
    assert {s.index[0].indices(8)[:2] for s in batch["x"].addressable_shards} == {(start, start + 4)}
    results["global_equals_full"] = bool(np.array_equal(partitioner.global_to_host_local(batch)["x"], full))

    total = partitioner.partition(
        lambda b: (jnp.sum(b["x"]), jnp.sum(b["x"], axis=0)),
        in_shardings=({"x": ("batch", None)},),
        out_shardings=(None, (None,)),
    )(batch)
    results["sum"] = float(partitioner.global_to_host_local(total[0]))
    results["column_sums"] = partitioner.global_to_host_local(total[1]).tolist()
    results["want_sum"] = float(full.sum())
    results["want_column_sums"] = full.sum(axis=0).tolist()

    # Sharded init: wi [embed, mlp] -> (data, model) spans both processes.
    def init(key):
        k1, k2 = jax.random.split(key)
        return {"wi": jax.random.normal(k1, (8, 6)), "wo": jax.random.normal(k2, (6, 8))}

    key = jax.random.key(7)
    params = partitioner.initialize(init, key, logical_axes={"wi": ("embed", "mlp"), "wo": ("mlp", "embed")})
    assert {s.data.shape for s in params["wi"].addressable_shards} == {(4, 3)}
    gathered = partitioner.global_to_host_local(params)
    with jax.default_device(jax.local_devices()[0]):
        reference = jax.jit(init)(key)
    results["init_matches"] = all(
        np.allclose(gathered[k], np.asarray(reference[k]), rtol=1e-6) for k in reference
    )

    # Model over all 4 devices: both processes hold the whole batch, one shard.
    wide = tp.PjitPartitioner(num_partitions=4)
    wide_layout = wide.get_data_layout(4)
    results["wide_layout"] = [
        wide_layout.shard_id,
        wide_layout.num_shards,
        wide_layout.is_first_host_in_replica_set,
    ]
    wide_batch = wide.host_local_to_global({"x": full[:4]})
    results["wide_equals"] = bool(np.array_equal(wide.global_to_host_local(wide_batch)["x"], full[:4]))

    # Cross-process helpers.
    results["seed"] = tp.broadcast_seed(100 + pid)
    tp.assert_same_across_processes({"config": [1, 2, 3]}, "config")
    try:
        tp.assert_same_across_processes(pid, "process id")
    except AssertionError as error:
        results["mismatch_error"] = str(error)
    tp.barrier("worker_done")
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
