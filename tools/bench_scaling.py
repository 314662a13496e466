#!/usr/bin/env python
"""Benchmark: how a training step and decoding grow with model size and sequence length.

One table, ours (t5x.models, optax Adafactor, float32) and Hugging Face `transformers`
(PyTorch CPU, its Adafactor) side by side, for:

- ENCDEC at S (~70 M parameters), base (~250 M) and large (~780 M): T5.1.1 shapes
  (gated-GELU, untied logits, vocabulary 32128), 256 input and 64 target tokens;
- DEC-S (12 layers, width 512) at 512, 1024 and 2048 tokens per row, 4096 tokens per step.

Each row gives step time, tokens/s, peak resident memory and MFU for both sides. MFU counts
the model's FLOPs per token (PaLM convention, `flops_per_token`) against one yardstick for both
sides: XLA's 2048^3 float32 matrix product, timed in each of our processes, the fastest of
them taken as the machine's peak. Every side of every row runs in a fresh process of its own, one after the other (ours, then the peer): a process's peak
(``VmHWM``) is that side's alone, and the two large models are never resident together on a
machine of 24 GiB. Step times are the median of ``--steps`` steps after one warm-up step.

Then decoding (tools/bench_decode.py, run as a program): DEC-S greedy, 64 new tokens, generated
tokens/s against batch (1, 8, 32) at a 256-token prompt, and against prompt length (128, 512,
1024) at batch 8, ours and HF `generate` alternating call by call.

Our side runs with t5x-launch's glibc malloc settings (the defaults a user's CPU job gets); the
peer in the environment this program started from, as its users run it.

Usage:
    python tools/bench_scaling.py [--peer-python peers/hf/bin/python] [--steps 2] [--rows ...]
        [--quick] [--markdown OUT.md] [--json OUT.json]

``--quick`` runs the S rows at one small batch and one decode setting: a smoke test that the
program works, not figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

TOOLS = pathlib.Path(__file__).resolve().parent
VOCAB = 32128
# name -> model shape and batch. Larger models take smaller batches so a step stays short on a
# 2-core machine; tokens/s and MFU compare across rows, step time does not.
ROWS = {
    "ENCDEC-S": {"arch": "encdec", "d": 512, "heads": 8, "mlp": 1024, "layers": 6, "batch": 8},
    "ENCDEC-base": {"arch": "encdec", "d": 768, "heads": 12, "mlp": 2048, "layers": 12, "batch": 4},
    "ENCDEC-large": {"arch": "encdec", "d": 1024, "heads": 16, "mlp": 2816, "layers": 24, "batch": 2},
    "DEC-S 512": {"arch": "dec", "d": 512, "heads": 8, "mlp": 1024, "layers": 12, "batch": 8, "length": 512},
    "DEC-S 1024": {
        "arch": "dec",
        "d": 512,
        "heads": 8,
        "mlp": 1024,
        "layers": 12,
        "batch": 4,
        "length": 1024,
    },
    "DEC-S 2048": {
        "arch": "dec",
        "d": 512,
        "heads": 8,
        "mlp": 1024,
        "layers": 12,
        "batch": 2,
        "length": 2048,
    },
}
INPUTS, TARGETS, HEAD_DIM = 256, 64, 64
DECODE_BATCHES, DECODE_PROMPTS = (1, 8, 32), (128, 512, 1024)

PEER_SCRIPT = r"""
import json, pathlib, statistics, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration
from transformers.optimization import Adafactor
w, steps = json.loads(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
if w["arch"] == "encdec":
    cfg = T5Config(vocab_size=w["vocab"], d_model=w["d"], d_kv=w["head_dim"], d_ff=w["mlp"], num_layers=w["layers"],
                   num_decoder_layers=w["layers"], num_heads=w["heads"], feed_forward_proj="gated-gelu",
                   tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(cfg)
    batch = {"input_ids": torch.randint(2, w["vocab"], (w["batch"], w["inputs"]), generator=g),
             "labels": torch.randint(2, w["vocab"], (w["batch"], w["targets"]), generator=g)}
else:
    cfg = LlamaConfig(vocab_size=w["vocab"], hidden_size=w["d"], intermediate_size=w["mlp"], num_hidden_layers=w["layers"],
                      num_attention_heads=w["heads"], num_key_value_heads=w["heads"], tie_word_embeddings=False,
                      max_position_embeddings=w["length"], hidden_act="gelu_pytorch_tanh")
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(2, w["vocab"], (w["batch"], w["length"]), generator=g)
    batch = {"input_ids": ids, "labels": ids}
model.train()
opt = Adafactor(model.parameters(), lr=1e-3, scale_parameter=True, relative_step=False, warmup_init=False)
def step():
    t = time.perf_counter()
    loss = model(**batch).loss
    loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t
a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
a @ b
mm = []
for _ in range(5):
    t = time.perf_counter(); a @ b; mm.append(time.perf_counter() - t)
first = step()
times = [step() for _ in range(steps)]
hwm = next(int(l.split()[1]) for l in pathlib.Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
print(json.dumps({"step_s": statistics.median(times), "first_step_s": first, "peak_gib": hwm / 2**20,
                  "peak_flops": 2 * 2048 ** 3 / statistics.median(mm),
                  "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}))
"""


def workload(name: str) -> dict:
    """A row's full shape: ROWS plus the fixed parts (vocabulary, head size, sequence lengths)."""
    w = {"vocab": VOCAB, "head_dim": HEAD_DIM, "inputs": INPUTS, "targets": TARGETS, **ROWS[name]}
    w["tokens"] = w["batch"] * (w["inputs"] + w["targets"] if w["arch"] == "encdec" else w["length"])
    return w


def child_ours(w: dict, steps: int) -> dict:
    """One side of a row, in this (fresh) process: our train step, timed, and this process's peak."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from _peer import peak_rss_gib
    from _train_step import compile_train_step, matmul_peak

    from t5x.models import DecoderOnlyConfig, DecoderOnlyModel, EncoderDecoderModel, T5Config

    rng = np.random.default_rng(0)
    common = dict(
        vocab_size=w["vocab"], emb_dim=w["d"], num_heads=w["heads"], head_dim=w["head_dim"], mlp_dim=w["mlp"],
        mlp_activations=("gelu", "linear"), dropout_rate=0.0, logits_via_embedding=False,
    )  # fmt: skip
    if w["arch"] == "encdec":
        model = EncoderDecoderModel(
            T5Config(num_encoder_layers=w["layers"], num_decoder_layers=w["layers"], **common)
        )
        tgt = rng.integers(2, w["vocab"], (w["batch"], w["targets"]), dtype=np.int32)
        batch = {
            "encoder_input_tokens": rng.integers(2, w["vocab"], (w["batch"], w["inputs"]), dtype=np.int32)
        }
    else:
        model = DecoderOnlyModel(DecoderOnlyConfig(num_layers=w["layers"], **common))
        tgt = rng.integers(2, w["vocab"], (w["batch"], w["length"]), dtype=np.int32)
        batch = {}
    batch["decoder_input_tokens"] = np.concatenate([np.zeros((w["batch"], 1), np.int32), tgt[:, :-1]], 1)
    batch["decoder_target_tokens"] = tgt
    batch["decoder_loss_weights"] = np.ones(tgt.shape, np.float32)
    lengths = {k: v.shape[1] for k, v in batch.items()}
    peak = matmul_peak(2048, jnp.float32)
    compiled, params, opt_state, batch, compile_s = compile_train_step(model, batch)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    start = time.perf_counter()
    params, opt_state, loss = compiled(params, opt_state, batch)
    loss.block_until_ready()
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, batch)
        loss.block_until_ready()
        times.append(time.perf_counter() - start)
    return {
        "step_s": statistics.median(times),
        "first_step_s": first,
        "compile_s": compile_s,
        "peak_gib": peak_rss_gib(),
        "peak_flops": peak,
        "params": n_params,
        "flops_per_token": model.flops_per_token(lengths),
        "loss": float(loss),
    }


def _run(command: list[str], env: dict[str, str] | None, timeout: float) -> dict:
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"{' '.join(command[:4])} ... exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def measure_row(name: str, steps: int, peer_python: str | None, timeout: float, log) -> dict:
    from _peer import malloc_settings, peer_environment

    w = workload(name)
    ours_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    row = {"name": name, "workload": w, "load_before": os.getloadavg()}
    log(f"[{name}] ours, load {row['load_before'][0]:.1f}")
    command = [sys.executable, __file__, "--child", json.dumps(w), "--steps", str(steps)]
    try:
        row["ours"] = _run(command, ours_env, timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as error:  # e.g. out of memory: say so in the row
        row["ours"] = {"error": str(error).splitlines()[0]}
    if peer_python:
        env = {**peer_environment("user"), "TF_CPP_MIN_LOG_LEVEL": "3"}
        if "OMP_WAIT_POLICY" not in env and os.getloadavg()[0] > (os.cpu_count() or 1):
            env["OMP_WAIT_POLICY"] = "PASSIVE"  # as _peer.Peer does on a busy machine
        row["load_before_peer"] = os.getloadavg()
        log(f"[{name}] HF, load {row['load_before_peer'][0]:.1f}")
        with tempfile.NamedTemporaryFile("w", suffix="_peer_scaling.py", delete=False) as script:
            script.write(PEER_SCRIPT)
        try:
            peer = _run([peer_python, script.name, json.dumps(w), str(steps)], env, timeout)
            row["peer"] = {**peer, "malloc": malloc_settings(env.get("GLIBC_TUNABLES"))}
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            row["peer"] = {"error": str(error).splitlines()[0]}
        finally:
            os.unlink(script.name)
    for side in ("ours", "peer"):
        r = row.get(side)
        if r and "step_s" in r:
            r["tokens_per_s"] = w["tokens"] / r["step_s"]
    log(f"[{name}] {json.dumps({k: row.get(k) for k in ('ours', 'peer')})}")
    return row


def measure_decode(peer_python: str | None, quick: bool, timeout: float, log) -> list[dict]:
    """DEC-S greedy decoding against batch and prompt length, through tools/bench_decode.py."""
    settings = [(256, (1,))] if quick else [(256, DECODE_BATCHES)] + [(p, (8,)) for p in DECODE_PROMPTS]
    out = []
    for prompt, batches in settings:
        with tempfile.TemporaryDirectory() as tmp:
            result = pathlib.Path(tmp) / "decode.json"
            command = [
                sys.executable,
                str(TOOLS / "bench_decode.py"),
                "--workloads",
                "encdec" if quick else "dec",
            ]
            command += ["--batches", ",".join(map(str, batches)), "--prompt", str(prompt)]
            command += ["--repeats", "1" if quick else "2", "--json", str(result)]
            command += ["--new-tokens", "8" if quick else "64"]
            if peer_python:
                command += ["--peer-python", peer_python]
            log(f"[decode] prompt {prompt}, batches {batches}, load {os.getloadavg()[0]:.1f}")
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            if proc.returncode or not result.exists():
                raise RuntimeError(f"bench_decode.py exited {proc.returncode}:\n{proc.stderr[-3000:]}")
            for r in json.loads(result.read_text())["results"]:
                peer = r.get("peer") or {}
                out.append({"workload": r["workload"], "batch": r["batch"], "prompt": r["prompt"],
                            "new_tokens": r["new_tokens"], "ours": r["tokens_per_s"],
                            "peer": peer.get("tokens_per_s"), "load": r.get("load_before")})  # fmt: skip
    return out


def _f(value: float | None, digits: str = ".3g") -> str:
    return "-" if value is None else format(value, digits)


def markdown(rows: list[dict], decode: list[dict], meta: dict) -> str:
    """The scaling table (train steps, then decoding) as markdown."""
    lines = [
        f"Measured {meta['date']} on {meta['cpus']} CPUs; 1-minute load {meta['load_min']:.1f}-{meta['load_max']:.1f} "
        f"as each side started; median of {meta['steps']} steps after 1 warm-up; ours under {meta['ours_malloc']}, "
        f"HF under {meta['peer_malloc']}. MFU: FLOPs per token x tokens/s over "
        f"{_f(meta['peak_flops'] and meta['peak_flops'] / 1e9, '.0f')} GFLOP/s, the fastest float32 2048^3 "
        "product XLA ran in any row's process (one yardstick for both sides).",
        "",
        "| row | params (ours / HF) | batch x tokens | ours s/step | HF s/step | ours tok/s | HF tok/s | ratio | ours peak GiB | HF peak GiB | ours MFU | HF MFU | load (ours / HF) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        w, ours, peer = row["workload"], row["ours"], row.get("peer") or {}
        tokens = f"{w['inputs']}+{w['targets']}" if w["arch"] == "encdec" else str(w["length"])
        ratio = ours["tokens_per_s"] / peer["tokens_per_s"] if "step_s" in ours and "step_s" in peer else None
        params = " / ".join(f"{p / 1e6:.0f} M" for p in (ours.get("params"), peer.get("params")) if p) or "-"
        load_peer = row.get("load_before_peer", [None])[0]
        cells = [
            row["name"], params, f"{w['batch']} x {tokens}",
            _f(ours.get("step_s")), _f(peer.get("step_s")), _f(ours.get("tokens_per_s"), ",.0f"),
            _f(peer.get("tokens_per_s"), ",.0f"), f"{ratio:.2f}x" if ratio else "-",
            _f(ours.get("peak_gib"), ".2f"), _f(peer.get("peak_gib"), ".2f"),
            _f(ours.get("mfu") and 100 * ours["mfu"], ".0f") + "%" if ours.get("mfu") else "-",
            _f(peer.get("mfu") and 100 * peer["mfu"], ".0f") + "%" if peer.get("mfu") else "-",
            f"{row['load_before'][0]:.1f} / {_f(load_peer, '.1f')}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
        for side in ("ours", "peer"):
            if "error" in (row.get(side) or {}):
                lines.append(f"| ↳ {side} failed: {row[side]['error']} |")
    if decode:
        lines += ["", "| decode (greedy) | batch | prompt | new tokens | ours tok/s | HF tok/s | ratio | load |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for d in decode:
            ratio = f"{d['ours'] / d['peer']:.2f}x" if d["peer"] else "-"
            load = f"{d['load'][0]:.1f}" if d.get("load") else "-"
            lines.append(f"| {d['workload']} | {d['batch']} | {d['prompt']} | {d['new_tokens']} | {d['ours']:,.0f} | "
                         f"{_f(d['peer'], ',.0f')} | {ratio} | {load} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rows", default=",".join(ROWS), help="comma-separated subset of: " + ", ".join(ROWS)
    )
    parser.add_argument("--steps", type=int, default=2, help="timed steps per side after 1 warm-up")
    parser.add_argument("--peer-python", default=None, help="interpreter with torch + transformers")
    parser.add_argument("--no-decode", action="store_true", help="skip the decoding table")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: ENCDEC-S and DEC-S at batch 1, one decode"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per side of a row")
    parser.add_argument("--markdown", default=None, help="write the table here")
    parser.add_argument("--json", default=None, help="write every figure here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(TOOLS))
    if args.child:
        from _peer import malloc_settings

        from t5x.launch import restart_with_malloc_defaults

        restart_with_malloc_defaults()  # as a t5x-launch CPU job starts (re-executes this child)
        result = child_ours(json.loads(args.child), args.steps)
        result["malloc"] = malloc_settings(os.environ.get("GLIBC_TUNABLES"))
        print(json.dumps(result), flush=True)
        return 0
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; choose from {list(ROWS)}")
    if args.peer_python and not os.access(args.peer_python, os.X_OK):
        parser.error(f"--peer-python: {args.peer_python!r} is not an executable interpreter")
    if args.quick:
        names = ["ENCDEC-S", "DEC-S 512"]
        for name in names:  # a smoke test: one row each, small
            ROWS[name] = {**ROWS[name], "batch": 1, "layers": 2}
        args.steps = 1

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    rows: list[dict] = []
    for name in names:
        rows.append(measure_row(name, args.steps, args.peer_python, args.timeout, log))
        write(rows, [], args)  # after every row, so an interrupted run keeps what it measured
    decode = [] if args.no_decode else measure_decode(args.peer_python, args.quick, args.timeout, log)
    table = write(rows, decode, args)
    print(table)
    failed = [r["name"] for r in rows if any("error" in (r.get(s) or {}) for s in ("ours", "peer"))]
    return 1 if failed else 0


def set_mfu(rows: list[dict], meta: dict) -> None:
    """Every side's MFU against one yardstick: the fastest 2048^3 float32 product any row timed.

    Each of our processes times XLA's product once; on a shared machine one such timing can
    come out low (a row's MFU then reads above 100%), so the best of them is the machine's peak.
    """
    peaks = [r["ours"]["peak_flops"] for r in rows if "peak_flops" in r["ours"]]
    meta["peak_flops"] = max(peaks) if peaks else None
    for row in rows:
        flops = row["ours"].get("flops_per_token")
        for side in ("ours", "peer"):
            r = row.get(side)
            if r and "tokens_per_s" in r:
                r["mfu"] = (
                    flops * r["tokens_per_s"] / meta["peak_flops"] if flops and meta["peak_flops"] else None
                )


def write(rows: list[dict], decode: list[dict], args: argparse.Namespace) -> str:
    """Writes the table (``--markdown``) and every figure (``--json``) so far; returns the table."""
    from _peer import malloc_settings, peer_environment

    loads = [r["load_before"][0] for r in rows] + [
        r["load_before_peer"][0] for r in rows if "load_before_peer" in r
    ]
    meta = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "cpus": os.cpu_count(), "steps": args.steps,
        "load_min": min(loads), "load_max": max(loads), "quick": args.quick,
        "ours_malloc": next((r["ours"]["malloc"] for r in rows if "malloc" in r["ours"]), "-"),
        "peer_malloc": malloc_settings(peer_environment("user").get("GLIBC_TUNABLES")),
    }  # fmt: skip
    set_mfu(rows, meta)
    table = markdown(rows, decode, meta)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table)
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps({"meta": meta, "rows": rows, "decode": decode}, indent=1)
        )
    return table


if __name__ == "__main__":
    sys.exit(main())
