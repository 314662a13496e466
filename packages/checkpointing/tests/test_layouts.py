import numpy as np
import pytest
from ckpt_helpers import assert_same_tree, make_state

from t5x.checkpointing import model_info, scan_layers, unscan_layers, write_model_info


def _scanned(num_layers=3):
    rng = np.random.default_rng(0)
    return {
        "encoder": {
            "layers": {
                "attention": {
                    "query": {"kernel": rng.standard_normal((8, num_layers, 4)).astype(np.float32)}
                },
                "pre_attention_layer_norm": {
                    "scale": rng.standard_normal((8, num_layers)).astype(np.float32)
                },
            },
            "encoder_norm": {"scale": np.ones(8, np.float32)},
        }
    }


def test_unscan_splits_the_layers_axis():
    scanned = _scanned()
    unscanned = unscan_layers(scanned)
    assert sorted(unscanned["encoder"]) == ["encoder_norm", "layers_0", "layers_1", "layers_2"]
    np.testing.assert_array_equal(
        unscanned["encoder"]["layers_1"]["attention"]["query"]["kernel"],
        scanned["encoder"]["layers"]["attention"]["query"]["kernel"][:, 1, :],
    )
    assert unscanned["encoder"]["layers_2"]["pre_attention_layer_norm"]["scale"].shape == (8,)


def test_scan_is_the_inverse_of_unscan():
    scanned = _scanned()
    assert_same_tree(scan_layers(unscan_layers(scanned)), scanned)


def test_scan_rejects_gaps_and_mismatched_layers():
    unscanned = unscan_layers(_scanned())
    gap = dict(unscanned["encoder"])
    del gap["layers_1"]
    with pytest.raises(ValueError, match=r"0\.\.1"):
        scan_layers({"encoder": gap})
    odd = dict(unscanned["encoder"])
    odd["layers_1"] = {"other": {"kernel": np.zeros(2)}}
    with pytest.raises(ValueError, match="layers_1"):
        scan_layers({"encoder": odd})


def test_unscan_rejects_disagreeing_layer_counts():
    bad = _scanned()
    bad["encoder"]["layers"]["pre_attention_layer_norm"]["scale"] = np.zeros((8, 2))
    with pytest.raises(ValueError, match="layer count"):
        unscan_layers(bad)


def test_model_info_lines(tmp_path):
    state = make_state()
    axes = {"target": {"encoder": {"layers_0": {"attention": {"query": {"kernel": ("embed", "joined_kv")}}}}}}
    specs = {"target": {"encoder": {"layers_0": {"attention": {"query": {"kernel": ("data", "model")}}}}}}
    text = model_info(state, axes, specs)
    lines = text.splitlines()
    query = next(line for line in lines if "encoder/layers_0/attention/query/kernel" in line)
    assert query == (
        "Variable "
        + "encoder/layers_0/attention/query/kernel".ljust(80)
        + " size "
        + "128".ljust(12)
        + " shape "
        + "(embed=16, joined_kv=8)".ljust(40)
        + " partition spec ('data', 'model')"
    )
    norm = next(
        line for line in lines if "pre_attention_layer_norm/scale" in line and "param_states" not in line
    )
    assert "shape (16,)" in norm and norm.endswith("partition spec None")
    total = 16 * 8 + 8 * 16 + 16 + 40 * 16
    blank = lines.index("")
    assert lines[blank - 1] == f"Total number of parameters: {total}"
    after = lines[blank + 1 :]
    assert any(line.startswith("Variable param_states/token_embedder/embedding/v_row ") for line in after)
    assert any(line.startswith("Variable step ") and "size 1 " in line for line in after)
    write_model_info(str(tmp_path / "model-info.txt"), state, axes, specs)
    assert (tmp_path / "model-info.txt").read_text() == text
