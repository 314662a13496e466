"""The MoE gin files shipped with t5x-launch build the MoE model and the expert-parallel partitioner."""

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
