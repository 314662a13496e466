"""`t5x-launch convert --from=mtf:...`: a Mesh TensorFlow T5 checkpoint written here with TensorFlow."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import tensorflow as tf

from t5x.checkpointing import load_t5x_checkpoint
from t5x.launch._cli import main
from t5x.launch._convert_gin import read_model_gin
from t5x.models import EncoderDecoderModel

D, HEADS, KV, FF, VOCAB, BUCKETS = 16, 4, 4, 24, 40, 8


def _mtf_variables(per_layer_relpos: bool, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """T5.1.1-style variables as Mesh TensorFlow names them (2 encoder, 2 decoder blocks)."""
    out: dict[str, np.ndarray] = {"shared/embedding": rng.normal(size=(VOCAB, D))}
    for stack, attentions in (
        ("encoder", ["SelfAttention"]),
        ("decoder", ["SelfAttention", "EncDecAttention"]),
    ):
        for block in range(2):
            prefix = f"{stack}/block_{block:03d}"
            for sub, attention in enumerate(attentions):
                layer = f"{prefix}/layer_{sub:03d}"
                out[f"{layer}/layer_norm/scale"] = rng.uniform(0.5, 1.5, size=(D,))
                for name in "qkv":
                    out[f"{layer}/{attention}/{name}"] = rng.normal(size=(D, HEADS * KV))
                out[f"{layer}/{attention}/o"] = rng.normal(size=(HEADS * KV, D))
                if attention == "SelfAttention" and (block == 0 or per_layer_relpos):
                    out[f"{layer}/{attention}/relative_attention_bias"] = rng.normal(size=(HEADS, BUCKETS))
            mlp = f"{prefix}/layer_{len(attentions):03d}"
            out[f"{mlp}/layer_norm/scale"] = rng.uniform(0.5, 1.5, size=(D,))
            out[f"{mlp}/DenseReluDense/wi_0/kernel"] = rng.normal(size=(D, FF))
            out[f"{mlp}/DenseReluDense/wi_1/kernel"] = rng.normal(size=(D, FF))
            out[f"{mlp}/DenseReluDense/wo/kernel"] = rng.normal(size=(FF, D))
        out[f"{stack}/final_layer_norm/scale"] = rng.uniform(0.5, 1.5, size=(D,))
    out["decoder/logits/kernel"] = rng.normal(size=(D, VOCAB))
    variables = {k: v.astype(np.float32) for k, v in out.items()}
    # Adafactor's slots: factored (row/column) for matrices, full for vectors.
    for name, value in list(variables.items()):
        if value.ndim == 2:
            variables[f"{name}_slot_vr"] = rng.uniform(size=value.shape[:1]).astype(np.float32)
            variables[f"{name}_slot_vc"] = rng.uniform(size=value.shape[1:]).astype(np.float32)
        else:
            variables[f"{name}_slot_v"] = rng.uniform(size=value.shape).astype(np.float32)
    return variables


def _write_mtf_checkpoint(folder, variables: dict[str, np.ndarray], step: int) -> None:
    """Saves ``variables`` under their exact names with a TF1 Saver, as Mesh TensorFlow does."""
    with tf.Graph().as_default():
        tf_vars = [tf.compat.v1.Variable(value, name=name) for name, value in variables.items()]
        global_step = tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver([*tf_vars, global_step])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(global_step.assign(step))
            saver.save(session, str(folder / "model.ckpt"), global_step=step)


@pytest.fixture(scope="module")
def mtf_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtf")
    variables = _mtf_variables(per_layer_relpos=False, rng=np.random.default_rng(0))
    _write_mtf_checkpoint(folder, variables, step=1000)
    return folder, variables


def test_mtf_import_names_shapes_values_and_adafactor_slots(mtf_checkpoint, tmp_path, capsys, spm_path):
    folder, variables = mtf_checkpoint
    code = main(
        [
            "convert",
            f"--from=mtf:{folder}",
            f"--to=t5x:{tmp_path / 'out'}",
            f"--vocabulary={spm_path}",
            "--verify",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "config inferred from parameter shapes" in out
    assert "largest absolute logit difference 0:" in out
    state = load_t5x_checkpoint(tmp_path / "out")
    assert int(state["state"]["step"]) == 1000
    target, slots = state["target"], state["state"]["param_states"]

    def check(mtf_name, path, slot_names=None):
        node = target
        for key in path:
            node = node[key]
        np.testing.assert_array_equal(node, variables[mtf_name], err_msg=mtf_name)
        slot_node = slots
        for key in path:
            slot_node = slot_node[key]
        if variables[mtf_name].ndim == 2:
            np.testing.assert_array_equal(slot_node["v_row"], variables[mtf_name + "_slot_vr"])
            np.testing.assert_array_equal(slot_node["v_col"], variables[mtf_name + "_slot_vc"])
            assert slot_node["v"].shape == (1,)
        else:
            np.testing.assert_array_equal(slot_node["v"], variables[mtf_name + "_slot_v"])
            assert slot_node["v_row"].shape == slot_node["v_col"].shape == (1,)
        # Flax's Adafactor keeps a momentum slot that TF's did not: a (1,) placeholder.
        assert slot_node["m"].shape == (1,)

    check("shared/embedding", ("token_embedder", "embedding"))
    check(
        "encoder/block_000/layer_000/SelfAttention/q", ("encoder", "layers_0", "attention", "query", "kernel")
    )
    check(
        "encoder/block_001/layer_000/SelfAttention/o", ("encoder", "layers_1", "attention", "out", "kernel")
    )
    check(
        "encoder/block_001/layer_000/layer_norm/scale",
        ("encoder", "layers_1", "pre_attention_layer_norm", "scale"),
    )
    check(
        "encoder/block_000/layer_001/DenseReluDense/wi_1/kernel",
        ("encoder", "layers_0", "mlp", "wi_1", "kernel"),
    )
    check("decoder/block_001/layer_001/EncDecAttention/k",
          ("decoder", "layers_1", "encoder_decoder_attention", "key", "kernel"))  # fmt: skip
    check(
        "decoder/block_000/layer_000/SelfAttention/v",
        ("decoder", "layers_0", "self_attention", "value", "kernel"),
    )
    check(
        "decoder/block_001/layer_001/layer_norm/scale",
        ("decoder", "layers_1", "pre_cross_attention_layer_norm", "scale"),
    )
    check(
        "decoder/block_001/layer_002/layer_norm/scale", ("decoder", "layers_1", "pre_mlp_layer_norm", "scale")
    )
    check(
        "decoder/block_001/layer_002/DenseReluDense/wo/kernel", ("decoder", "layers_1", "mlp", "wo", "kernel")
    )
    # One relative-position table per stack when only block 0 has one.
    check(
        "encoder/block_000/layer_000/SelfAttention/relative_attention_bias",
        ("encoder", "relpos_bias", "rel_embedding"),
    )
    check(
        "decoder/block_000/layer_000/SelfAttention/relative_attention_bias",
        ("decoder", "relpos_bias", "rel_embedding"),
    )
    check("encoder/final_layer_norm/scale", ("encoder", "encoder_norm", "scale"))
    check("decoder/final_layer_norm/scale", ("decoder", "decoder_norm", "scale"))
    check("decoder/logits/kernel", ("decoder", "logits_dense", "kernel"))

    # Every parameter has its slots, and the tree is exactly the network's.
    config, vocab = read_model_gin([str(tmp_path / "out" / "model.gin")])
    assert (config.num_encoder_layers, config.num_decoder_layers, config.head_dim, config.mlp_dim) == (
        2,
        2,
        KV,
        FF,
    )
    assert config.mlp_activations == ("gelu", "linear") and not config.logits_via_embedding
    assert vocab.kind == "sentencepiece" and vocab.extra_ids == 100
    shapes = {"encoder_input_tokens": (1, 4), "decoder_input_tokens": (1, 4), "decoder_target_tokens": (1, 4)}
    init = jax.eval_shape(
        lambda: EncoderDecoderModel(config).get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    )
    expected = {jax.tree_util.keystr(p): v.shape for p, v in jax.tree_util.tree_leaves_with_path(init)}
    found = {jax.tree_util.keystr(p): v.shape for p, v in jax.tree_util.tree_leaves_with_path(target)}
    assert found == expected
    slot_paths = {jax.tree_util.keystr(p[:-1]) for p, _ in jax.tree_util.tree_leaves_with_path(slots)}
    assert slot_paths == set(expected)


def test_per_layer_relative_bias_and_prefix_paths(tmp_path, capsys, spm_path):
    variables = _mtf_variables(per_layer_relpos=True, rng=np.random.default_rng(1))
    _write_mtf_checkpoint(tmp_path, variables, step=5)
    code = main(
        [
            "convert",
            f"--from=mtf:{tmp_path / 'model.ckpt-5'}",
            f"--to=t5x:{tmp_path / 'out'}",
            "--layout=scanned",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "optimizer slots dropped" in out
    state = load_t5x_checkpoint(tmp_path / "out")
    relpos = state["target"]["decoder"]["layers"]["relpos_bias"]["rel_embedding"]
    assert relpos.shape == (HEADS, 2, BUCKETS)
    np.testing.assert_array_equal(
        relpos[:, 1], variables["decoder/block_001/layer_000/SelfAttention/relative_attention_bias"]
    )
    model_gin = str(tmp_path / "out" / "model.gin")
    with pytest.raises(ValueError, match="SENTENCEPIECE_MODEL"):
        read_model_gin([model_gin])  # no vocabulary was given: the gin file says what to set
    config, vocab = read_model_gin([model_gin], [f"SENTENCEPIECE_MODEL = '{spm_path}'"])
    assert config.per_layer_relpos_bias and config.scan_layers
    assert vocab.path == spm_path


def test_unknown_mtf_variables_are_listed(tmp_path, capsys):
    variables = _mtf_variables(per_layer_relpos=False, rng=np.random.default_rng(2))
    variables["encoder/block_000/layer_000/SelfAttention/q_norm"] = np.ones((4,), np.float32)
    _write_mtf_checkpoint(tmp_path, variables, step=1)
    code = main(["convert", f"--from=mtf:{tmp_path}", f"--to=t5x:{tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "no T5X name" in err and "encoder/block_000/layer_000/SelfAttention/q_norm" in err
