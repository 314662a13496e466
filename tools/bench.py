"""The benchmark suite: every workload of docs/benchmarks.md against its peer, in one table.

Runs the per-workload programs of `tools/` in subprocesses (each alternates ours
and the peer's runs and reports medians), checks the machine's load before each
measurement, and prints one table — workload, config, unit, ours, peer,
peer_name, ratio — with the load seen before each row's measurement and the share
of CPU time the host stole from this machine while the row's workload ran (a
virtual machine's load average does not show it). `ratio` is
always "ours is this many times faster" (ours/peer for rates, peer/ours for
times), so > 1 means we win.

Every workload also has a "peak RSS GiB" row: each side's peak resident memory (``VmHWM``)
in its own process, sampled from ``/proc`` while the program ran, and the malloc settings
each process ran under (from its environment: "glibc default" or the tunables set). Ours
and the peer are always separate processes: train-step and decode run one program (and
one peer) per model, data pipelines run each side in a child of its own, and checkpoint
measures ours and orbax each alone in a fresh process (one save and one restore).

Usage:
    python tools/bench.py [--workloads=train-step,data-lm,data-span,decode,checkpoint]
        [--peer-python hf=peers/hf/bin/python] [--peer-python seqio=peers/seqio/bin/python]
        [--peer-malloc user|ours] [--device auto|cpu|accelerator] [--quick] [--json OUT]

Peers run in their own interpreters (`--peer-python NAME=PYTHON`): `hf` (torch +
transformers) for train-step and decode, `seqio` (seqio + t5) for data-lm and
data-span; orbax runs in our interpreter for checkpoint (when orbax-checkpoint is
installed there). Without a peer a workload reports ours alone. `--json` writes
the list of rows.

Every program here runs the way `t5x-launch` runs jobs as far as the process goes: with its
glibc malloc tunables (huge pages, and freed memory kept for reuse; `t5x.launch._malloc`).
The peers run without them, in the environment the benchmark was started from, as their
users run them (`arena_max=1` made seqio's multi-threaded pipeline 2x slower; PyTorch's
DEC-S step, on the other hand, is faster with all of them: see docs/benchmarks.md).
`--peer-malloc ours` gives the `hf` peer (train-step, decode) our settings too, to compare
the frameworks on equal allocators.

On an accelerator (`--device accelerator`, or `auto` when JAX's default backend is
not the CPU) train-step measures ENCDEC-LARGE and DEC-1B in bfloat16 with
tools/bench_accelerator.py and reports MFU against the chip's dense bf16 peak;
the other workloads run as on the CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from _peer import ProcessTreePeaks, add_peer_malloc_flag, malloc_settings

from t5x.launch import restart_with_malloc_defaults, user_environment

TOOLS = pathlib.Path(__file__).resolve().parent
WORKLOADS = ("train-step", "data-lm", "data-span", "decode", "checkpoint")
TRAIN_STEP_WORKLOADS = ("encdec", "dec", "encdec-bf16", "dec-bf16")  # bench_train_step.py's
# Which --peer-python name each workload compares against (None: in-process or none).
PEER_OF = {"train-step": "hf", "data-lm": "seqio", "data-span": "seqio", "decode": "hf", "checkpoint": None}
BUSY_FACTOR = 1.0  # a 1-minute load above this many runnable tasks per CPU is reported as busy

Row = dict  # {workload, config, unit, ours, peer, peer_name, ratio, load, steal}


def _row(workload: str, config: str, unit: str, ours: float, peer: float | None, peer_name: str | None,
         higher_is_better: bool, load: tuple[float, float, float]) -> Row:  # fmt: skip
    ratio = None
    if peer is not None and ours and peer:
        ratio = ours / peer if higher_is_better else peer / ours
    return {
        "workload": workload, "config": config, "unit": unit, "ours": ours, "peer": peer,
        "peer_name": peer_name if peer is not None else None, "ratio": ratio, "load": list(load),
    }  # fmt: skip


def check_load(wait_s: float, log: Callable[[str], None]) -> tuple[float, float, float]:
    """Returns the load average, first waiting up to ``wait_s`` for a busy machine to calm down."""
    cpus = os.cpu_count() or 1
    deadline = time.monotonic() + wait_s
    load = os.getloadavg()
    while load[0] > BUSY_FACTOR * cpus and time.monotonic() < deadline:
        time.sleep(5)
        load = os.getloadavg()
    if load[0] > BUSY_FACTOR * cpus:
        log(f"  warning: load average {load[0]:.1f} on {cpus} CPUs; figures will be noisy")
    return load


def cpu_times() -> list[int] | None:
    """The machine's CPU time counters (``/proc/stat``'s ``cpu`` line), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def stolen_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """Share of CPU time the hypervisor gave other guests between two :func:`cpu_times`.

    A virtual machine's load average does not show it, yet it slows every figure: the
    8th counter is ``steal``; guest time (9th and 10th) is already counted in ``user``.
    """
    if not before or not after or len(before) < 8:
        return None
    spent = [b - a for a, b in zip(before[:8], after[:8], strict=True)]
    return spent[7] / sum(spent) if sum(spent) > 0 else None


def _run_tool(script: str, args: list[str], log: Callable[[str], None], timeout: float) -> dict:
    """Runs ``tools/<script>`` and returns its JSON, plus ``"memory"``: every process's peak.

    ``memory`` maps each process of the run (the program itself and whatever it started:
    peers, pipeline children) to its own peak resident memory and malloc settings, sampled
    from ``/proc`` while it ran (see :class:`ProcessTreePeaks`).
    """
    with tempfile.TemporaryDirectory(prefix="t5x-bench-") as tmp:
        out = pathlib.Path(tmp) / "result.json"
        command = [sys.executable, str(TOOLS / script), *args, "--json", str(out)]
        log("  $ " + " ".join(command))
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watch = ProcessTreePeaks(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        finally:
            peaks = watch.stop()
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{script} exited {proc.returncode}:\n{stdout[-2000:]}\n{stderr[-4000:]}")
        data = json.loads(out.read_text())
        data["memory"] = {"root": proc.pid, "processes": peaks, "malloc": malloc_of("ours")}
        return data


def memory_side(data: dict, match: Callable[[int, str], bool]) -> dict | None:
    """The largest peak among a run's processes that ``match(pid, cmdline)`` picks (None: none)."""
    chosen = [dict(e, pid=pid) for pid, e in data["memory"]["processes"].items() if match(pid, e["cmdline"])]
    return max(chosen, key=lambda e: e["peak_gib"]) if chosen else None


def is_tool_process(data: dict) -> Callable[[int, str], bool]:
    """Matches the workload program's own process (where our side runs in train-step and decode)."""
    return lambda pid, _cmdline: pid == data["memory"]["root"]


def is_peer_process(pid: int, cmdline: str) -> bool:
    """Matches a :class:`_peer.Peer` process (its script's name has ``_peer_`` in it)."""
    return "_peer_" in cmdline


def malloc_of(side: str) -> str:
    """The malloc settings a side's processes start with: ``ours`` (this process's, which
    t5x-launch's defaults were added to and every program inherits), ``user`` (a peer's, as
    its users run it) or ``orbax`` (in our interpreter)."""
    environ = user_environment() if side == "user" else os.environ
    return malloc_settings(environ.get("GLIBC_TUNABLES"))


def memory_row(workload: str, config: str, ours: dict | None, peer: dict | None, peer_name: str | None,
               load: tuple[float, float, float], peer_malloc: str = "user") -> Row:  # fmt: skip
    """The row of each side's peak resident memory (lower is better) and its malloc settings."""
    malloc = f"ours: {malloc_of('ours') if ours else '-'}; peer: {malloc_of(peer_malloc) if peer else '-'}"
    row = _row(workload, config, "peak RSS GiB", ours and ours["peak_gib"], peer and peer["peak_gib"],
               peer_name, False, load)  # fmt: skip
    return {**row, "malloc": malloc}


def _hf_peer_name(peer_malloc: str) -> str:
    """The table's name for the PyTorch peer: marked when it runs with our malloc settings."""
    return "hf" if peer_malloc == "user" else "hf+our-malloc"


def bench_train_step(
    peer: str | None, quick: bool, load, log, timeout, peer_malloc: str = "user"
) -> list[Row]:
    args = ["--steps", "2" if quick else "5", "--warmup", "1"]
    if peer:
        args += ["--peer-python", peer, "--peer-malloc", peer_malloc]
    rows = []
    peer_name = _hf_peer_name(peer_malloc)
    # One program (and one peer) per workload: a process's peak is then that workload's alone.
    for kind in ["dec"] if quick else TRAIN_STEP_WORKLOADS:
        data = _run_tool("bench_train_step.py", [*args, "--workloads", kind], log, timeout)
        rows += _train_step_rows(data, peer_name, load, peer_malloc)
    from bench_moe import moe_train_step_rows  # ENCDEC-S's Switch-style MoE twin, next to its dense twin

    return rows + moe_train_step_rows(_run_tool, _row, quick, load, log, timeout)


def _train_step_rows(data: dict, peer_name: str, load, peer_malloc: str) -> list[Row]:
    rows = []
    for r in data["results"]:
        p = r.get("peer")
        peer_mode = " (peer: torch.autocast bf16)" if r["peak_dtype"] == "bfloat16" else ""
        config = f"{r['workload']} {r['precision']}{peer_mode} ({r['tokens_per_step']} tokens/step)"
        rows.append(
            _row(
                "train-step",
                config,
                "tokens/s",
                r["tokens_per_s"],
                p and p["tokens_per_s"],
                peer_name,
                True,
                load,
            )
        )
        rows.append(
            _row("train-step", config, "s/step", r["step_s"], p and p["step_s"], peer_name, False, load)
        )
        # MFU: each against its own framework's same-process matmul peak.
        rows.append(
            _row(
                "train-step",
                config,
                f"MFU (own {r['peak_dtype']} matmul peak)",
                r["mfu"],
                p and p["mfu_own_peak"],
                peer_name,
                True,
                load,
            )
        )
        rows.append(_row("train-step", config, "compile s", r["compile_s"], None, None, False, load))
        # The same products, each alone: what the step's matmuls cost in each framework.
        rows.append(
            _row(
                "train-step",
                config,
                f"s, its {r['matmul_tflop']:.2f} TFLOP of products alone",
                r["matmul_floor_s"],
                p and p["torch_matmul_floor_s"],
                peer_name,
                False,
                load,
            )
        )
        peer_memory = memory_side(data, is_peer_process) if p else None
        rows.append(memory_row("train-step", config, memory_side(data, is_tool_process(data)), peer_memory,
                               peer_name, load, peer_malloc))  # fmt: skip
    return rows


def bench_data(workload: str, peer: str | None, quick: bool, load, log, timeout) -> list[Row]:
    args = ["--workload", workload, "--repeats", "1" if quick else "3", "--batches", "20" if quick else "200"]
    if quick:
        args += ["--docs", "2000"]
    if peer:
        args += ["--peer-python", peer]
    config = (
        "SentencePiece 8k, packed 512, batch 8"
        if workload == "data-lm"
        else "span corruption, packed 512/114, batch 8"
    )
    data = _run_tool("bench_data_pipeline.py", args, log, timeout)
    summary = data["results"][workload]
    ours, theirs = summary["ours"], summary.get("seqio")
    # Each pipeline runs in its own child process (`--child ours` / `--child peer`), repeats included.
    ours_memory = memory_side(data, lambda _pid, cmd: "--child ours" in cmd)
    peer_memory = memory_side(data, lambda _pid, cmd: "--child peer" in cmd)
    return [
        _row(workload, config, "non-pad tokens/s", ours["tokens_per_s"], theirs and theirs["tokens_per_s"], "seqio", True, load),
        _row(workload, config, "first-batch s", ours["first_batch_s"], theirs and theirs["first_batch_s"], "seqio", False, load),
        memory_row(workload, config, ours_memory, peer_memory, "seqio", load),
    ]  # fmt: skip


def bench_decode(peer: str | None, quick: bool, load, log, timeout, peer_malloc: str = "user") -> list[Row]:
    args = ["--repeats", "1" if quick else "3"]
    if quick:
        args += ["--workloads", "encdec", "--batches", "1", "--new-tokens", "16"]
    if peer:
        args += ["--peer-python", peer, "--peer-malloc", peer_malloc]
    rows = []
    peer_name = _hf_peer_name(peer_malloc)
    # One program per model and decoder family, so each process's peak is that model's
    # (the largest of its batches): greedy with the step split at batch 8 / 1 / 32, then beam
    # search and top-k sampling at batch 8.
    runs = (
        [args]
        if quick
        else [
            [*args, "--workloads", kind, *extra]
            for kind in ["encdec", "dec"]
            for extra in (
                ["--products", "--batches", "8,1,32"],
                ["--methods", "beam4,topk40", "--batches", "8"],
            )
        ]
    )
    for chosen in runs:
        data = _run_tool("bench_decode.py", chosen, log, timeout)
        rows += _decode_rows(data, peer_name, load, peer_malloc)
    return rows


def _decode_rows(data: dict, peer_name: str, load, peer_malloc: str) -> list[Row]:
    rows = []
    for r in data["results"]:
        p = r.get("peer")
        kernel = "CPU kernels" if data["meta"].get("cpu_kernels") else "XLA only"
        config = (
            f"{r['workload']} {r.get('method', 'greedy')}, batch {r['batch']}, {r['prompt']} prompt"
            f" + {r['new_tokens']} new tokens"
            f" ({kernel})"
        )
        load_before = tuple(r.get("load_before", load))
        rows.append(
            _row(
                "decode",
                config,
                "generated tokens/s",
                r["tokens_per_s"],
                p and p["tokens_per_s"],
                peer_name,
                True,
                load_before,
            )
        )
        rows.append(
            _row(
                "decode",
                config,
                "compile / first call s",
                r["compile_s"],
                p and p["first_call_s"],
                peer_name,
                False,
                load_before,
            )
        )
        if "products_s_per_step" in r:
            # A floor under a step: each side's weight products of one generated token, alone.
            theirs = p.get("products_s_per_step") if p else None
            rows.append(
                _row(
                    "decode",
                    config,
                    "ms/token, weight products alone",
                    r["products_s_per_step"] * 1e3,
                    theirs and theirs * 1e3,
                    peer_name,
                    False,
                    load_before,
                )
            )
        if "split_ms" in r:
            # Where a step's time goes, and how far it is from streaming its bytes.
            split = r["split_ms"]
            units = {
                "step": "ms/token, one decoding step",
                **{part: f"ms/token, step split: {part}" for part in ["products", "attention", "rest"]},
                "floor": "ms/token, bytes streamed / bandwidth",
            }
            for part, unit in units.items():
                rows.append(_row("decode", config, unit, split[part], None, None, False, load_before))
            ratio = split["step"] / split["floor"]
            rows.append(_row("decode", config, "step / floor", ratio, None, None, False, load_before))
    if data["results"]:
        first = data["results"][0]
        batches = " / ".join(sorted({str(r["batch"]) for r in data["results"]}, key=int))
        methods = " / ".join(dict.fromkeys(r.get("method", "greedy") for r in data["results"]))
        config = f"{first['workload']} {methods}, batch {batches} in one process ({first['prompt']} prompt)"
        has_peer = any(r.get("peer") for r in data["results"])
        ours = memory_side(data, is_tool_process(data))
        theirs = memory_side(data, is_peer_process) if has_peer else None
        rows.append(memory_row("decode", config, ours, theirs, peer_name, load, peer_malloc))
    return rows


def bench_checkpoint(peer: str | None, quick: bool, load, log, timeout) -> list[Row]:
    data = _run_tool(
        "bench_checkpoint.py", ["--repeats", "1" if quick else "3", "--compression", "zstd"], log, timeout
    )
    medians, mb = data["medians"], data["bytes"] / 1e6
    has_orbax = "orbax save" in medians
    config = f"ENCDEC-S train state, {mb:.0f} MB, zstd"
    rows = []
    for kind in ("save", "restore"):
        ours = mb / medians[f"ours[zstd] {kind}"]
        theirs = mb / medians[f"orbax {kind}"] if has_orbax else None
        rows.append(_row("checkpoint", config, f"{kind} MB/s", ours, theirs, "orbax", True, load))
    rows.append(
        _row(
            "checkpoint",
            config,
            "async save: blocked s",
            medians["ours[zstd] async blocked"],
            None,
            None,
            False,
            load,
        )
    )
    # Each side alone in a fresh process (orbax otherwise shares ours): the state, one save, one restore.
    sides = {}
    for side in ("ours", "orbax") if has_orbax else ("ours",):
        alone = _run_tool("bench_checkpoint.py", ["--memory-of", side, "--compression", "zstd"], log, timeout)
        sides[side] = memory_side(alone, is_tool_process(alone))
    rows.append(memory_row("checkpoint", config + ", one save + restore", sides["ours"], sides.get("orbax"),
                           "orbax", load, "ours"))  # fmt: skip
    return rows


RUNNERS = {
    "train-step": bench_train_step,
    "data-lm": functools.partial(bench_data, "data-lm"),
    "data-span": functools.partial(bench_data, "data-span"),
    "decode": bench_decode,
    "checkpoint": bench_checkpoint,
}


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def format_table(rows: list[Row]) -> str:
    header = (
        "workload",
        "config",
        "unit",
        "ours",
        "peer",
        "peer_name",
        "ratio",
        "load 1m",
        "steal",
        "malloc",
    )
    cells = [
        (r["workload"], r["config"], r["unit"], _fmt(r["ours"]), _fmt(r["peer"]), r["peer_name"] or "-",
         f"{r['ratio']:.2f}x" if r["ratio"] else "-", f"{r['load'][0]:.1f}",
         "-" if r.get("steal") is None else f"{100 * r['steal']:.0f}%", r.get("malloc", ""))
        for r in rows
    ]  # fmt: skip
    widths = [max(len(str(c[i])) for c in [header, *cells]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(cell, widths)) for cell in cells]
    return "\n".join(lines)


def parse_peers(values: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    peers = {}
    for value in values:
        name, sep, python = value.partition("=")
        if not sep or not name or not python:
            parser.error(f"--peer-python wants NAME=PYTHON (e.g. seqio=/path/bin/python), got {value!r}")
        if not os.access(python, os.X_OK):
            parser.error(f"--peer-python {name}: {python!r} is not an executable interpreter")
        peers[name] = python
    return peers


def _write_json(path: str, rows: list[Row]) -> None:
    pathlib.Path(path).write_text(json.dumps(rows, indent=1))


def detect_device(log: Callable[[str], None]) -> str:
    """``"cpu"`` or ``"accelerator"``, from JAX's default backend (asked in a subprocess)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.default_backend())"], capture_output=True, text=True
    )
    backend = (
        probe.stdout.strip().splitlines()[-1] if probe.returncode == 0 and probe.stdout.strip() else "cpu"
    )
    log(f"JAX default backend: {backend}")
    return "cpu" if backend == "cpu" else "accelerator"


def bench_train_step_accelerator(peer: str | None, quick: bool, load, log, timeout) -> list[Row]:
    del peer  # the PyTorch CPU peer has no counterpart at these sizes
    args = ["--steps", "3" if quick else "10"]
    data = _run_tool("bench_accelerator.py", args, log, timeout)
    rows = []
    for r in data["results"]:
        config = f"{r['workload']} bfloat16 ({r['tokens_per_step']} tokens/step) on {data['device_kind']}"
        rows.append(_row("train-step", config, "tokens/s", r["tokens_per_s"], None, None, True, load))
        rows.append(_row("train-step", config, "MFU (dense bf16 peak)", r["mfu"], None, None, True, load))
        rows.append(_row("train-step", config, "compile s", r["compile_s"], None, None, False, load))
    return rows


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        restart_with_malloc_defaults()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated subset of " + ",".join(WORKLOADS)
    )
    parser.add_argument("--peer-python", action="append", default=[], metavar="NAME=PYTHON")
    add_peer_malloc_flag(parser)
    parser.add_argument(
        "--quick", action="store_true", help="few steps and repeats: checks the suite runs, figures are rough"
    )
    parser.add_argument(
        "--load-wait", type=float, default=0.0, help="seconds to wait for a busy machine before each workload"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per workload program")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "accelerator"),
        default="auto",
        help="accelerator: train-step measures ENCDEC-LARGE / DEC-1B in bfloat16 (auto: by JAX's backend)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the programs that would run, run nothing"
    )
    parser.add_argument("--json", default=None, help="write the list of rows here")
    args = parser.parse_args(argv)
    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    peers = parse_peers(args.peer_python, parser)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    device = args.device if args.device != "auto" else detect_device(log)
    runners = dict(RUNNERS)
    for workload in ("train-step", "decode"):
        runners[workload] = functools.partial(runners[workload], peer_malloc=args.peer_malloc)
    if device == "accelerator":
        runners["train-step"] = bench_train_step_accelerator
    if args.dry_run:
        for workload in chosen:
            wanted = PEER_OF[workload]
            runner = runners[workload]
            name = getattr(runner, "func", runner).__name__
            peer = "orbax, in-process" if workload == "checkpoint" else peers.get(wanted or "", "none")
            print(f"{workload}: {name} (peer: {peer})")
        return 0

    rows: list[Row] = []
    failures: dict[str, str] = {}
    for workload in chosen:
        load = check_load(args.load_wait, log)
        wanted = PEER_OF[workload]
        log(
            f"[{workload}] load average {tuple(round(x, 2) for x in load)}; peer: {wanted if wanted in peers else 'none'}"
        )
        before = cpu_times()
        try:
            measured = runners[workload](
                peers.get(wanted) if wanted else None, args.quick, load, log, args.timeout
            )
            steal = stolen_share(before, cpu_times())
            rows += [{**row, "steal": steal} for row in measured]
            if steal is not None:
                log(f"[{workload}] CPU time stolen by the host while it ran: {100 * steal:.1f}%")
        except (RuntimeError, subprocess.TimeoutExpired, KeyError) as error:
            failures[workload] = f"{type(error).__name__}: {error}"
            log(f"[{workload}] FAILED: {failures[workload]}")
        if args.json:  # after every workload, so an interrupted suite keeps what it measured
            _write_json(args.json, rows)
    final_load = os.getloadavg()
    print(f"\nbenchmark suite{' (quick)' if args.quick else ''}; {os.cpu_count()} CPUs; "
          f"load average now {tuple(round(x, 2) for x in final_load)}; ratio > 1: ours faster")  # fmt: skip
    print(format_table(rows))
    for workload, message in failures.items():
        print(f"{workload}: FAILED ({message.splitlines()[0]})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
