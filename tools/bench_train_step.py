"""Benchmark: `train-step` of ENCDEC-S and DEC-S (docs/benchmarks.md) with t5x.models.

Times one training step (forward, backward, optimizer update) under one `jax.jit`, float32 on
CPU (workloads `encdec`, `dec`). The `encdec-bf16` / `dec-bf16` workloads keep parameters,
activations and the optimizer in float32 but round matmul operands to bfloat16 with float32
accumulation (`matmul_dtype="bfloat16"`: a TPU's default matmul precision); their peer runs
under `torch.autocast("cpu", dtype=torch.bfloat16)` and both MFUs use a bfloat16 matmul peak.
Compile time (lower + compile) is reported separately from the steady state: the median
of `--steps` timed steps after `--warmup` untimed ones. Tokens/s counts inputs + targets
(encoder-decoder) or all positions (decoder-only); MFU uses the model's `flops_per_token`
(PaLM convention) against the same-process XLA matmul peak (2048^3 in the row's matmul dtype, median of 5),
timed right before each workload.

Each workload also lists the step's matrix products (from its jaxpr) and times each alone in
XLA and, with a peer, the same products as einsums in torch (product by product, alternating).
Their sum in XLA is what the step's products cost with nothing else around them: roughly
the least a step made of these products can take in XLA, whatever else is fused or removed
(inside the step a product can run a little faster or slower than alone).

The optimizer is optax's `adafactor` (factored second moments, update clipping 1.0,
parameter-scale multiplier; close to T5X's Adafactor defaults) at learning rate 1e-3, since
`t5x.training` is developed separately.

XLA keeps its own defaults (YNNPACK on); the process runs with the glibc malloc settings
`t5x-launch` CPU jobs get (huge pages, freed memory kept; it re-executes itself to set them); the
peer runs without them, as its users run it (`--peer-malloc ours`: with them too). Only the
built-in demo's gin file turns YNNPACK off (float32 steps are as fast either way); the bf16 rows
need it on, and get `--xla_cpu_experimental_ynn_fusion_type=individual_dot` under `t5x-launch`
from `XLA_FLAGS` or a gin file's `XLA_FLAGS` macro.

With `--peer-python` (an interpreter with torch + transformers), the same workloads run in
Hugging Face `transformers` on PyTorch CPU in a separate process: `T5ForConditionalGeneration`
(gated-GELU, untied) for ENCDEC-S and a `LlamaForCausalLM` of the same layer shape for DEC-S,
with `transformers.optimization.Adafactor`. Ours and the peer's steps alternate one by one.
Usage:

    python tools/bench_train_step.py [--workloads encdec,dec,encdec-bf16,dec-bf16] [--steps 5] [--warmup 1]
        [--peer-python peers/hf/bin/python] [--peer-malloc user|ours] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from _peer import Peer, add_peer_malloc_flag
from _train_step import compile_train_step, matmul_peak, time_product, train_step_products

from t5x.launch import restart_with_malloc_defaults
from t5x.models import DecoderOnlyConfig, DecoderOnlyModel, EncoderDecoderModel, T5Config

_ENCDEC = {"name": "ENCDEC-S", "arch": "encdec", "batch": 8, "inputs": 256, "targets": 64}
_DEC = {"name": "DEC-S", "arch": "dec", "batch": 8, "length": 512}
WORKLOADS = {
    "encdec": {**_ENCDEC, "matmul_dtype": None},
    "dec": {**_DEC, "matmul_dtype": None},
    "encdec-bf16": {**_ENCDEC, "matmul_dtype": "bfloat16"},
    "dec-bf16": {**_DEC, "matmul_dtype": "bfloat16"},
}
PRECISION = {None: "float32", "bfloat16": "float32, bf16 matmuls"}
VOCAB, D, HEADS, HEAD_DIM, MLP = 32128, 512, 8, 64, 1024

PEER_SCRIPT = r"""
import json, sys, time, statistics
import torch
from transformers import T5Config, T5ForConditionalGeneration, LlamaConfig, LlamaForCausalLM
from transformers.optimization import Adafactor
VOCAB, D, HEADS, HEAD_DIM, MLP = 32128, 512, 8, 64, 1024
torch.manual_seed(0)
state = {}
def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
def peak(dtype):
    a = torch.randn(2048, 2048, dtype=dtype); b = torch.randn(2048, 2048, dtype=dtype)
    a @ b
    times = []
    for _ in range(5):
        t = time.perf_counter(); a @ b; times.append(time.perf_counter() - t)
    return 2 * 2048 ** 3 / statistics.median(times)
def setup(w):
    if w["arch"] == "encdec":
        cfg = T5Config(vocab_size=VOCAB, d_model=D, d_kv=HEAD_DIM, d_ff=MLP, num_layers=6, num_decoder_layers=6,
                       num_heads=HEADS, feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
                       decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        model = T5ForConditionalGeneration(cfg)
        g = torch.Generator().manual_seed(0)
        batch = {"input_ids": torch.randint(2, VOCAB, (w["batch"], w["inputs"]), generator=g),
                 "labels": torch.randint(2, VOCAB, (w["batch"], w["targets"]), generator=g)}
    else:
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=MLP, num_hidden_layers=12,
                          num_attention_heads=HEADS, num_key_value_heads=HEADS, tie_word_embeddings=False,
                          max_position_embeddings=w["length"], hidden_act="gelu_pytorch_tanh")
        model = LlamaForCausalLM(cfg)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(2, VOCAB, (w["batch"], w["length"]), generator=g)
        batch = {"input_ids": ids, "labels": ids}
    model.train()
    opt = Adafactor(model.parameters(), lr=1e-3, scale_parameter=True, relative_step=False, warmup_init=False)
    state.update(model=model, opt=opt, batch=batch, autocast=w["matmul_dtype"] == "bfloat16")
    return sum(p.numel() for p in model.parameters())
def product_seconds(p):
    dtype = getattr(torch, p["dtype"])
    a, b = torch.randn(p["lhs"], dtype=dtype), torch.randn(p["rhs"], dtype=dtype)
    torch.einsum(p["einsum"], a, b)
    times = []
    for _ in range(3):
        t = time.perf_counter(); torch.einsum(p["einsum"], a, b); times.append(time.perf_counter() - t)
    return statistics.median(times)
def step():
    t = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=state["autocast"]):
        loss = state["model"](**state["batch"]).loss
    loss.backward()
    state["opt"].step(); state["opt"].zero_grad(set_to_none=True)
    return time.perf_counter() - t, float(loss.detach())
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "peak":
        reply({"flops": peak(getattr(torch, cmd["dtype"]))})
    elif cmd["op"] == "setup":
        t = time.perf_counter(); n = setup(cmd["workload"]); s, loss = step()
        reply({"params": n, "first_step_s": time.perf_counter() - t, "loss": loss, "threads": torch.get_num_threads()})
    elif cmd["op"] == "step":
        s, loss = step(); reply({"s": s, "loss": loss})
    elif cmd["op"] == "product":
        reply({"s": product_seconds(cmd["product"])})
    else:
        break
"""


def build(kind: str) -> tuple[object, dict, int]:
    """Returns (model, batch, tokens per step) for a workload."""
    w = WORKLOADS[kind]
    rng = np.random.default_rng(0)
    common = dict(
        vocab_size=VOCAB, emb_dim=D, num_heads=HEADS, head_dim=HEAD_DIM, mlp_dim=MLP,
        mlp_activations=("gelu", "linear"), dropout_rate=0.0, logits_via_embedding=False,
        matmul_dtype=w["matmul_dtype"],
    )  # fmt: skip
    if w["arch"] == "encdec":
        model = EncoderDecoderModel(T5Config(num_encoder_layers=6, num_decoder_layers=6, **common))
        tgt = rng.integers(2, VOCAB, (w["batch"], w["targets"]), dtype=np.int32)
        batch = {
            "encoder_input_tokens": rng.integers(2, VOCAB, (w["batch"], w["inputs"]), dtype=np.int32),
            "decoder_input_tokens": np.concatenate([np.zeros((w["batch"], 1), np.int32), tgt[:, :-1]], 1),
            "decoder_target_tokens": tgt,
            "decoder_loss_weights": np.ones(tgt.shape, np.float32),
        }
        return model, batch, w["batch"] * (w["inputs"] + w["targets"])
    model = DecoderOnlyModel(DecoderOnlyConfig(num_layers=12, **common))
    tgt = rng.integers(2, VOCAB, (w["batch"], w["length"]), dtype=np.int32)
    batch = {
        "decoder_input_tokens": np.concatenate([np.zeros((w["batch"], 1), np.int32), tgt[:, :-1]], 1),
        "decoder_target_tokens": tgt,
        "decoder_loss_weights": np.ones(tgt.shape, np.float32),
    }
    return model, batch, w["batch"] * w["length"]


def matmul_floor(model: object, batch: dict, peer: Peer | None) -> list[dict]:
    """The step's matrix products, each timed alone in XLA (and in torch), one after the other.

    Their sum is what the step's products cost in XLA with nothing else around them, roughly
    the least the step can take while XLA computes these products. The peer times the same
    products (same shapes, same operand layouts, as einsums) in torch.
    """
    products = train_step_products(model, batch)
    for p in products:
        p["xla_s"] = time_product(p)
        if peer is not None:
            p["peer_s"] = peer.ask(
                op="product", product={k: p[k] for k in ("lhs", "rhs", "dtype", "einsum")}
            )["s"]
    return products


def run_workload(kind: str, args: argparse.Namespace, peer: Peer | None) -> dict:
    model, batch, tokens = build(kind)
    lengths = {k: v.shape[1] for k, v in batch.items()}
    peak_dtype = WORKLOADS[kind]["matmul_dtype"] or "float32"
    peer_info = {}
    if peer is not None:
        # First: it also waits for the peer's imports, which would slow our peak's products.
        peer_info["peak_flops"] = peer.ask(op="peak", dtype=peak_dtype)["flops"]
    peak = matmul_peak(2048, jnp.dtype(peak_dtype))
    float32_peak = peak if peak_dtype == "float32" else matmul_peak(2048, jnp.float32)
    compiled, params, opt_state, batch, compile_s = compile_train_step(model, batch)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    if peer is not None:
        peer_info.update(peer.ask(op="setup", workload=WORKLOADS[kind]))
    for _ in range(args.warmup):
        params, opt_state, loss = compiled(params, opt_state, batch)
        loss.block_until_ready()
        if peer is not None:
            peer.ask(op="step")
    ours, theirs, losses = [], [], []
    for _ in range(args.steps):
        if peer is not None:
            peer.settle()  # neither side times a step beside the other's spinning threads
        start = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, batch)
        loss.block_until_ready()
        ours.append(time.perf_counter() - start)
        losses.append(float(loss))
        if peer is not None:
            peer.settle()
            theirs.append(peer.ask(op="step")["s"])
    flops_per_token = model.flops_per_token(lengths)
    step_s = statistics.median(ours)
    products = matmul_floor(model, batch, peer)
    result = {
        "workload": WORKLOADS[kind]["name"],
        "precision": PRECISION[WORKLOADS[kind]["matmul_dtype"]],
        "peak_dtype": peak_dtype,
        "params": n_params,
        "tokens_per_step": tokens,
        "compile_s": compile_s,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "flops_per_token": flops_per_token,
        "xla_matmul_peak_gflops": peak / 1e9,
        "mfu": flops_per_token * tokens / step_s / peak,
        "mfu_float32_peak": flops_per_token * tokens / step_s / float32_peak,
        "losses": losses,
        "products": products,
        "matmul_floor_s": sum(p["count"] * p["xla_s"] for p in products),
        "matmul_tflop": sum(p["count"] * p["flops"] for p in products) / 1e12,
    }
    if theirs:
        peer_step = statistics.median(theirs)
        result["peer"] = {
            "params": peer_info["params"],
            "first_step_s": peer_info["first_step_s"],
            "step_s": peer_step,
            "tokens_per_s": tokens / peer_step,
            "torch_matmul_peak_gflops": peer_info["peak_flops"] / 1e9,
            "mfu_own_peak": flops_per_token * tokens / peer_step / peer_info["peak_flops"],
            "threads": peer_info["threads"],
            "torch_matmul_floor_s": sum(p["count"] * p["peer_s"] for p in products),
            "malloc": peer.malloc,
        }
        result["speedup_vs_peer"] = peer_step / step_s
    return result


def main() -> None:
    restart_with_malloc_defaults()  # glibc malloc settings, as under t5x-launch
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--peer-python", default=None)
    add_peer_malloc_flag(parser)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    kinds = [k.strip() for k in args.workloads.split(",") if k.strip()]
    for k in kinds:
        if k not in WORKLOADS:
            parser.error(f"unknown workload {k!r}; choose from {sorted(WORKLOADS)}")
    peer = Peer(args.peer_python, PEER_SCRIPT, "train_step", args.peer_malloc) if args.peer_python else None
    try:
        results = [run_workload(k, args, peer) for k in kinds]
    finally:
        if peer is not None:
            peer.close()
    load = os.getloadavg()
    print(f"train-step, {platform.processor() or platform.machine()}, jax {jax.__version__}, "
          f"median of {args.steps} steps; load average {tuple(round(x, 2) for x in load)}; "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
          + (f"; peer malloc: {peer.malloc}" if peer is not None else ""))  # fmt: skip
    header = f"{'workload':10} {'precision':22} {'impl':8} {'s/step':>8} {'tokens/s':>10} {'MFU':>6} {'peak GF/s':>10} {'compile s':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['workload']:10} {r['precision']:22} {'ours':8} {r['step_s']:8.3f} {r['tokens_per_s']:10.0f} {r['mfu']:6.1%} "
            f"{r['xla_matmul_peak_gflops']:10.1f} {r['compile_s']:10.1f}"
        )
        if "peer" in r:
            p = r["peer"]
            print(
                f"{'':10} {'':22} {'HF-torch':8} {p['step_s']:8.3f} {p['tokens_per_s']:10.0f} {p['mfu_own_peak']:6.1%} "
                f"{p['torch_matmul_peak_gflops']:10.1f} {p['first_step_s']:10.1f}"
            )
            print(f"{'':33} ours/peer tokens/s = {r['speedup_vs_peer']:.2f}x")
        print(
            f"{'':33} the step's {sum(p['count'] for p in r['products'])} matrix products "
            f"({r['matmul_tflop']:.2f} TFLOP), each alone: XLA {r['matmul_floor_s']:.2f} s"
            + (f", torch {r['peer']['torch_matmul_floor_s']:.2f} s" if "peer" in r else "")
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loadavg": load, "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
