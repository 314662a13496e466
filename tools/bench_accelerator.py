"""Benchmark: `train-step` of ENCDEC-LARGE and DEC-1B (docs/benchmarks.md) on an accelerator, with MFU.

One training step (forward, backward, optax Adafactor update) under one `jax.jit`, bfloat16
activations and float32 parameters, scanned layers with `minimal` rematerialisation. Compile
time is reported apart from the steady state (median of ``--steps`` timed steps after one
warm-up). MFU = the model's `flops_per_token` (PaLM convention) x tokens/s / the chip's dense
bfloat16 peak, looked up by device kind (override with ``--peak-tflops``); the same-process
bf16 matmul peak (8192^3) is printed beside it. ``--scale tiny`` shrinks every size so the
program can be checked on a CPU. Usage:

    python tools/bench_accelerator.py [--workloads encdec,dec] [--steps 10] [--scale full|tiny]
        [--peak-tflops N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from _train_step import compile_train_step, matmul_peak

from t5x.launch import restart_with_malloc_defaults
from t5x.models import DecoderOnlyConfig, DecoderOnlyModel, EncoderDecoderModel, T5Config

# Dense bfloat16 peak FLOP/s by device-kind substring (vendor data sheets, no sparsity).
PEAKS = {
    "H200": 989.4e12,
    "H100": 989.4e12,
    "A100": 312e12,
    "L4": 121e12,
    "TPU v5 lite": 197e12,
    "TPU v4": 275e12,
}

WORKLOADS = {
    "encdec": dict(name="ENCDEC-LARGE", emb=1024, heads=16, head_dim=64, mlp=2816, layers=24, batch=64, inputs=512,
                   targets=128),
    "dec": dict(name="DEC-1B", emb=2048, heads=16, head_dim=128, mlp=5632, layers=16, batch=16, length=2048),
}  # fmt: skip
TINY = dict(emb=64, heads=2, head_dim=32, mlp=128, layers=2, batch=2, inputs=32, targets=16, length=32)
VOCAB = 32128


def build(kind: str, scale: str) -> tuple[object, dict, int, str]:
    """Returns (model, batch, tokens per step, name) of a workload."""
    w = dict(WORKLOADS[kind])
    if scale == "tiny":
        w.update({k: v for k, v in TINY.items() if k in w})
    rng = np.random.default_rng(0)
    common = dict(
        vocab_size=VOCAB, emb_dim=w["emb"], num_heads=w["heads"], head_dim=w["head_dim"], mlp_dim=w["mlp"],
        mlp_activations=("gelu", "linear"), dropout_rate=0.0, logits_via_embedding=False, dtype="bfloat16",
        scan_layers=True, remat_policy="minimal",
    )  # fmt: skip
    b = w["batch"]
    if kind == "encdec":
        model = EncoderDecoderModel(
            T5Config(num_encoder_layers=w["layers"], num_decoder_layers=w["layers"], **common)
        )
        tgt = rng.integers(2, VOCAB, (b, w["targets"]), dtype=np.int32)
        batch = {"encoder_input_tokens": rng.integers(2, VOCAB, (b, w["inputs"]), dtype=np.int32)}
        tokens = b * (w["inputs"] + w["targets"])
    else:
        model = DecoderOnlyModel(DecoderOnlyConfig(num_layers=w["layers"], **common))
        tgt = rng.integers(2, VOCAB, (b, w["length"]), dtype=np.int32)
        batch, tokens = {}, b * w["length"]
    batch.update(
        decoder_input_tokens=np.concatenate([np.zeros((b, 1), np.int32), tgt[:, :-1]], 1),
        decoder_target_tokens=tgt,
        decoder_loss_weights=np.ones(tgt.shape, np.float32),
    )
    return model, batch, tokens, w["name"] + (" (tiny)" if scale == "tiny" else "")


def run(kind: str, args: argparse.Namespace, peak: float) -> dict:
    model, batch, tokens, name = build(kind, args.scale)
    lengths = {k: v.shape[1] for k, v in batch.items()}
    compiled, params, opt_state, batch, compile_s = compile_train_step(model, batch)
    params, opt_state, loss = compiled(params, opt_state, batch)  # warm-up
    loss.block_until_ready()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, batch)
        loss.block_until_ready()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    flops = model.flops_per_token(lengths) * tokens
    return {
        "workload": name,
        "params": sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)),
        "tokens_per_step": tokens,
        "compile_s": compile_s,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "model_tflops_per_s": flops / step_s / 1e12,
        "mfu": flops / step_s / peak,
        "loss": float(loss),
    }


def main() -> None:
    restart_with_malloc_defaults()  # glibc malloc settings, as under t5x-launch
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="encdec,dec")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--scale", choices=("full", "tiny"), default="full")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the chip's dense bf16 peak")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    kinds = [k.strip() for k in args.workloads.split(",") if k.strip()]
    for k in kinds:
        if k not in WORKLOADS:
            parser.error(f"unknown workload {k!r}; choose from {sorted(WORKLOADS)}")
    device = jax.devices()[0]
    measured = matmul_peak(8192 if args.scale == "full" else 512, jnp.bfloat16)
    if args.peak_tflops:
        peak, peak_source = args.peak_tflops * 1e12, "--peak-tflops"
    else:
        match = [v for k, v in PEAKS.items() if k.lower() in device.device_kind.lower()]
        peak, peak_source = (match[0], "data sheet") if match else (measured, "measured bf16 matmul")
    results = [run(k, args, peak) for k in kinds]
    print(f"train-step, bfloat16, {device.platform} ({device.device_kind}), jax {jax.__version__}, median of "
          f"{args.steps}; peak {peak / 1e12:.3g} TFLOP/s ({peak_source}), bf16 matmul here "
          f"{measured / 1e12:.3g} TFLOP/s; load average {os.getloadavg()}")  # fmt: skip
    print(f"{'workload':20} {'s/step':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'compile s':>10}")
    for r in results:
        print(f"{r['workload']:20} {r['step_s']:8.3f} {r['tokens_per_s']:10.0f} {r['model_tflops_per_s']:8.1f} "
              f"{r['mfu']:6.1%} {r['compile_s']:10.1f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device_kind": device.device_kind, "peak_flops": peak, "peak_source": peak_source,
                       "matmul_bf16_flops": measured, "results": results}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
