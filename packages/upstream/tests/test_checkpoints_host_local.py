"""t5x.checkpoints' host-local protocol (a BasePartitioner, use_gda=False) and SaveBestCheckpointer."""

from __future__ import annotations

import os
from unittest import mock

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from t5x import checkpointing, checkpoints, optimizers, partitioning, test_utils
from t5x import train_state as train_state_lib

# Fake TPU cores: (x, y, z, cores) grid per host count, two cores per chip, 2x2x1x2 per host.
_GRIDS = {1: (2, 2, 1, 2), 2: (4, 2, 1, 2), 4: (4, 4, 1, 2)}


def _state(step: int = 42, bias=None, kernel=None) -> train_state_lib.FlaxOptimTrainState:
    optimizer = optimizers.Optimizer(
        optimizers.sgd(0.1),
        state=optimizers.OptimizerState(
            step=np.int32(step), param_states={"bias": np.int32(1), "kernel": np.array([1, 2], np.uint8)}
        ),
        target={
            "bias": np.arange(8, dtype=np.float32).reshape(8, 1) if bias is None else bias,
            "kernel": np.arange(64, dtype=np.float32).reshape(4, 16) if kernel is None else kernel,
        },
    )
    return train_state_lib.FlaxOptimTrainState(optimizer)


_AXES = _state(step=0, bias=PartitionSpec("data", None), kernel=PartitionSpec(None, "model")).state_dict()


class _Partitioner(partitioning.BasePartitioner):
    """Process ``process`` of ``hosts`` fake TPU hosts, ``partitions``-way model parallel."""

    def __init__(self, process: int, hosts: int, partitions: int):
        super().__init__(num_partitions=partitions, params_on_devices=False)
        devices = test_utils.make_devices(*_GRIDS[hosts])
        self._the_mesh = partitioning.get_mesh(
            (1, 1, 1, partitions),
            input_devices=devices,
            input_local_devices=[d for d in devices if d.process_index == process],
        )
        self._chunker = partitioning.LocalChunker(self._the_mesh, process_index=process)

    @property
    def _mesh(self):
        return self._the_mesh

    @property
    def _local_chunker(self):
        return self._chunker

    def get_mesh_axes(self, train_state):
        axes = train_state.state_dict()
        axes["target"] = dict(_AXES["target"])
        axes["state"] = {"step": None, "param_states": {"bias": None, "kernel": None}}
        return train_state.restore_state(axes)

    def partition(self, fn, in_axis_resources, out_axis_resources, static_argnums=(), donate_argnums=()):
        raise NotImplementedError

    def compile(self, partitioned_fn, *args):
        raise NotImplementedError


def _local(state, partitioner):
    """The train state as process ``partitioner``'s host holds it: its chunk of each parameter."""
    params = state.params
    bias = params["bias"][partitioner.get_local_chunk_info(params["bias"].shape, ("data", None)).slice]
    kernel = params["kernel"][partitioner.get_local_chunk_info(params["kernel"].shape, (None, "model")).slice]
    return _state(int(state.step), bias=bias, kernel=kernel)


def _save_on_hosts(tmp_path, state, hosts, partitions, **kwargs):
    for process in reversed(range(hosts)):  # process 0 last: it completes the step
        partitioner = _Partitioner(process, hosts, partitions)
        # One clock for all: in a real job process 0's time names the temporary folder.
        with (
            mock.patch.object(jax, "process_index", return_value=process),
            mock.patch("time.time", return_value=7.0),
        ):
            ckpt = checkpoints.Checkpointer(state, partitioner, str(tmp_path), use_gda=False, **kwargs)
            ckpt.save(_local(state, partitioner))
            if process:
                assert ckpt.all_steps() == []  # not complete until process 0 has written
    return ckpt


def test_each_process_writes_its_chunks_and_process_0_completes_the_step(tmp_path):
    state = _state()
    _save_on_hosts(tmp_path, state, hosts=4, partitions=2)
    assert checkpoints.all_steps(str(tmp_path)) == [42]
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    whole = checkpoints.load_t5x_checkpoint(str(tmp_path))
    np.testing.assert_array_equal(whole["target"]["bias"], state.params["bias"])
    np.testing.assert_array_equal(whole["target"]["kernel"], state.params["kernel"])
    assert whole["state"]["param_states"]["kernel"].dtype == np.uint8
    # Every process's chunks went into one checksum manifest.
    report = checkpointing.verify_checkpoint(str(tmp_path / "checkpoint_42"))
    assert report.arrays == report.verified == 2 and report.unverified == 0, report


@pytest.mark.parametrize("hosts,partitions", [(1, 1), (2, 2), (4, 1)])
def test_restore_gives_each_process_its_chunk_of_another_topology(tmp_path, hosts, partitions):
    state = _state()
    _save_on_hosts(tmp_path, state, hosts=2, partitions=2)
    for process in range(hosts):
        partitioner = _Partitioner(process, hosts, partitions)
        with mock.patch.object(jax, "process_index", return_value=process):
            restored = checkpoints.Checkpointer(state, partitioner, str(tmp_path), use_gda=False).restore()
        expected = _local(state, partitioner)
        np.testing.assert_array_equal(restored.params["bias"], expected.params["bias"])
        np.testing.assert_array_equal(restored.params["kernel"], expected.params["kernel"])
        assert restored.step == 42 and restored.step.dtype == np.int32


def test_lazy_restore_reads_only_when_asked(tmp_path):
    state = _state()
    _save_on_hosts(tmp_path, state, hosts=2, partitions=1)
    partitioner = _Partitioner(1, 2, 1)
    with mock.patch.object(jax, "process_index", return_value=1):
        ckpt = checkpoints.Checkpointer(
            state, partitioner, str(tmp_path), use_gda=False, restore_dtype=np.float64
        )
        restored = ckpt.restore(lazy_parameters=True)
    bias = restored.params["bias"]
    assert bias.shape == (4, 1) and bias.dtype == np.float64
    np.testing.assert_array_equal(bias.get(), state.params["bias"][4:])


def test_a_parameter_that_does_not_split_over_the_processes_is_named(tmp_path):
    state = _state(bias=np.zeros((6, 1), np.float32))  # 6 rows over 4 data shards
    partitioner = _Partitioner(0, 4, 1)
    with pytest.raises(ValueError, match=r"`target/bias`: dimension of size 6 does not split into 4"):
        checkpoints.Checkpointer(state, partitioner, str(tmp_path), use_gda=False).save(state)


def test_a_chunk_of_the_wrong_shape_is_refused(tmp_path):
    state = _state()
    partitioner = _Partitioner(1, 2, 1)
    bad = _state(bias=np.zeros((3, 1), np.float32))
    with (
        mock.patch.object(jax, "process_index", return_value=1),
        pytest.raises(ValueError, match="target/bias"),
    ):
        checkpoints.Checkpointer(state, partitioner, str(tmp_path), use_gda=False).save(bad)


def test_parameter_infos_describe_the_stored_arrays(tmp_path):
    partitioner = _Partitioner(1, 2, 2)
    infos = checkpoints.Checkpointer(
        _state(), partitioner, str(tmp_path), use_gda=False
    )._get_parameter_infos()
    bias = infos["target"]["bias"]
    assert bias.name == "target/bias" and bias.shape == (8, 1) and bias.axes == PartitionSpec("data", None)
    assert bias.local_chunk_info.slice == (slice(4, 8), slice(None))
    assert bias.ts_spec.to_json()["metadata"]["chunks"] == [4, 1]
    assert infos["state"]["step"].ts_spec is None  # no mesh axes: stored in the index


def test_upstream_chunk_shapes():
    assert checkpoints._choose_chunk_shape([8192, 8193], 4096 * 4096) == [4096, 2731]
    assert checkpoints._choose_chunk_shape([8193], 4096) == [2731]


# ---- SaveBestCheckpointer ------------------------------------------------------


def _log_accuracy(model_dir, values):
    import tensorflow as tf

    writer = tf.summary.create_file_writer(os.path.join(model_dir, "train"))
    with writer.as_default():
        for step, value in values.items():
            tf.summary.write("accuracy", tf.constant(value, tf.float32), step=step)  # what scalar() writes
    writer.flush()


def _best(tmp_path, **kwargs):
    return checkpoints.SaveBestCheckpointer(
        _state(),
        _Partitioner(0, 1, 1),
        str(tmp_path),
        use_gda=False,
        metric_name_to_monitor="train/accuracy",
        **kwargs,
    )


def test_save_best_keeps_the_best_the_newest_and_pinned(tmp_path):
    ckpt = _best(tmp_path, keep=1, metric_mode="max", keep_checkpoints_without_metrics=False)
    for step in (1, 2, 3):
        ckpt.save(_state(step))
    assert ckpt.all_steps() == [2, 3]  # without metrics the oldest go first; the newest always stays
    _log_accuracy(str(tmp_path), {2: 0.9, 3: 0.5})
    (tmp_path / "checkpoint_3" / "PINNED").touch()
    ckpt.save(_state(4))
    assert ckpt.all_steps() == [2, 3, 4]  # 2 is the best; 3 is pinned
    _log_accuracy(str(tmp_path), {4: 0.95})
    ckpt.save(_state(5))
    assert ckpt.all_steps() == [3, 4, 5]
    ckpt._metric_mode = "min"
    ckpt.save(_state(6))
    assert ckpt.all_steps() == [3, 6]  # 3 is now the best; 4 (0.95) and 5 (no metric) go


def test_save_best_keeps_steps_without_metrics_when_asked(tmp_path):
    ckpt = _best(tmp_path, keep=1, force_keep_period=10)
    _log_accuracy(str(tmp_path), {11: 0.2, 12: 0.3})
    for step in (10, 11, 12, 13, 14):
        ckpt.save(_state(step))
    assert ckpt.all_steps() == [10, 12, 13, 14]  # 10 by the period, 13 without a metric, 12 the best


def test_save_best_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="metric_mode must be 'max' or 'min'"):
        _best(tmp_path, metric_mode="best")
    with pytest.raises(ValueError, match="'<event folder>/<tag>'"):
        checkpoints.SaveBestCheckpointer(_state(), None, str(tmp_path), metric_name_to_monitor="accuracy")
