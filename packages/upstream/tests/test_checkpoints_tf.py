"""t5x.checkpoints: Mesh TensorFlow T5 checkpoints restored into (and converted for) an upstream train state."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import tensorflow as tf

from t5x import checkpoints, partitioning, test_utils, utils

D, HEADS, HEAD_DIM, FF, VOCAB, BUCKETS = 16, 4, 4, 24, 40, 32
_SIZES = dict(vocab_size=VOCAB, emb_dim=D, num_heads=HEADS, head_dim=HEAD_DIM, mlp_dim=FF)


def _mtf_variables(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A T5.1.1 model's variables under Mesh TensorFlow's names, with Adafactor slots."""
    out = {"shared/embedding": rng.normal(size=(VOCAB, D))}
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
                    out[f"{layer}/{attention}/{name}"] = rng.normal(size=(D, HEADS * HEAD_DIM))
                out[f"{layer}/{attention}/o"] = rng.normal(size=(HEADS * HEAD_DIM, D))
                if attention == "SelfAttention" and block == 0:
                    out[f"{layer}/{attention}/relative_attention_bias"] = rng.normal(size=(HEADS, BUCKETS))
            mlp = f"{prefix}/layer_{len(attentions):03d}"
            out[f"{mlp}/layer_norm/scale"] = rng.uniform(0.5, 1.5, size=(D,))
            out[f"{mlp}/DenseReluDense/wi_0/kernel"] = rng.normal(size=(D, FF))
            out[f"{mlp}/DenseReluDense/wi_1/kernel"] = rng.normal(size=(D, FF))
            out[f"{mlp}/DenseReluDense/wo/kernel"] = rng.normal(size=(FF, D))
        out[f"{stack}/final_layer_norm/scale"] = rng.uniform(0.5, 1.5, size=(D,))
    out["decoder/logits/kernel"] = rng.normal(size=(D, VOCAB))
    variables = {k: v.astype(np.float32) for k, v in out.items()}
    for name, value in list(variables.items()):
        if value.ndim == 2 and min(value.shape) >= 128:  # Adafactor factors only large matrices
            variables[f"{name}_slot_vr"] = rng.uniform(size=value.shape[:1]).astype(np.float32)
            variables[f"{name}_slot_vc"] = rng.uniform(size=value.shape[1:]).astype(np.float32)
        else:
            variables[f"{name}_slot_v"] = rng.uniform(size=value.shape).astype(np.float32)
    return variables


@pytest.fixture(scope="module")
def mtf_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtf")
    variables = _mtf_variables(np.random.default_rng(0))
    with tf.Graph().as_default():
        tf_vars = [tf.compat.v1.Variable(value, name=name) for name, value in variables.items()]
        step = tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver([*tf_vars, step])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(step.assign(300))
            saver.save(session, str(folder / "model.ckpt"), global_step=300)
    return folder, variables


def _checkpointer(model_dir, **sizes):
    model = test_utils.get_t5_test_model(**{**_SIZES, **sizes})
    shapes = {"encoder_input_tokens": (2, 8), "decoder_input_tokens": (2, 8)}
    initializer = utils.TrainStateInitializer(
        model.optimizer_def,
        model.get_initial_variables,
        shapes,
        partitioning.PjitPartitioner(num_partitions=1),
    )
    state = initializer.from_scratch(jax.random.PRNGKey(0))
    return checkpoints.Checkpointer(state, None, str(model_dir)), initializer


def test_restore_from_tf_checkpoint_renames_parameters_and_slots(mtf_folder, tmp_path):
    folder, variables = mtf_folder
    checkpointer, _ = _checkpointer(tmp_path)
    state = checkpointer.restore_from_tf_checkpoint(str(folder))
    assert int(state.step) == 300
    params = state.params
    np.testing.assert_allclose(
        params["token_embedder"]["embedding"], variables["shared/embedding"], rtol=1e-2
    )
    wo = variables["encoder/block_001/layer_001/DenseReluDense/wo/kernel"]
    np.testing.assert_allclose(params["encoder"]["layers_1"]["mlp"]["wo"]["kernel"], wo, rtol=1e-2)
    v = state.param_states["encoder"]["layers_1"]["mlp"]["wo"]["kernel"].v
    np.testing.assert_allclose(v, variables["encoder/block_001/layer_001/DenseReluDense/wo/kernel_slot_v"])


def test_convert_then_restore_as_t5x(mtf_folder, tmp_path):
    folder, variables = mtf_folder
    checkpointer, initializer = _checkpointer(tmp_path)
    checkpointer.convert_from_tf_checkpoint(str(folder))
    assert checkpoints.all_steps(str(tmp_path)) == [300]
    (restored,) = initializer.from_checkpoints(
        [utils.RestoreCheckpointConfig(path=str(tmp_path / "checkpoint_300"), mode="specific")]
    )
    assert isinstance(restored.params["decoder"]["logits_dense"]["kernel"], jax.Array)
    np.testing.assert_allclose(
        np.asarray(restored.params["decoder"]["logits_dense"]["kernel"], np.float32),
        variables["decoder/logits/kernel"],
        rtol=1e-2,
    )


def test_a_tf_checkpoint_is_not_restored_as_t5x_and_shapes_are_checked(mtf_folder, tmp_path):
    folder, _ = mtf_folder
    checkpointer, _ = _checkpointer(tmp_path)
    with pytest.raises(ValueError, match="Use `restore_from_tf_checkpoint` instead"):
        checkpointer.restore(path=str(folder))
    wrong, _ = _checkpointer(tmp_path, mlp_dim=32)
    with pytest.raises(
        ValueError, match=r"Variable target/.*/wi_0/kernel has shape \(16, 24\) != \(16, 32\)"
    ):
        wrong.restore_from_tf_checkpoint(str(folder))
