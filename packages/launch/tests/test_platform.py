"""Where the launcher's CPU defaults apply, and the command line's CPU-kernel overrides."""

import subprocess
import sys

import pytest

from t5x.launch import ConfigurationError, apply_cpu_kernels_override, cpu_kernels_override, job_runs_on_cpu
from t5x.launch._platform import accelerator_devices
from t5x.models import CpuKernels, EncoderDecoderModel, preset


@pytest.mark.parametrize(
    ("environ", "devices", "cpu"),
    [
        ({}, [], True),
        ({}, ["/dev/accel0"], False),  # a TPU VM
        ({}, ["/dev/nvidia0"], False),  # a GPU host
        ({"JAX_PLATFORMS": "cpu"}, ["/dev/nvidia0"], True),  # the user asks for the CPU
        ({"JAX_PLATFORMS": "cuda,cpu"}, [], False),
        ({"JAX_PLATFORMS": " TPU "}, [], False),
        ({"JAX_PLATFORM_NAME": "cpu"}, ["/dev/vfio/0"], True),
        ({"JAX_PLATFORMS": ""}, ["/dev/kfd"], False),  # empty: JAX's own choice
    ],
)
def test_job_runs_on_cpu(environ, devices, cpu):
    assert job_runs_on_cpu(environ, devices) is cpu


def test_accelerator_devices_looks_for_each_kind():
    present = {"/dev/accel*": ["/dev/accel1", "/dev/accel0"], "/dev/nvidia[0-9]*": ["/dev/nvidia0"]}
    assert accelerator_devices(lambda pattern: present.get(pattern, [])) == [
        "/dev/accel0",
        "/dev/accel1",
        "/dev/nvidia0",
    ]


def test_cpu_kernels_overrides_come_from_the_environment():
    configured = CpuKernels(enabled="auto", cache_dir="/models/cache")
    assert cpu_kernels_override({}, configured) is configured
    assert cpu_kernels_override({"T5X_CPU_KERNELS": "0"}, configured) == CpuKernels(False, "/models/cache")
    assert cpu_kernels_override({"T5X_CPU_KERNELS": "On"}, configured).enabled is True
    assert cpu_kernels_override({"T5X_CPU_KERNELS": "auto"}, CpuKernels(False)).enabled == "auto"
    got = cpu_kernels_override({"T5X_CACHE_DIR": "/scratch/k", "CXX": "clang++"}, configured)
    assert got == CpuKernels("auto", "/scratch/k", "clang++")
    with pytest.raises(ConfigurationError, match=r"T5X_CPU_KERNELS='maybe': expected 0, 1 or auto"):
        cpu_kernels_override({"T5X_CPU_KERNELS": "maybe"}, configured)


def test_the_launcher_sets_a_models_option():
    model = EncoderDecoderModel(preset("t5_1_1_tiny", vocab_size=40))
    apply_cpu_kernels_override(model, {"T5X_CPU_KERNELS": "off", "CXX": "g++-13"})
    assert model.cpu_kernels == CpuKernels(enabled=False, compiler="g++-13")
    apply_cpu_kernels_override(object(), {"T5X_CPU_KERNELS": "off"})  # a model without the option


_DEFAULTS_OF = """
import os, sys
from t5x.launch._cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(repr(os.environ.get("XLA_FLAGS")))
"""


@pytest.mark.parametrize(
    ("platforms", "command", "flags"),
    [
        ("cpu", "train", True),
        ("tpu", "train", False),  # never on a TPU or GPU job
        ("cpu", "inspect-task", False),  # no XLA steps
    ],
)
def test_xla_cpu_defaults_only_for_cpu_jobs(platforms, command, flags):
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": platforms}
    out = subprocess.run(
        [sys.executable, "-c", _DEFAULTS_OF, command, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = out.stdout.strip().splitlines()[-1]
    assert ("xla_cpu_small_while_loop_byte_threshold" in got) is flags, got
