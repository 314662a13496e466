"""A damaged Hugging Face folder is named: which file, and what is wrong with it."""

import json

import numpy as np
import pytest

from t5x.checkpointing import HfFolderError, read_hf_folder, write_hf_folder

STATE = {"shared.weight": np.arange(32, dtype=np.float32).reshape(8, 4), "b": np.ones(3, np.int64)}


@pytest.fixture
def folder(tmp_path):
    write_hf_folder(tmp_path, STATE, {"model_type": "t5"})
    return tmp_path


def test_a_sound_folder_reads(folder):
    state, config = read_hf_folder(folder)
    assert config == {"model_type": "t5"}
    np.testing.assert_array_equal(state["shared.weight"], STATE["shared.weight"])


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda data: data[:-10], "truncated: its header describes"),
        (lambda data: data[:20], "header should be"),
        (lambda data: b"", "too short for a safetensors header"),
        (lambda data: (6).to_bytes(8, "little") + b"{oops}" + data[8:], "its header is not valid JSON"),
    ],
    ids=["truncated-data", "truncated-header", "empty", "garbage-header"],
)
def test_a_damaged_safetensors_file_is_named(folder, damage, expected):
    weights = folder / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(HfFolderError) as error:
        read_hf_folder(folder)
    message = str(error.value)
    assert message.startswith(f"{weights}: cannot read the safetensors file: ")
    assert expected in message
    assert isinstance(error.value, ValueError)


def test_a_truncated_bfloat16_file_is_named(tmp_path):
    import ml_dtypes

    write_hf_folder(tmp_path, {"w": np.ones((4, 4), ml_dtypes.bfloat16)}, {"model_type": "t5"})
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-2])
    with pytest.raises(HfFolderError, match="truncated"):
        read_hf_folder(tmp_path)


def test_a_broken_config_or_index_is_named(folder):
    (folder / "config.json").write_text('{"model_type": ')
    with pytest.raises(HfFolderError, match=rf"^{folder / 'config.json'}: not valid JSON"):
        read_hf_folder(folder)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = folder / "model.safetensors.index.json"
    weight_map = {
        "shared.weight": "model-00001-of-00002.safetensors",
        "x": "model-00002-of-00002.safetensors",
    }
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(FileNotFoundError, match="lists the shard model-00002-of-00002.safetensors"):
        read_hf_folder(folder)
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(HfFolderError, match='no "weight_map"'):
        read_hf_folder(folder)
