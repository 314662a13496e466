"""The on-disk format, file by file, and reading checkpoints built by hand to its description."""

import json
import os

import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
import tensorstore as ts
from ckpt_helpers import assert_same_tree, make_state

from t5x.checkpointing import (
    Checkpointer,
    CheckpointIntegrityError,
    CorruptIndexError,
    UnsafeSpecError,
    load_t5x_checkpoint,
    save_t5x_checkpoint,
)
from t5x.checkpointing._tree import flatten


def _ext_array(array):
    """An array as the index stores it: msgpack ext 1 of [shape, dtype name, bytes]."""
    payload = msgpack.packb([list(array.shape), array.dtype.name, array.tobytes()], use_bin_type=True)
    return msgpack.ExtType(1, payload)


def test_layout_file_by_file(tmp_path):
    state = make_state()
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(7, state, {"position": 3})
    step_dir = tmp_path / "checkpoint_7"
    leaves = flatten(state)
    array_dirs = {".".join(path) for path, value in leaves.items() if np.ndim(value) > 0}
    assert "target.encoder.layers_0.attention.query.kernel" in array_dirs
    assert "state.param_states.encoder.layers_0.attention.query.kernel.v_row" in array_dirs
    assert sorted(os.listdir(step_dir)) == sorted(
        array_dirs | {"checkpoint", "checksums.json", "train_ds-000-of-001.json"}
    )
    assert json.loads((step_dir / "train_ds-000-of-001.json").read_text()) == {"position": 3}

    index = msgpack.unpackb((step_dir / "checkpoint").read_bytes(), raw=False, strict_map_key=False)
    assert set(index) == {"version", "optimizer"}
    assert index["version"] == 3
    assert set(index["optimizer"]) == {"target", "state"}
    assert set(index["optimizer"]["state"]) == {"step", "param_states"}
    step = index["optimizer"]["state"]["step"]
    assert isinstance(step, msgpack.ExtType) and step.code in (1, 3)
    shape, dtype, raw = msgpack.unpackb(step.data, raw=False)
    assert (shape, dtype, np.frombuffer(raw, np.int32).tolist()) == ([], "int32", [7])

    spec = index["optimizer"]["target"]["token_embedder"]["embedding"]
    assert spec == {
        "driver": "zarr",
        "dtype": "bfloat16",
        "kvstore": {"driver": "file", "path": "target.token_embedder.embedding"},
        "metadata": {"chunks": [40, 16], "compressor": {"id": "zstd", "level": 1}, "shape": [40, 16]},
    }
    for path, value in leaves.items():
        if np.ndim(value) == 0:
            continue
        folder = step_dir / ".".join(path)
        zarray = json.loads((folder / ".zarray").read_text())
        assert zarray["zarr_format"] == 2
        assert zarray["shape"] == list(np.shape(value))
        assert zarray["compressor"]["id"] == "zstd"
        want_dtype = "bfloat16" if np.asarray(value).dtype == jnp.bfloat16 else np.asarray(value).dtype.str
        assert zarray["dtype"] == want_dtype
        chunk_files = [name for name in os.listdir(folder) if name != ".zarray"]
        assert chunk_files == [".".join("0" * np.ndim(value))], f"{folder}: {chunk_files}"


def test_flax_reads_our_index(tmp_path):
    serialization = pytest.importorskip(
        "flax.serialization", reason="flax is the upstream reader of the index"
    )
    save_t5x_checkpoint(tmp_path, 7, make_state())
    contents = serialization.msgpack_restore((tmp_path / "checkpoint_7" / "checkpoint").read_bytes())
    assert int(contents["optimizer"]["state"]["step"]) == 7
    spec = contents["optimizer"]["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    spec["kvstore"]["path"] = str(tmp_path / "checkpoint_7" / spec["kvstore"]["path"])
    stored = ts.open(spec).result().read().result()
    np.testing.assert_array_equal(
        stored, make_state()["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    )


def _write_zarr(path, array, chunks, compressor):
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": str(path)},
        "metadata": {
            "shape": list(array.shape),
            "chunks": chunks,
            "compressor": compressor,
            "dtype": "bfloat16" if array.dtype == jnp.bfloat16 else array.dtype.str,
        },
    }
    ts.open(spec, create=True).result().write(array).result()


def test_reads_checkpoint_assembled_by_hand(tmp_path):
    rng = np.random.default_rng(0)
    kernel = rng.standard_normal((6, 10)).astype(np.float32)
    embedding = rng.standard_normal((7, 4)).astype(jnp.bfloat16)
    v_row = rng.standard_normal(6).astype(np.float32)
    scale = rng.standard_normal(3).astype(np.float32)
    step_dir = tmp_path / "checkpoint_42"
    step_dir.mkdir()
    # Uneven chunks, gzip and zstd, bfloat16 stored natively.
    _write_zarr(step_dir / "target.dense.kernel", kernel, [4, 3], {"id": "gzip"})
    _write_zarr(step_dir / "target.embed.embedding", embedding, [2, 4], {"id": "zstd", "level": 3})
    _write_zarr(step_dir / "state.param_states.dense.kernel.v_row", v_row, [5], None)
    index = {
        "version": 3,
        "optimizer": {
            "target": {
                "dense": {
                    "kernel": {
                        "driver": "zarr",
                        "kvstore": {"driver": "file", "path": "target.dense.kernel"},
                        "metadata": {"shape": [6, 10], "chunks": [4, 3], "compressor": {"id": "gzip"}},
                        "dtype": "float32",
                    }
                },
                # The layout of TensorStore < 0.1.14: the path at the top level.
                "embed": {
                    "embedding": {
                        "driver": "zarr",
                        "kvstore": {"driver": "file"},
                        "path": "target.embed.embedding",
                        "dtype": "bfloat16",
                        "metadata": {"shape": [7, 4], "chunks": [2, 4]},
                    }
                },
                "norm": {"scale": _ext_array(scale)},
            },
            "state": {
                "step": _ext_array(np.array(42, np.int32)),
                "param_states": {
                    "dense": {
                        "kernel": {
                            "v_row": {
                                "driver": "zarr",
                                "dtype": "float32",
                                "kvstore": {
                                    "driver": "gcs",
                                    "bucket": "t5x-dummy-bucket",
                                    "path": "state.param_states.dense.kernel.v_row",
                                },
                            }
                        }
                    },
                },
            },
        },
    }
    (step_dir / "checkpoint").write_bytes(msgpack.packb(index, use_bin_type=True))
    loaded = load_t5x_checkpoint(tmp_path)
    want = {
        "target": {"dense": {"kernel": kernel}, "embed": {"embedding": embedding}, "norm": {"scale": scale}},
        "state": {"step": np.array(42, np.int32), "param_states": {"dense": {"kernel": {"v_row": v_row}}}},
    }
    assert_same_tree(loaded, want)
    restored = Checkpointer(tmp_path).restore(target=want)
    assert restored.step == 42
    assert_same_tree(restored.state, want)


def _copy_with_index(tmp_path, mutate):
    save_t5x_checkpoint(tmp_path, 1, make_state())
    path = tmp_path / "checkpoint_1" / "checkpoint"
    index = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    mutate(index)
    path.write_bytes(msgpack.packb(index, use_bin_type=True))


@pytest.mark.parametrize("bad_path", ["../../etc", "/etc/passwd", "a/../../b", "file:///etc"])
def test_spec_path_escaping_the_folder_is_rejected(tmp_path, bad_path):
    def mutate(index):
        index["optimizer"]["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]["kvstore"][
            "path"
        ] = bad_path

    _copy_with_index(tmp_path, mutate)
    with pytest.raises(UnsafeSpecError, match="target.encoder.layers_0.attention.query.kernel"):
        load_t5x_checkpoint(tmp_path)


def test_corrupt_index_names_the_file(tmp_path):
    save_t5x_checkpoint(tmp_path, 1, make_state())
    index = tmp_path / "checkpoint_1" / "checkpoint"
    index.write_bytes(b"\xc1\xc1 not msgpack")
    with pytest.raises(CorruptIndexError, match=str(index)):
        load_t5x_checkpoint(tmp_path)
    index.write_bytes(b"model_checkpoint_path: 'model.ckpt-100'")
    with pytest.raises(CorruptIndexError, match="TensorFlow"):
        load_t5x_checkpoint(tmp_path)


def test_unknown_extension_type_is_rejected_not_unpickled(tmp_path):
    def mutate(index):
        index["optimizer"]["state"]["step"] = msgpack.ExtType(99, b"\x80\x04payload")

    _copy_with_index(tmp_path, mutate)
    with pytest.raises(CorruptIndexError, match="extension type 99"):
        load_t5x_checkpoint(tmp_path)


def test_missing_array_file_names_the_parameter(tmp_path):
    save_t5x_checkpoint(tmp_path, 1, make_state())
    folder = tmp_path / "checkpoint_1" / "target.encoder.layers_0.attention.out.kernel"
    for name in os.listdir(folder):
        os.remove(folder / name)
    os.rmdir(folder)
    with pytest.raises(CheckpointIntegrityError, match="target.encoder.layers_0.attention.out.kernel"):
        load_t5x_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="target.encoder.layers_0.attention.out.kernel"):
        load_t5x_checkpoint(tmp_path, verify=False)


def test_incomplete_step_folders_are_invisible(tmp_path):
    save_t5x_checkpoint(tmp_path, 1, make_state())
    (tmp_path / "checkpoint_2.tmp-123").mkdir()
    (tmp_path / "checkpoint_3").mkdir()  # no index: an interrupted copy
    checkpointer = Checkpointer(tmp_path)
    assert checkpointer.all_steps() == [1]
    assert (tmp_path / "checkpoint_2.tmp-123").exists(), "opening (e.g. to read) deletes nothing"
    checkpointer.save(4, make_state())
    checkpointer.wait_until_finished()
    assert (tmp_path / "checkpoint_2.tmp-123").exists(), "a save removes only its own temporaries"
    assert checkpointer.remove_abandoned_saves() == [str(tmp_path / "checkpoint_2.tmp-123")]
    checkpointer.close()
    assert not (tmp_path / "checkpoint_2.tmp-123").exists()


def test_a_corrupt_newest_index_names_the_newest_valid_step(tmp_path):
    from t5x.checkpointing import CorruptIndexError

    save_t5x_checkpoint(tmp_path, 1, make_state())
    save_t5x_checkpoint(tmp_path, 2, make_state())
    (tmp_path / "checkpoint_2" / "checkpoint").write_bytes(b"\x00not msgpack")
    with pytest.raises(
        CorruptIndexError, match=r"checkpoint_2/checkpoint.*newest valid checkpoint is step 1"
    ):
        Checkpointer(tmp_path).restore()


def _write_orbax_layout_by_hand(item_dir, leaves):
    """Orbax's PyTree layout: _METADATA + one zarr array per leaf inside an OCDBT store."""
    item_dir.mkdir(parents=True)
    tree_metadata = {}
    for path, array in leaves.items():
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "ocdbt", "base": f"file://{item_dir}/", "path": ".".join(path) + "/"},
            "metadata": {
                "shape": list(array.shape),
                "chunks": list(array.shape),
                "dtype": "bfloat16" if array.dtype == jnp.bfloat16 else array.dtype.str,
                "compressor": {"id": "zstd", "level": 1},
            },
        }
        ts.open(spec, create=True).result().write(array).result()
        tree_metadata[str(path)] = {
            "key_metadata": [{"key": key, "key_type": 2} for key in path],
            "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False},
        }
    (item_dir / "_METADATA").write_text(
        json.dumps({"tree_metadata": tree_metadata, "use_ocdbt": True, "use_zarr3": False})
    )


def test_reads_orbax_ocdbt_layout(tmp_path):
    state = make_state()
    leaves = {path: np.asarray(value) for path, value in flatten(state).items()}
    _write_orbax_layout_by_hand(tmp_path / "checkpoint_7" / "state", leaves)
    assert Checkpointer(tmp_path).all_steps() == [7]
    assert_same_tree(load_t5x_checkpoint(tmp_path), state)
    assert_same_tree(load_t5x_checkpoint(tmp_path / "checkpoint_7" / "state"), state)
    assert_same_tree(Checkpointer(tmp_path).restore(target=state).state, state)


def test_reads_what_orbax_writes(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint", reason="optional comparison with the real Orbax writer")
    state = make_state()
    with ocp.StandardCheckpointer() as orbax_ckpt:
        orbax_ckpt.save(tmp_path / "checkpoint_5" / "state", state)
        orbax_ckpt.wait_until_finished()
    assert_same_tree(load_t5x_checkpoint(tmp_path), state)
