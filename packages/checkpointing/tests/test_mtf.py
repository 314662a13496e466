"""Reading Mesh TensorFlow / TF T5 checkpoints through TensorFlow's own reader."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from t5x.checkpointing import mtf_checkpoint_prefix, read_mtf_checkpoint


def _save(folder, variables, step):
    with tf.Graph().as_default():
        tf_vars = [tf.compat.v1.Variable(value, name=name) for name, value in variables.items()]
        saver = tf.compat.v1.train.Saver(tf_vars)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(folder / "model.ckpt"), global_step=step)


def test_reads_every_variable_by_its_tensorflow_name(tmp_path):
    rng = np.random.default_rng(0)
    variables = {
        "shared/embedding": rng.normal(size=(6, 4)).astype(np.float32),
        "encoder/block_000/layer_000/SelfAttention/q_slot_vr": rng.normal(size=(4,)).astype(np.float32),
        "decoder/logits/kernel": rng.normal(size=(4, 6)).astype(tf.bfloat16.as_numpy_dtype),
        "global_step": np.int64(9),
    }
    _save(tmp_path, variables, step=9)
    _save(tmp_path, {"shared/embedding": np.zeros((2, 2), np.float32)}, step=3)
    loaded = read_mtf_checkpoint(tmp_path)  # the folder: its highest step
    assert sorted(loaded) == sorted(variables)
    for name, value in variables.items():
        np.testing.assert_array_equal(loaded[name], np.asarray(value, loaded[name].dtype), err_msg=name)
    assert loaded["decoder/logits/kernel"].dtype == np.float32  # bfloat16 widened
    assert int(loaded["global_step"]) == 9
    older = read_mtf_checkpoint(tmp_path / "model.ckpt-3")
    assert older["shared/embedding"].shape == (2, 2)
    assert mtf_checkpoint_prefix(tmp_path) == str(tmp_path / "model.ckpt-9")


def test_missing_checkpoints_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no model.ckpt-<step>.index"):
        read_mtf_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="no Mesh TensorFlow checkpoint"):
        read_mtf_checkpoint(tmp_path / "model.ckpt-5")
