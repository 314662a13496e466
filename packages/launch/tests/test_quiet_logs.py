"""Off a terminal, `t5x-launch train` logs one absl line per log period and none of TF's/CUDA's start-up noise."""

import os
import re
import subprocess
import sys
import textwrap

from t5x.launch._quiet import NOISE, is_noise

# Lines this machine's TensorFlow and JAX print at start-up (seen without the filter).
NOISE_SAMPLES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796235063.190062   21625 port.cc:153] oneDNN custom operations are on. You may see "
    "slightly different numerical results due to floating-point round-off errors.",
    "I0000 00:00:1796235063.191306   21625 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
    "GPU will not be used.",
    "E0000 00:00:1796235081.536569   21625 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)",
    "E0000 00:00:1796235094.282392   22160 util.cc:131] oneDNN supports DT_INT32 only on platforms with "
    "AVX-512. Falling back to the default Eigen-based implementation if present.",
    "E0000 00:00:1716223458.176925  1234 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to "
    "register factory for plugin cuDNN when one has already been registered",
    "An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed. Falling back to cpu.",
]
REAL = [
    "E0000 00:00:1796235094.282392   22160 op_kernel.cc:1857] OP_REQUIRES failed at x.cc:1 : NOT_FOUND: data.txt",
    "Traceback (most recent call last):",
    "ValueError: failed call to cuInit is not at the start of this line",
    "W0000 00:00:1796235094.282392   22160 something.cc:1] a warning of the user's run",
]


def test_noise_patterns_match_the_noise_and_nothing_else():
    assert all(is_noise(line) for line in NOISE_SAMPLES)
    assert not any(is_noise(line) for line in REAL)
    assert len(NOISE) >= len(NOISE_SAMPLES) - 1


def test_the_filter_keeps_errors_and_tracebacks():
    program = textwrap.dedent(
        f"""
        import os, sys
        from t5x.launch._quiet import filter_startup_noise
        assert filter_startup_noise({{}})
        for line in {NOISE_SAMPLES + REAL!r}:
            os.write(2, (line + "\\n").encode())
        sys.stderr.write("no newline at the end")
        sys.stderr.flush()
        raise RuntimeError("a real failure")
        """
    )
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    for line in NOISE_SAMPLES:
        assert line not in run.stderr, run.stderr
    for line in REAL:
        assert line in run.stderr, run.stderr
    assert "no newline at the end" in run.stderr and "RuntimeError: a real failure" in run.stderr


def test_train_without_a_terminal_logs_progress_and_no_startup_noise(tmp_path):
    flags = [
        "--gin_file=runs/demo.gin",
        "--gin.models.T5Config.emb_dim=32",
        "--gin.models.T5Config.mlp_dim=64",
        "--gin.models.T5Config.num_heads=2",
        "--gin.models.T5Config.head_dim=16",
        "--gin.models.T5Config.num_encoder_layers=1",
        "--gin.models.T5Config.num_decoder_layers=1",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
        "--gin.BATCH_SIZE=8",
        "--gin.TRAIN_STEPS=2",
        "--gin.launch.train.log_period=1",
        "--gin.launch.train.infer_eval_dataset_cfg=None",
        f"--gin.MODEL_DIR={tmp_path / 'run'}",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "T5X_SHOW_STARTUP_LOGS")}
    env["JAX_PLATFORMS"] = "cpu"  # a CPU job wherever the test runs
    run = subprocess.run(
        [sys.executable, "-m", "t5x.launch", "train", *flags],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    output = run.stdout + run.stderr
    noisy = [line for line in output.splitlines() if is_noise(line)]
    assert not noisy, noisy
    for fragment in ("cuda drivers", "cuInit", "oneDNN", "absl::InitializeLog", "cuDNN factory"):
        assert fragment not in output, output[-3000:]
    progress = re.findall(
        r"^I\d{4} [\d:.]+ +\d+ _writers\.py:\d+\] (step \d/2 \| loss [\d.]+ \|.*)$", run.stdout, re.M
    )
    assert [line.split(" |")[0] for line in progress] == ["step 1/2", "step 2/2"], run.stdout
    assert all(" tok/s" in line for line in progress), progress
