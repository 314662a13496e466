"""Benchmark: an MoE train step next to its dense twin, and an MoE-vs-dense training run.

`train-step` (the default): ENCDEC-S of docs/benchmarks.md (6 + 6 layers, width 512, gated
GELU, 8 x (256 + 64) tokens) and its Switch-style MoE twin (8 experts in every other layer,
top-1, capacity factor 1.25), each one jitted step (forward, backward, optax Adafactor),
float32 on the CPU. Tokens/s counts inputs + targets; MFU counts only the active
parameters (one expert per token and the routers: `MoeEncoderDecoderModel.flops_per_token`)
against the same-process float32 matmul peak, like tools/bench_train_step.py.

`--quality STEPS`: trains a tiny MoE (`--experts` experts every other layer, top-1, train
capacity factor `--capacity`) and its dense twin (same widths: the MoE has more MLP
parameters at about the same FLOPs per token) for STEPS Adam steps on the built-in synthetic
problems of `synthetic_text_to_text` (byte vocabulary; `--task all` mixes the four, or name
one), same batches and seed, and reports both cross-entropies per target token at the end
(mean of the last 10 steps).

Usage:
    python tools/bench_moe.py [--steps 5] [--warmup 1] [--quick] [--json OUT]
    python tools/bench_moe.py --quality 400 [--task all] [--experts 8] [--capacity 2.0] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

# JAX and the models load inside the functions that run here, so that tools/bench.py can
# import `moe_train_step_rows` cheaply.

VOCAB, D, HEADS, HEAD_DIM, MLP = 32128, 512, 8, 64, 1024
ENCDEC_S = {"batch": 8, "inputs": 256, "targets": 64}


def _batch(rng: np.random.Generator, batch: int, inputs: int, targets: int, vocab: int) -> dict:
    tgt = rng.integers(2, vocab, (batch, targets), dtype=np.int32)
    return {
        "encoder_input_tokens": rng.integers(2, vocab, (batch, inputs), dtype=np.int32),
        "decoder_input_tokens": np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], 1),
        "decoder_target_tokens": tgt,
        "decoder_loss_weights": np.ones(tgt.shape, np.float32),
    }


def moe_config(quick: bool):
    """ENCDEC-S's sizes (2 + 2 layers with ``quick``) with 8 experts in every other layer, top-1."""
    from t5x.moe import MoeT5Config

    layers = 2 if quick else 6
    return MoeT5Config(
        vocab_size=VOCAB, emb_dim=D, num_heads=HEADS, head_dim=HEAD_DIM, mlp_dim=MLP,
        mlp_activations=("gelu", "linear"), dropout_rate=0.0, num_encoder_layers=layers,
        num_decoder_layers=layers, num_experts=8, num_selected_experts=1, train_capacity_factor=1.25,
    )  # fmt: skip


def train_step(quick: bool, steps: int, warmup: int) -> list[dict]:
    import jax
    from _train_step import compile_train_step, matmul_peak

    from t5x.models import EncoderDecoderModel
    from t5x.moe import MoeEncoderDecoderModel, dense_twin

    cfg = moe_config(quick)
    shape = dict(ENCDEC_S, batch=4) if quick else ENCDEC_S
    batch = _batch(np.random.default_rng(0), shape["batch"], shape["inputs"], shape["targets"], VOCAB)
    lengths = {k: v.shape[1] for k, v in batch.items()}
    tokens = shape["batch"] * (shape["inputs"] + shape["targets"])
    peak = matmul_peak(2048, np.float32)
    results = []
    for name, model in (
        ("ENCDEC-S dense", EncoderDecoderModel(dense_twin(cfg))),
        ("ENCDEC-S MoE 8 experts top-1", MoeEncoderDecoderModel(cfg)),
    ):
        compiled, params, opt_state, device_batch, compile_s = compile_train_step(model, batch)
        for _ in range(warmup):
            params, opt_state, loss = compiled(params, opt_state, device_batch)
            loss.block_until_ready()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            params, opt_state, loss = compiled(params, opt_state, device_batch)
            loss.block_until_ready()
            times.append(time.perf_counter() - start)
        step_s = statistics.median(times)
        flops = model.flops_per_token(lengths)
        results.append({
            "workload": name,
            "layers": cfg.num_encoder_layers,
            "params": sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)),
            "tokens_per_step": tokens,
            "compile_s": compile_s,
            "step_s": step_s,
            "tokens_per_s": tokens / step_s,
            "flops_per_token": flops,
            "mfu": flops * tokens / step_s / peak,
            "xla_matmul_peak_gflops": peak / 1e9,
        })  # fmt: skip
    return results


def _problem_batches(task: str, steps: int, batch: int, length: int, seed: int = 0) -> tuple[list[dict], int]:
    from t5x.tasks.builtin import PROBLEMS, builtin_vocabulary, make_examples

    vocab = builtin_vocabulary()
    problems = sorted(PROBLEMS) if task == "all" else [task]
    per_problem = [make_examples(p, "train", steps * batch // len(problems) + batch) for p in problems]
    # Interleaved, so every batch mixes the problems (the mixture's equal rates).
    pairs = [per_problem[i % len(problems)][i // len(problems)] for i in range(steps * batch)]
    if seed:
        # Another seed also sees the examples in another order (seed 0 keeps the original one).
        order = np.random.default_rng(seed).permutation(len(pairs))
        pairs = [pairs[i] for i in order]

    def pad(ids: list[int]) -> list[int]:
        ids = [*ids[: length - 1], vocab.eos_id]
        return ids + [0] * (length - len(ids))

    out = []
    for s in range(steps):
        chunk = pairs[s * batch : (s + 1) * batch]
        inputs = np.array([pad(vocab.encode(a)) for a, _ in chunk], np.int32)
        targets = np.array([pad(vocab.encode(b)) for _, b in chunk], np.int32)
        shifted = np.concatenate([np.zeros((batch, 1), np.int32), targets[:, :-1]], 1)
        out.append({
            "encoder_input_tokens": inputs,
            "decoder_input_tokens": shifted,
            "decoder_target_tokens": targets,
            "decoder_loss_weights": (targets > 0).astype(np.float32),
        })  # fmt: skip
    return out, vocab.vocab_size


def quality(steps: int, task: str, experts: int, capacity: float, seed: int = 0, lr: float = 3e-3) -> dict:
    import jax
    import optax

    from t5x.models import EncoderDecoderModel
    from t5x.moe import MoeEncoderDecoderModel, MoeT5Config, dense_twin

    batches, vocab_size = _problem_batches(task, steps, 32, 32, seed)
    cfg = MoeT5Config(
        vocab_size=vocab_size, emb_dim=64, num_heads=4, head_dim=16, mlp_dim=128,
        mlp_activations=("gelu", "linear"), dropout_rate=0.0, num_encoder_layers=2, num_decoder_layers=2,
        num_experts=experts, num_selected_experts=1, train_capacity_factor=capacity, eval_capacity_factor=2.0,
    )  # fmt: skip
    name = "synthetic_text_to_text problems" if task == "all" else f"synthetic_{task}"
    result = {
        "task": name,
        "steps": steps,
        "batch": 32,
        "length": 32,
        "experts": experts,
        "capacity": capacity,
        "seed": seed,
        "lr": lr,
    }
    for name, model in (
        ("dense", EncoderDecoderModel(dense_twin(cfg))),
        ("moe", MoeEncoderDecoderModel(cfg)),
    ):
        shapes = {k: v.shape for k, v in batches[0].items()}
        params = model.get_initial_variables(jax.random.PRNGKey(seed), shapes)["params"]
        opt = optax.adam(lr)
        state = opt.init(params)

        @jax.jit
        def step(params, state, batch, model=model, opt=opt):
            (_, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, None)
            updates, state = opt.update(grads, state, params)
            per_token = metrics["cross_ent_loss"] / metrics["num_target_tokens"]
            return optax.apply_updates(params, updates), state, per_token

        losses = []
        for batch in batches:
            params, state, loss = step(params, state, batch)
            losses.append(float(loss))
        result[name] = {
            "params": sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)),
            "first_loss": losses[0],
            "final_loss": float(np.mean(losses[-10:])),
            "flops_per_token": model.flops_per_token(
                {"encoder_input_tokens": 32, "decoder_target_tokens": 32}
            ),
        }
    return result


def summarize(runs: list[dict]) -> dict:
    """Several seeds of one setting: each run, and mean / spread (max - min) of the final losses."""
    out = {k: v for k, v in runs[0].items() if k not in ("seed", "dense", "moe")}
    out["seeds"] = [r["seed"] for r in runs]
    out["runs"] = runs
    for name in ("dense", "moe"):
        finals = [r[name]["final_loss"] for r in runs]
        out[f"{name}_final_mean"] = float(np.mean(finals))
        out[f"{name}_final_spread"] = float(np.max(finals) - np.min(finals))
    gaps = [r["moe"]["final_loss"] - r["dense"]["final_loss"] for r in runs]
    out["moe_minus_dense"] = gaps
    out["moe_wins"] = sum(g < 0 for g in gaps)
    return out


def moe_train_step_rows(run_tool, make_row, quick: bool, load, log, timeout) -> list[dict]:
    """tools/bench.py's train-step rows for the MoE and its dense twin (runs this file)."""
    args = ["--steps", "2" if quick else "5", "--warmup", "1"] + (["--quick"] if quick else [])
    rows = []
    for r in run_tool("bench_moe.py", args, log, timeout)["results"]:
        config = f"{r['workload']} float32 ({r['tokens_per_step']} tokens/step)"
        rows.append(make_row("train-step", config, "tokens/s", r["tokens_per_s"], None, None, True, load))
        rows.append(
            make_row(
                "train-step", config, "MFU (active params, float32 peak)", r["mfu"], None, None, True, load
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="2 + 2 layers, batch 4")
    parser.add_argument("--quality", type=int, default=0, metavar="STEPS", help="MoE vs dense training run")
    parser.add_argument(
        "--task", default="all", help="with --quality: a synthetic problem, or all four mixed"
    )
    parser.add_argument("--experts", type=int, default=8, help="with --quality")
    parser.add_argument("--capacity", type=float, default=2.0, help="with --quality: train capacity factor")
    parser.add_argument("--lr", type=float, default=3e-3, help="with --quality: Adam learning rate")
    parser.add_argument(
        "--seeds", default="0", help="with --quality: comma-separated seeds (init and example order)"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.quality:
        seeds = [int(s) for s in args.seeds.split(",")]
        runs = [quality(args.quality, args.task, args.experts, args.capacity, s, args.lr) for s in seeds]
        data = runs[0] if len(runs) == 1 else summarize(runs)
    else:
        data = {"results": train_step(args.quick, args.steps, args.warmup)}
    text = json.dumps(data, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
