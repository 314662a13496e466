"""Damaged checkpoints are refused, naming the parameter, the file, expected and found.

One checkpoint (chunks made small, so arrays have several) is saved per module;
each test corrupts a copy one way and reads it every way there is: the whole
state, a Checkpointer restore into a target, with shardings, lazily, and
``verify_checkpoint``. Then: checkpoints without checksums load (logging once),
the opt-out, the manifest's own protection, and temporary folders of several
writers.
"""

import json
import logging
import os
import re
import shutil
import threading

import jax
import msgpack
import numpy as np
import pytest
from ckpt_helpers import assert_same_tree, make_state, run_script

from t5x.checkpointing import (
    Checkpointer,
    CheckpointIntegrityError,
    LazyArray,
    UnsafeSpecError,
    VerificationReport,
    _format,
    _specs,
    load_t5x_checkpoint,
    verify_checkpoint,
)

KERNEL = "target.encoder.layers_0.attention.query.kernel"  # (16, 8) float32: chunks (4, 8)
ZEROS = "state.param_states.encoder.layers_0.attention.query.kernel.v"  # zeros(1): the fill value
STEP = 7


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("pristine") / "model"
    with pytest.MonkeyPatch.context() as patch:
        real = _specs.choose_chunk_shape
        patch.setattr(_specs, "choose_chunk_shape", lambda shape, itemsize: real(shape, itemsize, 128))
        ckpt = Checkpointer(model_dir, async_save=False)
        ckpt.save(STEP, make_state(step=STEP), {"position": 3})
        ckpt.close()
    assert sorted(os.listdir(model_dir / f"checkpoint_{STEP}" / KERNEL)) == [
        ".zarray",
        "0.0",
        "1.0",
        "2.0",
        "3.0",
    ]
    return model_dir


@pytest.fixture
def model_dir(pristine, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(pristine, copy, symlinks=True)
    return copy


def _step(model_dir):
    return model_dir / f"checkpoint_{STEP}"


def _edit_zarray(folder, **changes):
    path = folder / ".zarray"
    zarray = json.loads(path.read_text())
    zarray.update(changes)
    path.write_text(json.dumps(zarray))


# ---- corruptions: each returns (parameter, file named, expected-vs-found pattern) ------------


def delete_chunk(step):
    os.remove(step / KERNEL / "2.0")
    return KERNEL, f"{KERNEL}/2.0", "is missing"


def delete_fill_value_chunk(step):
    # Its values equal the fill value: without the recorded chunk list it would read back the same.
    os.remove(step / ZEROS / "0")
    return ZEROS, f"{ZEROS}/0", "is missing"


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def flip_byte(step):
    _flip(step / KERNEL / "1.0")
    return KERNEL, f"{KERNEL}/1.0", r"expected xxh3_64 [0-9a-f]+, found [0-9a-f]+|ZSTD"


def edit_fill_value(step):
    _edit_zarray(step / KERNEL, fill_value=0.5)
    return KERNEL, f"{KERNEL}/.zarray", "fill_value expected null, found 0.5"


def edit_shape(step):
    _edit_zarray(step / KERNEL, shape=[8, 16])
    return KERNEL, f"{KERNEL}/.zarray", r"shape expected \[16, 8\], found \[8, 16\]"


def edit_dtype(step):
    _edit_zarray(step / KERNEL, dtype="<i4")
    return KERNEL, f"{KERNEL}/.zarray", 'dtype expected "<f4", found "<i4"'


def delete_array_folder(step):
    shutil.rmtree(step / KERNEL)
    return KERNEL, KERNEL, "is missing"


def symlink_array_folder(step):
    outside = step.parent.parent / "elsewhere" / KERNEL
    shutil.copytree(step / KERNEL, outside)  # an identical array, outside the step folder
    shutil.rmtree(step / KERNEL)
    os.symlink(outside, step / KERNEL)
    return KERNEL, KERNEL, "outside the step folder"


def symlink_chunk_file(step):
    outside = step.parent.parent / "elsewhere-0.0"
    shutil.copyfile(step / KERNEL / "0.0", outside)
    os.remove(step / KERNEL / "0.0")
    os.symlink(outside, step / KERNEL / "0.0")
    return KERNEL, f"{KERNEL}/0.0", "outside the step folder"


CORRUPTIONS = [
    delete_chunk,
    delete_fill_value_chunk,
    flip_byte,
    edit_fill_value,
    edit_shape,
    edit_dtype,
    delete_array_folder,
    symlink_array_folder,
    symlink_chunk_file,
]


# ---- every way of reading ------------------------------------------------------------------


def _read_everything(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def load_whole(model_dir):
    load_t5x_checkpoint(model_dir)


def load_lazily(model_dir):
    tree = load_t5x_checkpoint(model_dir, lazy=True)
    assert any(isinstance(leaf, LazyArray) for leaf in jax.tree.leaves(tree))
    _read_everything(tree)


def restore_into_target(model_dir):
    Checkpointer(model_dir).restore(target=make_state(step=STEP))


def restore_sharded(model_dir):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    state = make_state(step=STEP)
    Checkpointer(model_dir).restore(target=state, shardings=jax.tree.map(lambda _: sharding, state))


def restore_lazily(model_dir):
    _read_everything(Checkpointer(model_dir).restore(lazy=True).state)


def verify(model_dir):
    verify_checkpoint(model_dir)


READERS = [load_whole, load_lazily, restore_into_target, restore_sharded, restore_lazily, verify]


@pytest.mark.parametrize("read", READERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_corruption_is_refused_naming_parameter_file_and_values(model_dir, corrupt, read):
    step = _step(model_dir)
    name, file_name, found = corrupt(step)
    with pytest.raises(CheckpointIntegrityError) as info:
        read(model_dir)
    message = str(info.value)
    assert name in message and str(step / file_name) in message, message
    assert info.value.name == name
    assert re.search(found, message), message


@pytest.mark.parametrize("read", READERS, ids=lambda f: f.__name__)
def test_intact_checkpoint_reads_every_way(pristine, read):
    read(pristine)
    assert_same_tree(load_t5x_checkpoint(pristine), make_state(step=STEP))


def _records(step):
    """The manifest's array records with each whole .zarray put back (as version 1 stored them)."""
    from t5x.checkpointing import _manifest

    manifest = _manifest.load_manifest(str(step))
    return {
        folder: {**record, "zarray": manifest.zarray(folder)} for folder, record in manifest.arrays.items()
    }


def test_manifest_records_every_zarray_exactly_as_written(pristine):
    # The writer reads one .zarray per dtype and derives the others: each must equal its file.
    step = _step(pristine)
    stored = json.loads((step / "checksums.json").read_text())
    assert stored["version"] == 2
    arrays = _records(step)
    dtypes = {record["zarray"]["dtype"] for record in arrays.values()}
    assert len(arrays) == 16 and len(dtypes) > 1
    assert len(stored["zarrays"]) == len(dtypes)  # one shared body per dtype, not one per array
    for folder, record in arrays.items():
        assert record["zarray"] == json.loads((step / folder / ".zarray").read_bytes()), folder


def test_manifest_reads_every_zarray_when_it_cannot_derive_them(tmp_path, monkeypatch):
    from t5x.checkpointing import _integrity

    read = []
    real_read = _integrity.read_zarray
    monkeypatch.setattr(_integrity, "read_zarray", lambda folder: read.append(folder) or real_read(folder))
    monkeypatch.setattr(_integrity, "zarray_text", lambda zarray: b"formatted otherwise")
    Checkpointer(tmp_path, async_save=False).save(1, make_state())
    step = tmp_path / "checkpoint_1"
    arrays = _records(step)
    assert len(read) == len(arrays) == 16
    for folder, record in arrays.items():
        assert record["zarray"] == json.loads((step / folder / ".zarray").read_bytes())
    assert_same_tree(load_t5x_checkpoint(tmp_path), make_state())


def _as_version_1(step):
    """Rewrites a step's manifest in version 1's form: every array's whole .zarray and its file's digest."""
    import xxhash

    path = step / "checksums.json"
    contents = json.loads(path.read_text())
    arrays = {}
    for folder, record in _records(step).items():
        raw = (step / folder / ".zarray").read_bytes()
        arrays[folder] = {
            "zarray": record["zarray"],
            "zarray_digest": xxhash.xxh3_64_hexdigest(raw),
            "chunks": record["chunks"],
        }
    path.write_text(
        json.dumps({**{k: v for k, v in contents.items() if k != "zarrays"}, "version": 1, "arrays": arrays})
    )


@pytest.mark.parametrize("read", READERS, ids=lambda f: f.__name__)
def test_version_1_manifest_still_verifies(model_dir, read):
    _as_version_1(_step(model_dir))
    read(model_dir)
    assert_same_tree(load_t5x_checkpoint(model_dir), make_state(step=STEP))


@pytest.mark.parametrize("corrupt", [flip_byte, delete_chunk, edit_fill_value], ids=lambda f: f.__name__)
def test_version_1_manifest_still_catches_damage(model_dir, corrupt):
    step = _step(model_dir)
    _as_version_1(step)
    name, file_name, found = corrupt(step)
    for read in (restore_into_target, verify):
        with pytest.raises(CheckpointIntegrityError, match=found) as info:
            read(model_dir)
        assert info.value.name == name and str(step / file_name) in str(info.value)


def test_damaged_zarray_record_is_refused_naming_the_parameter(model_dir):
    manifest = _step(model_dir) / "checksums.json"
    contents = json.loads(manifest.read_text())
    contents["arrays"][KERNEL]["zarray"] = len(contents["zarrays"])  # no such body
    manifest.write_text(json.dumps(contents))
    with pytest.raises(
        CheckpointIntegrityError, match=f"{KERNEL}: the checksum manifest has no .zarray record"
    ):
        load_t5x_checkpoint(model_dir)
    contents["zarrays"] = {"not": "a list"}
    manifest.write_text(json.dumps(contents))
    with pytest.raises(CheckpointIntegrityError, match="'zarrays' must be a list of objects"):
        load_t5x_checkpoint(model_dir)


@pytest.mark.parametrize(
    ("field", "value"),
    [("chunk_shape", [0, 8]), ("shape", "16x8"), ("shape", [16, [8]]), ("chunk_shape", [4])],
)
def test_unusable_shape_record_is_refused_naming_the_parameter(model_dir, field, value):
    manifest = _step(model_dir) / "checksums.json"
    contents = json.loads(manifest.read_text())
    contents["arrays"][KERNEL][field] = value
    manifest.write_text(json.dumps(contents))
    with pytest.raises(CheckpointIntegrityError, match="has no valid shape / chunks") as info:
        load_t5x_checkpoint(model_dir)
    assert info.value.name == KERNEL and f"{KERNEL}/.zarray" in str(info.value)


def test_verification_report(pristine):
    report = verify_checkpoint(pristine)
    assert isinstance(report, VerificationReport)
    assert report.step == STEP and report.layout == "t5x" and report.fully_verified
    assert report.arrays == report.verified == 16 and report.unverified == 0
    assert report.files == 2 and report.inline == 1  # index + input state; the step
    assert report.chunks > report.arrays  # small chunks: several per matrix
    want = sum(np.asarray(x).nbytes for x in jax.tree.leaves(make_state()) if np.ndim(x) > 0)
    assert report.bytes == want
    text = str(report)
    assert "OK" in text and f"checkpoint_{STEP}" in text and "\n" not in text
    assert verify_checkpoint(_step(pristine) / "checkpoint").step == STEP


def test_verify_lists_every_problem(model_dir):
    step = _step(model_dir)
    delete_chunk(step)
    _edit_zarray(step / ZEROS, fill_value=1.0)
    with pytest.raises(CheckpointIntegrityError) as info:
        verify_checkpoint(model_dir)
    message = str(info.value)
    assert message.startswith(f"2 problems in {step}:"), message
    assert KERNEL in message and ZEROS in message
    assert sorted(p.name for p in info.value.problems) == sorted([ZEROS, KERNEL])


def test_partial_reads_check_only_the_chunks_they_read(model_dir):
    flip_byte(_step(model_dir))  # chunk 1.0: rows 4..7
    kernel = load_t5x_checkpoint(model_dir, lazy=True)["target"]["encoder"]["layers_0"]["attention"]["query"][
        "kernel"
    ]
    want = make_state()["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    np.testing.assert_array_equal(kernel.read_future((slice(9, 14), slice(2, 5))).result(), want[9:14, 2:5])
    with pytest.raises(CheckpointIntegrityError, match=f"{KERNEL}/1.0"):
        kernel.read_future((slice(3, 5), slice(0, 8))).result()


def test_restore_error_names_newest_valid_checkpoint(model_dir):
    ckpt = Checkpointer(model_dir, async_save=False)
    ckpt.save(STEP + 1, make_state(seed=1))
    _flip(model_dir / f"checkpoint_{STEP + 1}" / KERNEL / "0.0")  # one chunk: saved with the usual size
    with pytest.raises(CheckpointIntegrityError, match=f"newest valid checkpoint is step {STEP}"):
        ckpt.restore()


# ---- the index, the manifest and the input state are protected too ------------------------------


def test_changed_index_is_refused(model_dir):
    index = _step(model_dir) / "checkpoint"
    contents = msgpack.unpackb(index.read_bytes(), raw=False, strict_map_key=False)
    contents["optimizer"]["state"]["step"] = msgpack.ExtType(
        1, msgpack.packb([[], "int32", np.int32(8).tobytes()], use_bin_type=True)
    )
    index.write_bytes(msgpack.packb(contents, use_bin_type=True))
    with pytest.raises(CheckpointIntegrityError, match=f"{index} changed since it was written"):
        load_t5x_checkpoint(model_dir)
    with pytest.raises(CheckpointIntegrityError, match=str(index)):
        verify_checkpoint(model_dir)


def test_damaged_manifest_is_refused(model_dir):
    manifest = _step(model_dir) / "checksums.json"
    manifest.write_text(manifest.read_text()[:-10])
    with pytest.raises(CheckpointIntegrityError, match=f"checksum manifest {manifest} is damaged"):
        load_t5x_checkpoint(model_dir)


def test_changed_recorded_checksum_is_refused(model_dir):
    manifest = _step(model_dir) / "checksums.json"
    contents = json.loads(manifest.read_text())
    contents["arrays"][KERNEL]["chunks"]["3.0"] = "0123456789abcdef"
    manifest.write_text(json.dumps(contents))
    with pytest.raises(CheckpointIntegrityError, match=f"{KERNEL}/3.0 .*expected xxh3_64 0123456789abcdef"):
        load_t5x_checkpoint(model_dir)


def test_manifest_is_parsed_again_when_its_bytes_change(model_dir):
    from t5x.checkpointing import _manifest

    step = _step(model_dir)
    first = _manifest.load_manifest(str(step))
    assert _manifest.load_manifest(str(step)) is first  # same bytes: parsed once (restore reads it twice)
    manifest = step / "checksums.json"
    contents = json.loads(manifest.read_text())
    contents["arrays"][KERNEL]["chunks"]["3.0"] = "0123456789abcdef"
    manifest.write_text(json.dumps(contents))
    assert _manifest.load_manifest(str(step)).arrays[KERNEL]["chunks"]["3.0"] == "0123456789abcdef"


def test_changed_input_state_is_refused(model_dir):
    path = _step(model_dir) / "train_ds-000-of-001.json"
    path.write_text(json.dumps({"position": 4}))
    with pytest.raises(CheckpointIntegrityError, match=f"{path} changed since it was written"):
        Checkpointer(model_dir).restore()
    with pytest.raises(CheckpointIntegrityError, match=str(path)):
        verify_checkpoint(model_dir)


# ---- checkpoints without checksums, and the opt-out ---------------------------------------------


def test_checkpoint_without_checksums_loads_and_logs_once(model_dir, caplog):
    os.remove(_step(model_dir) / "checksums.json")  # as upstream T5X, or we before checksums, wrote it
    with caplog.at_level(logging.WARNING, logger="t5x.checkpointing"):
        assert_same_tree(load_t5x_checkpoint(model_dir), make_state(step=STEP))
        restored = Checkpointer(model_dir).restore(target=make_state(step=STEP))
        assert_same_tree(restored.state, make_state(step=STEP))
        assert restored.input_state == {"position": 3}
    notes = [r.getMessage() for r in caplog.records if "UNVERIFIED" in r.getMessage()]
    assert len(notes) == 1 and str(_step(model_dir)) in notes[0], notes
    report = verify_checkpoint(model_dir)
    assert not report.fully_verified and report.unverified == report.arrays == 16 and report.chunks == 0
    assert "UNVERIFIED" in str(report)


def test_orbax_layout_loads_unverified(tmp_path, caplog):
    from test_format import _write_orbax_layout_by_hand

    from t5x.checkpointing._tree import flatten

    state = make_state()
    leaves = {path: np.asarray(value) for path, value in flatten(state).items()}
    _write_orbax_layout_by_hand(tmp_path / "checkpoint_3" / "state", leaves)
    with caplog.at_level(logging.WARNING, logger="t5x.checkpointing"):
        assert_same_tree(load_t5x_checkpoint(tmp_path), state)
    assert any("UNVERIFIED" in r.getMessage() for r in caplog.records)
    report = verify_checkpoint(tmp_path)
    assert report.layout == "orbax" and report.unverified == report.arrays == len(leaves)


def test_orbax_layout_refuses_links_out_of_the_step_folder(tmp_path):
    from test_format import _write_orbax_layout_by_hand

    _write_orbax_layout_by_hand(tmp_path / "checkpoint_3" / "state", {("target", "w"): np.ones((2, 3))})
    item = tmp_path / "checkpoint_3" / "state"
    manifest = item / "manifest.ocdbt"
    outside = tmp_path / "outside.ocdbt"
    shutil.move(manifest, outside)
    os.symlink(outside, manifest)
    with pytest.raises(CheckpointIntegrityError, match=f"{manifest} is a link to {outside}"):
        load_t5x_checkpoint(tmp_path, verify=False)


def test_orbax_layout_refuses_names_escaping_the_folder(tmp_path):
    item = tmp_path / "checkpoint_3" / "state"
    item.mkdir(parents=True)
    (item / "_METADATA").write_text(
        json.dumps({"tree_metadata": {"('../../etc',)": {}}, "use_ocdbt": False, "use_zarr3": False})
    )
    with pytest.raises(UnsafeSpecError, match="escapes"):
        load_t5x_checkpoint(tmp_path)


def test_unverified_checkpoint_still_checks_index_against_arrays(model_dir):
    step = _step(model_dir)
    os.remove(step / "checksums.json")
    _edit_zarray(step / KERNEL, shape=[8, 16])
    with pytest.raises(
        CheckpointIntegrityError,
        match=rf"{KERNEL}: shape mismatch .*index expects \(16, 8\), the array has \(8, 16\)",
    ):
        load_t5x_checkpoint(model_dir)


@pytest.mark.parametrize("corrupt", [symlink_array_folder, symlink_chunk_file], ids=lambda f: f.__name__)
def test_links_out_of_the_step_folder_are_refused_even_unverified(model_dir, corrupt):
    step = _step(model_dir)
    os.remove(step / "checksums.json")
    name, file_name, _ = corrupt(step)
    for verify_reads in (True, False):
        pattern = f"{re.escape(name)}: .*{re.escape(str(step / file_name))}.* outside the step folder"
        with pytest.raises(CheckpointIntegrityError, match=pattern):
            load_t5x_checkpoint(model_dir, verify=verify_reads)


def test_links_inside_the_step_folder_are_allowed(model_dir):
    step = _step(model_dir)
    shutil.move(step / KERNEL, step / "moved")
    os.symlink(step / "moved", step / KERNEL)
    assert_same_tree(load_t5x_checkpoint(model_dir), make_state(step=STEP))


def test_verify_false_skips_the_checks(model_dir):
    flip_byte(_step(model_dir))
    loaded = load_t5x_checkpoint(model_dir, verify=False)
    kernel = loaded["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    want = make_state()["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    assert not np.array_equal(kernel[4:8], want[4:8]) or np.isnan(kernel[4:8]).any()
    Checkpointer(model_dir, verify=False).restore(target=make_state(step=STEP))
    Checkpointer(model_dir).restore(target=make_state(step=STEP), verify=False)
    with pytest.raises(CheckpointIntegrityError):
        Checkpointer(model_dir, verify=False).restore(target=make_state(step=STEP), verify=True)


# ---- several writers in one model folder ----------------------------------------------------------


def test_a_save_leaves_other_writers_temporary_folders_alone(tmp_path, monkeypatch):
    first, second = Checkpointer(tmp_path), Checkpointer(tmp_path, async_save=False)
    real_write = _format.write_arrays
    started, release = threading.Event(), threading.Event()

    def stalled_for_first(step_dir, *args, **kwargs):
        if first._writer in step_dir:
            started.set()
            assert release.wait(60)
        return real_write(step_dir, *args, **kwargs)

    monkeypatch.setattr(_format, "write_arrays", stalled_for_first)
    old_form = tmp_path / "checkpoint_1.tmp-123"  # a killed writer's folder, named as before
    old_form.mkdir()
    first.save(2, make_state(seed=2))
    assert started.wait(60)
    (in_progress,) = [p for p in tmp_path.iterdir() if first._writer in p.name]
    second.save(3, make_state(seed=3))
    assert in_progress.is_dir() and old_form.is_dir()
    assert first.remove_abandoned_saves() == [str(old_form)]  # never its own folder
    assert in_progress.is_dir()
    release.set()
    first.wait_until_finished()
    assert first.all_steps() == [2, 3]
    assert_same_tree(load_t5x_checkpoint(tmp_path, step=2), make_state(seed=2))

    dead = tmp_path / "checkpoint_4.tmp-99-4321-deadbeef"  # a killed writer's folder
    dead.mkdir()
    second.save(5, make_state())
    assert dead.is_dir()
    assert second.remove_abandoned_saves() == [str(dead)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_2", "checkpoint_3", "checkpoint_5"]
    first.close()
    second.close()


# ---- re-sharded restores read and check whole chunks ------------------------------------------------

_EIGHT_DEVICES = """
import os, shutil, sys
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from t5x.checkpointing import CheckpointIntegrityError, Checkpointer, verify_checkpoint

root = sys.argv[1]
auto = (jax.sharding.AxisType.Auto,) * 2
saved_on = jax.make_mesh((4, 2), ("data", "model"), devices=jax.devices(), axis_types=auto)
kernel = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
state = {"target": {"dense": {"kernel": jax.device_put(kernel, NamedSharding(saved_on, P("data", "model")))}},
         "state": {"step": np.int32(1)}}
ckpt = Checkpointer(root + "/good")
ckpt.save(1, state)
ckpt.close()
folder = "/checkpoint_1/target.dense.kernel"
assert sorted(os.listdir(root + "/good" + folder))[-1] == "3.1"  # one (4, 4) chunk per shard
restore_on = jax.make_mesh((2, 4), ("a", "b"), devices=jax.devices()[::-1], axis_types=auto)
shardings = {"target": {"dense": {"kernel": NamedSharding(restore_on, P("b", "a"))}},
             "state": {"step": NamedSharding(restore_on, P())}}
target = {"target": {"dense": {"kernel": kernel}}, "state": {"step": np.int32(1)}}
restored = Checkpointer(root + "/good").restore(target=target, shardings=shardings).state
np.testing.assert_array_equal(np.asarray(restored["target"]["dense"]["kernel"]), kernel)

def flip(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))

for name, corrupt in (("flip", flip), ("delete", os.remove)):
    shutil.copytree(root + "/good", root + "/" + name)
    corrupt(root + "/" + name + folder + "/2.1")
    for check in (lambda: Checkpointer(root + "/" + name).restore(target=target, shardings=shardings),
                  lambda: verify_checkpoint(root + "/" + name)):
        try:
            check()
        except CheckpointIntegrityError as error:
            assert "target.dense.kernel" in str(error) and folder + "/2.1" in str(error), error
        else:
            raise SystemExit(name + ": loaded without error")
print("OK")
"""


def test_resharded_restore_on_8_devices_checks_chunks(tmp_path):
    out = run_script(_EIGHT_DEVICES, str(tmp_path), devices=8)
    assert "OK" in out.stdout
