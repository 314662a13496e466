"""`t5x-launch local --num_processes=2` trains the same model as one process."""

import concurrent.futures

import numpy as np

TINY_JOB = [
    "train",
    "--gin_file=models/demo/tiny.gin",
    "--gin_file=runs/pretrain.gin",
    "--gin.models.T5Config.emb_dim=32",
    "--gin.models.T5Config.mlp_dim=64",
    "--gin.models.T5Config.num_encoder_layers=1",
    "--gin.models.T5Config.num_decoder_layers=1",
    "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 24}",
    "--gin.BATCH_SIZE=8",
    "--gin.TRAIN_STEPS=3",
    "--gin.CHECKPOINT_PERIOD=3",
    # Unshuffled, unpacked data: two hosts' halves of each batch are the same
    # examples as the one host's batch, so the summed loss and gradients agree.
    "--gin.SHUFFLE_TRAIN_EXAMPLES=False",
    "--gin.PACK=False",
]


def test_two_local_processes_match_one_process(launch, tmp_path):
    from t5x.checkpointing import load_t5x_checkpoint

    one, two = tmp_path / "one", tmp_path / "two"
    # The two runs share nothing: they go side by side (each is mostly start-up).
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        single_run = pool.submit(launch, *TINY_JOB, f"--gin.MODEL_DIR={one}", cwd=tmp_path)
        local_run = pool.submit(
            launch,
            "local",
            "--num_processes=2",
            f"--log_dir={tmp_path / 'logs'}",
            "--",
            *TINY_JOB,
            f"--gin.MODEL_DIR={two}",
            cwd=tmp_path,
        )
        single_run.result()
        local_run.result()
    single = load_t5x_checkpoint(str(one / "checkpoint_3"))
    double = load_t5x_checkpoint(str(two / "checkpoint_3"))
    assert int(single["state"]["step"]) == int(double["state"]["step"]) == 3
    flat_one = _flatten(single["target"])
    flat_two = _flatten(double["target"])
    assert flat_one.keys() == flat_two.keys()
    for name in flat_one:
        np.testing.assert_allclose(flat_two[name], flat_one[name], rtol=2e-5, atol=2e-6, err_msg=name)


def _flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = np.asarray(value, np.float32)
    return out
