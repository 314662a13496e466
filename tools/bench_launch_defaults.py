#!/usr/bin/env python
"""Benchmark: what each of t5x-launch's glibc malloc settings does to a whole CPU job.

A t5x-launch job runs its input pipeline (tf.data, many threads) in the same process as its
train steps, so a malloc setting that speeds the step up may slow the pipeline down or cost
memory. Each measurement runs in a fresh process under one set of ``GLIBC_TUNABLES``; the sets
alternate round by round, and the tables show medians.

Workloads:
  encdec: in one process, ENCDEC-S's train step (batch 8, 256/64 tokens, float32, optax
          Adafactor; tools/_train_step.py) and its real input pipeline (`data-span` of
          tools/bench_data_pipeline.py: SentencePiece, span corruption, packed 512/114,
          batch 8), built after the first step as in a job. Reports the step's median, the
          pipeline's non-padding tokens/s, and the process's peak resident memory.
  faults: a jitted 4096^2 float32 program (a product, then elementwise work over its result):
          page faults and system CPU seconds per call, once the first calls have run. Faults
          do not depend on what else the machine runs.
  demo:   the built-in demo, `t5x-launch train` with no gin file (a tiny model whose step
          takes milliseconds, so its own pipeline counts), for `--demo-steps` steps without
          the final inference: the trainer's steps/s (median of its log windows after the
          first) and the peak resident memory.

Usage:
    python tools/bench_launch_defaults.py [--workloads encdec,demo,faults] [--configs glibc,hugetlb,keep,all,launcher]
        [--rounds 3] [--workdir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

_KEEP = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=9223372036854775807"
# Name -> GLIBC_TUNABLES. "glibc" leaves every tunable at glibc's default; the launcher adds
# nothing to any of these (the children call its main with an argv, which does not re-execute).
CONFIGS = {
    "glibc": "",
    "hugetlb": "glibc.malloc.hugetlb=1",
    "keep": f"glibc.malloc.hugetlb=1:{_KEEP}",
    "all": f"glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:{_KEEP}",
    # The launcher's default for CPU jobs: as "all", but buffers of 256 MiB and more are mapped
    # afresh and given back each step, which bounds the heap's fragmentation.
    "launcher": "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=268435456"
    ":glibc.malloc.trim_threshold=9223372036854775807",
    "arena1": "glibc.malloc.arena_max=1",
}
# "launcher" with buffers of 4 MiB and more mapped afresh: on 2026-12-07 a DEC-S step's buffers
# stayed on the launcher's heap and fragmented it (docs/benchmarks.md, Scaling).
CONFIGS["launcher-4m"] = CONFIGS["launcher"].replace("mmap_threshold=268435456", "mmap_threshold=4194304")
TOOLS = pathlib.Path(__file__).resolve().parent


def _cpu_seconds() -> tuple[float, float]:
    """This process's user and system CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def _peak_rss_gib() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def child_encdec(data_dir: str, spm_model: str, steps: int, batches: int) -> dict:
    sys.path.insert(0, str(TOOLS))
    from _train_step import compile_train_step
    from bench_data_pipeline import child_ours
    from bench_train_step import build

    model, batch, _ = build("encdec")
    step, params, opt_state, batch, _ = compile_train_step(model, batch)
    start = time.perf_counter()
    params, opt_state, loss = step(params, opt_state, batch)
    loss.block_until_ready()
    first_step = time.perf_counter() - start
    # The pipeline starts once the heap holds a step's buffers, as in a running job.
    cpu_before = sum(_cpu_seconds())
    pipeline = child_ours("data-span", data_dir, spm_model, batches)
    pipeline_cpu = sum(_cpu_seconds()) - cpu_before
    times = []
    user, system = _cpu_seconds()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, batch)
        loss.block_until_ready()
        times.append(time.perf_counter() - start)
    user_after, system_after = _cpu_seconds()
    # Page faults do not depend on what else the machine runs: the steadiest of these figures.
    step_faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
    tokens = pipeline["tokens_per_s"] * pipeline["steady_s"]
    return {
        "step_s": statistics.median(times),
        "step_cpu_s": (user_after - user + system_after - system) / steps,
        "step_sys_s": (system_after - system) / steps,
        "step_faults": step_faults,
        "first_step_s": first_step,
        "pipeline_tokens_per_s": pipeline["tokens_per_s"],
        # CPU seconds per million tokens, pipeline construction included: steadier than the
        # rate on a machine others load.
        "pipeline_cpu_s_per_mtok": pipeline_cpu / (tokens / 1e6),
        "peak_rss_gib": _peak_rss_gib(),
    }


def child_faults(calls: int) -> dict:
    import jax
    import jax.numpy as jnp

    x = jnp.ones((4096, 4096), jnp.float32)
    program = jax.jit(lambda x: jnp.tanh(x @ x + 1.0).sum() + jnp.exp(x * 2.0).mean())
    for _ in range(2):
        program(x).block_until_ready()
    before, (_, system) = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, _cpu_seconds()
    for _ in range(calls):
        program(x).block_until_ready()
    return {
        "faults_per_call": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls,
        "sys_s_per_call": (_cpu_seconds()[1] - system) / calls,
        "peak_rss_gib": _peak_rss_gib(),
    }


def child_demo(model_dir: str, steps: int) -> dict:
    from t5x.launch.cli import main

    argv = [
        "train",
        f"--gin.MODEL_DIR={model_dir}",
        f"--gin.TRAIN_STEPS={steps}",
        f"--gin.CHECKPOINT_PERIOD={steps}",
        "--gin_bindings=launch.train.infer_eval_dataset_cfg = None",
        "--gin_file=runs/demo.gin",
    ]
    start = time.perf_counter()
    code = main(argv)
    wall = time.perf_counter() - start
    cpu = sum(_cpu_seconds())
    if code:
        raise SystemExit(code)
    rows = [json.loads(line) for line in (pathlib.Path(model_dir) / "metrics.jsonl").read_text().splitlines()]
    rates = [row["timing/steps_per_second"] for row in rows if "timing/steps_per_second" in row]
    return {
        "steps_per_s": statistics.median(rates[1:] or rates),
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_gib": _peak_rss_gib(),
    }


def run_child(workload: str, config: str, args: argparse.Namespace, data: tuple[str, str]) -> dict:
    env = {**os.environ, "GLIBC_TUNABLES": CONFIGS[config], "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("T5X_USER_GLIBC_TUNABLES", None)
    if not CONFIGS[config]:
        env.pop("GLIBC_TUNABLES")
    cmd = [sys.executable, __file__, "--child", workload, "--steps", str(args.steps)]
    cmd += ["--batches", str(args.batches), "--demo-steps", str(args.demo_steps)]
    cmd += ["--data-dir", data[0], "--spm-model", data[1]]
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run(
            [*cmd, "--model-dir", str(pathlib.Path(scratch) / "m")],
            capture_output=True,
            text=True,
            env=env,
            cwd=scratch,
        )
    if out.returncode or not out.stdout.strip():
        raise RuntimeError(f"{workload} under {config} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["load"] = os.getloadavg()[0]
    return result


def _table(workload: str, runs: dict[str, list[dict]]) -> list[str]:
    keys = [k for k in runs[next(iter(runs))][0] if k != "load"]
    base = {k: statistics.median(r[k] for r in runs["glibc"]) for k in keys} if "glibc" in runs else None
    lines = [f"{workload}: medians of {len(next(iter(runs.values())))} runs (ratio to glibc's defaults)"]
    lines.append(f"  {'config':<8} " + " ".join(f"{k:>26}" for k in keys) + "   load")
    for config, rs in runs.items():
        cells = []
        for k in keys:
            value = statistics.median(r[k] for r in rs)
            ratio = f" ({value / base[k]:.2f}x)" if base else ""
            cells.append(f"{value:>17.3f}{ratio:>9}")
        load = statistics.median(r["load"] for r in rs)
        lines.append(f"  {config:<8} " + " ".join(cells) + f"   {load:.1f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="encdec,demo")
    parser.add_argument("--configs", default="glibc,hugetlb,keep,all,launcher")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed ENCDEC-S steps per run")
    parser.add_argument("--batches", type=int, default=150, help="timed pipeline batches per run")
    parser.add_argument("--demo-steps", type=int, default=300)
    parser.add_argument("--workdir", default=None, help="where the pipeline's corpus is kept")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spm-model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        if args.child == "encdec":
            result = child_encdec(args.data_dir, args.spm_model, args.steps, args.batches)
        elif args.child == "faults":
            result = child_faults(10)
        else:
            result = child_demo(args.model_dir, args.demo_steps)
        print(json.dumps(result), flush=True)
        os._exit(0)  # tf.data threads can abort an interpreter's teardown

    sys.path.insert(0, str(TOOLS))
    from bench_data_pipeline import prepare

    data = prepare(args.workdir or tempfile.mkdtemp(prefix="bench_defaults_"), 20000)
    workloads, configs = args.workloads.split(","), args.configs.split(",")
    results: dict = {w: {c: [] for c in configs} for w in workloads}
    print(f"load at start: {os.getloadavg()}", flush=True)
    for round_ in range(args.rounds):
        for workload in workloads:
            # Alternate the order too, so no config always runs right after the same one.
            for config in configs if round_ % 2 == 0 else configs[::-1]:
                result = run_child(workload, config, args, data)
                results[workload][config].append(result)
                print(f"round {round_} {workload} {config}: {result}", flush=True)
    for workload in workloads:
        print("\n".join(_table(workload, results[workload])))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"configs": CONFIGS, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
