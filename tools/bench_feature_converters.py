"""Benchmark: the feature-converter stage of `data-lm` and `data-span` (docs/benchmarks.md).

Synthetic pre-tokenised examples with realistic lengths go through a converter
with packing and `batch(8)`; we time non-padding tokens per second in steady
state (after the first batch, whose latency is reported separately) and report
the packing efficiency (non-padding fraction of the packed rows).

* data-lm: `LMFeatureConverter`, packed at 512. Example lengths are text lines
  / documents tokenised with an 8k vocabulary: log-normal (median 120 tokens,
  sigma 1.0), EOS included, trimmed to 512 as a seqio Task does.
* data-span: `EncDecFeatureConverter`, packed at 512/114. Lengths are what T5
  span corruption (noise density 0.15, mean span 3) makes of documents
  (log-normal, median 300 tokens, sigma 1.1) split into 568-token chunks:
  a full chunk gives 512 inputs and 114 targets.

Each implementation runs in its own worker process (ours: this interpreter;
seqio: `--peer-python`), fed the same examples; runs alternate between them and
the table shows medians. Usage:

    python tools/bench_feature_converters.py [--peer-python peers/seqio/bin/python]
        [--repeats 5] [--tokens 2000000] [--strategies greedy,first_fit] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

BATCH = 8
WORKLOADS = {
    "data-lm": {"lengths": {"targets": 512}},
    "data-span": {"lengths": {"inputs": 512, "targets": 114}},
}


def _span_corruption_lengths(chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    noise = np.maximum(np.round(chunk * 0.15).astype(int), 1)
    spans = np.maximum(np.round(noise / 3.0).astype(int), 1)
    inputs = chunk - noise + spans + 1
    targets = noise + spans + 1
    return np.minimum(inputs, 512), np.minimum(targets, 114)


def make_examples(workload: str, total_tokens: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Returns flat token arrays and lengths per feature, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    if workload == "data-lm":
        n = max(1, total_tokens // 150)
        lens = {"targets": np.clip(np.round(rng.lognormal(np.log(120), 1.0, n)), 2, 512).astype(np.int64)}
    else:
        docs = np.clip(np.round(rng.lognormal(np.log(300), 1.1, max(1, total_tokens // 250))), 8, 20000)
        chunks = []
        for d in docs.astype(int):
            chunks += [568] * (d // 568) + ([d % 568] if d % 568 >= 8 else [])
        inputs, targets = _span_corruption_lengths(np.asarray(chunks))
        lens = {"inputs": inputs.astype(np.int64), "targets": targets.astype(np.int64)}
    out = {}
    for k, lv in lens.items():
        out[k + "/lengths"] = lv
        out[k + "/tokens"] = rng.integers(2, 8000, size=int(lv.sum()), dtype=np.int32)
    return out


# ----------------------------------------------------------------------------- worker side


def _worker(impl: str, data_path: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    if impl == "seqio":
        import seqio as mod
    else:
        import t5x.feature_converters as mod
    data = dict(np.load(data_path))
    sources = {}

    def source(workload):
        if workload in sources:
            return sources[workload]
        names = sorted(WORKLOADS[workload]["lengths"])
        flats = {k: tf.constant(data[f"{workload}:{k}/tokens"]) for k in names}
        lens = {k: data[f"{workload}:{k}/lengths"] for k in names}
        offs = {k: np.concatenate([[0], np.cumsum(v)[:-1]]) for k, v in lens.items()}
        ds = tf.data.Dataset.from_tensor_slices(({k: offs[k] for k in names}, {k: lens[k] for k in names}))
        ds = ds.map(lambda o, n: {k: tf.slice(flats[k], o[k][None], n[k][None]) for k in names}).cache()
        for _ in ds:  # fill the cache so both implementations read from memory
            pass
        sources[workload] = ds
        return ds

    for line in sys.stdin:
        req = json.loads(line)
        workload, strategy = req["workload"], req.get("strategy", "greedy")
        ds = source(workload)
        lengths = WORKLOADS[workload]["lengths"]
        cls = mod.LMFeatureConverter if workload == "data-lm" else mod.EncDecFeatureConverter
        kwargs = {"pack": True}
        if impl == "ours" and strategy != "greedy":
            kwargs["packing_strategy"] = strategy
        conv = cls(**kwargs)
        t0 = time.perf_counter()
        it = iter(conv(ds, lengths).batch(BATCH).prefetch(2))
        tok_names = ["decoder_target_tokens"] + (["encoder_input_tokens"] if workload == "data-span" else [])
        first = next(it)
        t1 = time.perf_counter()
        nonpad = total = 0
        for b in it:
            for k in tok_names:
                arr = b[k].numpy()
                nonpad += int(np.count_nonzero(arr))
                total += arr.size
        t2 = time.perf_counter()
        print(
            json.dumps(
                {
                    "first_batch_s": t1 - t0,
                    "steady_s": t2 - t1,
                    "tokens_per_s": nonpad / (t2 - t1),
                    "efficiency": nonpad / max(total, 1),
                    "first_rows": int(first[tok_names[0]].shape[0]),
                }
            ),
            flush=True,
        )


# ----------------------------------------------------------------------------- driver side


class _Worker:
    def __init__(self, python: str, impl: str, data_path: str) -> None:
        env = dict(os.environ)
        self.proc = subprocess.Popen(
            [python, os.path.abspath(__file__), "--_worker", impl, "--_data", data_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, req: dict) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker exited with {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-python", help="interpreter with seqio installed, to compare against")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=2_000_000, help="task tokens per workload and run")
    parser.add_argument(
        "--strategies",
        default="greedy,first_fit",
        help="our packing strategies to time (greedy = seqio's layout)",
    )
    parser.add_argument("--workloads", default="data-lm,data-span")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    parser.add_argument("--_data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        _worker(args._worker, args._data)
        return

    workloads = args.workloads.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        data_path = os.path.join(tmp, "examples.npz")
        arrays = {}
        for w in workloads:
            arrays.update({f"{w}:{k}": v for k, v in make_examples(w, args.tokens).items()})
        np.savez(data_path, **arrays)
        workers = {"ours": _Worker(sys.executable, "ours", data_path)}
        if args.peer_python:
            workers["seqio"] = _Worker(args.peer_python, "seqio", data_path)
        # (label, worker, strategy): ours once per strategy, seqio with its default packer.
        impls = [(f"ours:{s}", "ours", s) for s in args.strategies.split(",")]
        if args.peer_python:
            impls.append(("seqio", "seqio", "greedy"))
        results: dict[str, dict[str, list[dict]]] = {
            w: {label: [] for label, _, _ in impls} for w in workloads
        }
        try:
            for w in workloads:  # warm-up: process-level one-off costs stay out of the figures
                for worker in workers.values():
                    worker.run({"workload": w, "strategy": "greedy"})
            for _ in range(args.repeats):
                for w in workloads:
                    for label, worker_name, strategy in impls:
                        results[w][label].append(
                            workers[worker_name].run({"workload": w, "strategy": strategy})
                        )
        finally:
            for worker in workers.values():
                worker.close()

    summary: dict = {
        "loadavg": os.getloadavg(),
        "repeats": args.repeats,
        "tokens": args.tokens,
        "workloads": {},
    }
    print(
        f"feature-converter stage, batch {BATCH}, {args.repeats} alternating runs of {args.tokens:,} task tokens, "
        f"medians; loadavg {os.getloadavg()[0]:.2f}"
    )
    header = f"{'workload':<10} {'impl':<16} {'non-pad tok/s':>14} {'first batch s':>14} {'pack eff':>9} {'vs seqio':>9}"
    print(header)
    print("-" * len(header))
    for w in workloads:
        summary["workloads"][w] = {}
        for label, _, _ in impls:
            runs = results[w][label]
            med = {
                k: statistics.median(r[k] for r in runs)
                for k in ("tokens_per_s", "first_batch_s", "efficiency")
            }
            summary["workloads"][w][label] = med
        for label, _, _ in impls:
            med = summary["workloads"][w][label]
            ratio = ""
            if "seqio" in summary["workloads"][w]:
                med["speedup"] = med["tokens_per_s"] / summary["workloads"][w]["seqio"]["tokens_per_s"]
                ratio = f"{med['speedup']:.2f}x"
            print(
                f"{w:<10} {label:<16} {med['tokens_per_s']:>14,.0f} {med['first_batch_s']:>14.3f} "
                f"{med['efficiency']:>9.3f} {ratio:>9}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
