"""The MoE gin files shipped with t5x-launch build the MoE model and the expert-parallel partitioner."""

import re

import gin
import pytest

from t5x.moe import MoeEncoderDecoderModel, moe_preset

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
    partitioner = gin.query_parameter("t5x.launch.train.partitioner").scoped_configurable_fn()
    assert dict(partitioner.mesh.shape) == {"expert": 2, "data": len(devices) // 2, "model": 1}


def test_the_switch_pretrain_run_trains_with_adafactor_factoring_each_expert(tmp_path):
    # The run's Adafactor gets the MoE factor rules: without them, the rank-3 expert
    # kernels stop it before the first step.
    from t5x.launch.cli import main

    bytes_gin = tmp_path / "bytes.gin"
    bytes_gin.write_text(
        "from __gin__ import dynamic_registration\nfrom t5x import tasks\n"
        "VOCABULARY = @tasks.builtin_vocabulary()\nSENTENCEPIECE_MODEL = None\n"
    )
    model_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "--gin_file=models/moe/switch/tiny.gin",
            "--gin_file=models/moe/runs/pretrain.gin",
            f"--gin_file={bytes_gin}",
            f"--gin.MODEL_DIR={model_dir}",
            "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
            "--gin.TRAIN_STEPS=2",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
            "--gin.BATCH_SIZE=8",
        ]
    )
    assert code == 0
    assert (model_dir / "checkpoint_2").is_dir()
    info = (model_dir / "model-info.txt").read_text()
    kernel = "encoder/layers_1/mlp/expert/wi/kernel"
    experts, embed, mlp = map(
        int, re.search(rf"Variable {kernel} .*shape \(expert=(\d+), embed=(\d+), mlp=(\d+)\)", info).groups()
    )
    shapes = dict(re.findall(rf"Variable param_states/{kernel}/(v_row|v_col) .*shape \(([\d, ]+)\)", info))
    # Second moments of each expert's [embed, mlp] matrix: a row and a column vector per expert.
    assert shapes == {"v_row": f"{experts}, {embed}", "v_col": f"{experts}, {mlp}"}
