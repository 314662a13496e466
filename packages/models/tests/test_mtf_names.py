"""Mesh TensorFlow variable names -> T5X state-dict paths (no TensorFlow needed)."""

from __future__ import annotations

import numpy as np
import pytest

from t5x.models import T5Config, mtf_to_t5x_state, mtf_variable_to_t5x, t5_config_from_params


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("global_step", ("state", "step")),
        ("shared/embedding", ("target", "token_embedder", "embedding")),
        ("shared/embedding_slot_vr", ("state", "param_states", "token_embedder", "embedding", "v_row")),
        (
            "encoder/block_011/layer_000/SelfAttention/q",
            ("target", "encoder", "layers_11", "attention", "query", "kernel"),
        ),
        (
            "decoder/block_002/layer_001/EncDecAttention/o_slot_vc",
            (
                "state",
                "param_states",
                "decoder",
                "layers_2",
                "encoder_decoder_attention",
                "out",
                "kernel",
                "v_col",
            ),
        ),
        (
            "decoder/block_000/layer_000/SelfAttention/relative_attention_bias",
            ("target", "decoder", "layers_0", "relpos_bias", "rel_embedding"),
        ),
        (
            "decoder/block_003/layer_002/DenseReluDense/wi/kernel",
            ("target", "decoder", "layers_3", "mlp", "wi", "kernel"),
        ),
        (
            "encoder/block_001/layer_001/rms_norm/scale_slot_v",
            ("state", "param_states", "encoder", "layers_1", "pre_mlp_layer_norm", "scale", "v"),
        ),
        (
            "decoder/block_001/layer_001/layer_norm/scale",
            ("target", "decoder", "layers_1", "pre_cross_attention_layer_norm", "scale"),
        ),
        ("decoder/final_layer_norm/scale", ("target", "decoder", "decoder_norm", "scale")),
        (
            "decoder/logits/kernel_slot_vr",
            ("state", "param_states", "decoder", "logits_dense", "kernel", "v_row"),
        ),
        ("encoder/block_000/layer_000/SelfAttention/q_norm", None),
        ("transformer/block_000/layer_000/SelfAttention/q", None),
    ],
)
def test_variable_names_follow_upstream_rules(name, path):
    assert mtf_variable_to_t5x(name) == path


def test_an_encoder_norm_outside_its_two_sublayers_is_an_error():
    with pytest.raises(ValueError, match="encoder block 0 has a layer norm in sub-layer 2"):
        mtf_variable_to_t5x("encoder/block_000/layer_002/layer_norm/scale")


def _variables(per_layer: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {"shared/embedding": rng.normal(size=(10, 4)), "global_step": np.int64(42)}
    for block in range(2):
        enc = f"encoder/block_{block:03d}"
        out[f"{enc}/layer_000/layer_norm/scale"] = rng.normal(size=(4,))
        for m in "qkv":
            out[f"{enc}/layer_000/SelfAttention/{m}"] = rng.normal(size=(4, 6))
        out[f"{enc}/layer_000/SelfAttention/o"] = rng.normal(size=(6, 4))
        out[f"{enc}/layer_001/layer_norm/scale"] = rng.normal(size=(4,))
        out[f"{enc}/layer_001/DenseReluDense/wi/kernel"] = rng.normal(size=(4, 8))
        out[f"{enc}/layer_001/DenseReluDense/wo/kernel"] = rng.normal(size=(8, 4))
        if block == 0 or per_layer:
            out[f"{enc}/layer_000/SelfAttention/relative_attention_bias"] = rng.normal(size=(2, 5))
    out["encoder/block_000/layer_000/SelfAttention/q_slot_vr"] = rng.normal(size=(4,))
    out["encoder/block_000/layer_000/SelfAttention/q_slot_vc"] = rng.normal(size=(6,))
    out["encoder/final_layer_norm/scale_slot_v"] = rng.normal(size=(4,))
    out["encoder/final_layer_norm/scale"] = rng.normal(size=(4,))
    return out


def test_state_dict_collapses_a_shared_relative_bias_and_fills_flax_slots():
    variables = _variables(per_layer=False)
    state = mtf_to_t5x_state(variables)
    assert int(state["state"]["step"]) == 42 and state["state"]["step"].dtype == np.int32
    encoder = state["target"]["encoder"]
    np.testing.assert_array_equal(
        encoder["relpos_bias"]["rel_embedding"],
        variables["encoder/block_000/layer_000/SelfAttention/relative_attention_bias"],
    )
    assert "relpos_bias" not in encoder["layers_0"]
    q_slots = state["state"]["param_states"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    np.testing.assert_array_equal(
        q_slots["v_row"], variables["encoder/block_000/layer_000/SelfAttention/q_slot_vr"]
    )
    assert q_slots["v"].shape == q_slots["m"].shape == (1,)
    norm_slots = state["state"]["param_states"]["encoder"]["encoder_norm"]["scale"]
    assert norm_slots["v_row"].shape == norm_slots["v_col"].shape == (1,)
    # Parameters without slots in the checkpoint get none.
    assert "layers_1" not in state["state"]["param_states"]["encoder"]


def test_per_layer_relative_bias_stays_in_each_layer():
    state = mtf_to_t5x_state(_variables(per_layer=True))
    encoder = state["target"]["encoder"]
    assert "relpos_bias" not in encoder
    assert encoder["layers_1"]["relpos_bias"]["rel_embedding"].shape == (2, 5)


def test_unmapped_variables_and_empty_checkpoints_are_refused():
    with pytest.raises(ValueError, match=r"no T5X name: \['decoder/something'\]"):
        mtf_to_t5x_state({**_variables(False), "decoder/something": np.zeros(1)})
    with pytest.raises(ValueError, match="no T5 parameters"):
        mtf_to_t5x_state({"global_step": np.int64(1)})


def test_config_from_parameter_shapes():
    params = {
        "token_embedder": {"embedding": np.zeros((48, 16))},
        "encoder": {
            "relpos_bias": {"rel_embedding": np.zeros((4, 8))},
            **{
                f"layers_{i}": {
                    "attention": {"query": {"kernel": np.zeros((16, 12))}},
                    "mlp": {"wi_0": {"kernel": np.zeros((16, 24))}, "wi_1": {"kernel": np.zeros((16, 24))}},
                }
                for i in range(3)
            },
        },
        "decoder": {"layers_0": {}, "layers_1": {}},
    }
    config = t5_config_from_params(params)
    assert config == T5Config(
        vocab_size=48,
        emb_dim=16,
        num_heads=4,
        num_encoder_layers=3,
        num_decoder_layers=2,
        head_dim=3,
        mlp_dim=24,
        mlp_activations=("gelu", "linear"),
        dropout_rate=0.0,
        logits_via_embedding=True,
        num_buckets=8,
        max_distance=128,
    )
    assert t5_config_from_params(params, mlp_activation="silu").mlp_activations == ("silu", "linear")
    with pytest.raises(ValueError, match="not an unscanned T5 encoder-decoder"):
        t5_config_from_params({"decoder": {}})
