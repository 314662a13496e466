"""The MoE gin files shipped with t5x-launch build the MoE model and the expert-parallel partitioner."""

import re

import gin
import jax
import numpy as np
import pytest

from t5x.models import EncoderDecoderModel
from t5x.moe import MoeEncoderDecoderModel, dense_twin, moe_preset

launch = pytest.importorskip("t5x.launch")


@pytest.mark.parametrize("size", ["tiny", "small", "base"])
def test_switch_files_with_the_upcycle_run(size, devices):
    from t5x.launch._gin_config import macro_value

    scan = size == "small"  # one size also scans its stacks

    launch.parse_gin(
        launch.GinArgs(
            files=(f"models/moe/switch/{size}.gin", "models/moe/runs/sparse_upcycle.gin"),
            bindings=(
                "VOCABULARY = None",
                "SENTENCEPIECE_MODEL = 'unused.model'",
                "MODEL_DIR = '/tmp/moe'",
                "MIXTURE_OR_TASK_NAME = 'synthetic_copy'",
                "DENSE_CHECKPOINT_PATH = '/tmp/dense'",
                "NUM_EXPERT_PARTITIONS = 2",
                f"SCAN_LAYERS = {scan}",
            ),
        )
    )
    model = macro_value("MODEL")
    assert isinstance(model, MoeEncoderDecoderModel)
    assert model.config == moe_preset(f"switch_{size}", scan_layers=scan)
    assert model.upcycle_from == "/tmp/dense"
    assert model.aux_loss_factor == 0.01
    assert model.loss_normalizing_factor == "NUM_REAL_TARGET_TOKENS"  # as upstream's MoE model gins
    partitioner = gin.query_parameter("t5x.launch.train.partitioner").scoped_configurable_fn()
    assert dict(partitioner.mesh.shape) == {"expert": 2, "data": len(devices) // 2, "model": 1}


@pytest.mark.parametrize("run", ["pretrain", "sparse_upcycle"])
def test_the_switch_runs_train_with_adafactor_factoring_each_expert(run, tmp_path):
    # The runs' Adafactor gets the MoE factor rules: without them, the rank-3 expert
    # kernels stop it before the first step.
    from t5x.launch.cli import main

    bytes_gin = tmp_path / "bytes.gin"
    bytes_gin.write_text(
        "from __gin__ import dynamic_registration\nfrom t5x import tasks\n"
        "VOCABULARY = @tasks.builtin_vocabulary()\nSENTENCEPIECE_MODEL = None\n"
    )
    flags = []
    if run == "sparse_upcycle":  # a dense checkpoint of the tiny preset's dense twin
        from t5x.checkpointing import save_t5x_checkpoint

        dense = EncoderDecoderModel(dense_twin(moe_preset("switch_tiny")))
        shapes = {
            k: (8, 16) for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")
        }
        params = dense.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
        save_t5x_checkpoint(tmp_path / "dense", 100, {"target": params, "state": {"step": np.int32(100)}})
        flags.append(f"--gin.DENSE_CHECKPOINT_PATH={tmp_path / 'dense'}")
    model_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "--gin_file=models/moe/switch/tiny.gin",
            f"--gin_file=models/moe/runs/{run}.gin",
            f"--gin_file={bytes_gin}",
            f"--gin.MODEL_DIR={model_dir}",
            "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
            "--gin.TRAIN_STEPS=2",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
            "--gin.BATCH_SIZE=8",
            *flags,
        ]
    )
    assert code == 0
    assert (model_dir / "checkpoint_2").is_dir()
    if run == "sparse_upcycle":  # two steps later, every expert is still close to the dense MLP
        from t5x.checkpointing import load_t5x_checkpoint

        trained = load_t5x_checkpoint(model_dir / "checkpoint_2")["target"]
        trained_wo = np.asarray(trained["encoder"]["layers_1"]["mlp"]["expert"]["wo"]["kernel"])
        dense_wo = np.asarray(params["encoder"]["layers_1"]["mlp"]["wo"]["kernel"]).ravel()
        assert all(np.corrcoef(expert.ravel(), dense_wo)[0, 1] > 0.9 for expert in trained_wo)
    info = (model_dir / "model-info.txt").read_text()
    kernel = "encoder/layers_1/mlp/expert/wi/kernel"
    experts, embed, mlp = map(
        int, re.search(rf"Variable {kernel} .*shape \(expert=(\d+), embed=(\d+), mlp=(\d+)\)", info).groups()
    )
    slots = dict(re.findall(rf"Variable param_states/{kernel}/(v_row|v_col) .*shape \(([\d, ]+)\)", info))
    # Second moments of each expert's [embed, mlp] matrix: a row and a column vector per expert.
    assert slots == {"v_row": f"{experts}, {embed}", "v_col": f"{experts}, {mlp}"}
