#!/usr/bin/env python
"""Benchmark the data pipeline (docs/benchmarks.md `data-lm` and `data-span`) against seqio.

End to end from text files: SentencePiece (8k unigram, trained here on a
generated corpus) tokenization, then
  data-lm:   append EOS -> decoder-only LM conversion packed at 512, batch 8;
  data-span: T5 span corruption (0.15, mean span 3) -> encoder-decoder
             conversion packed at 512/114, batch 8.
Reports non-padding tokens/s in steady state (after the first batch) and the
first-batch latency (pipeline construction + first batch, imports excluded).
Each measurement runs in a fresh process; ours and the peer (seqio + the t5
library, via --peer-python) alternate, and the table shows medians.

Usage:
  python tools/bench_data_pipeline.py [--workload data-lm|data-span|all]
      [--peer-python peers/seqio/bin/python] [--repeats 3] [--batches 200] [--json OUT]
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

LENGTHS = {"data-lm": {"targets": 512}, "data-span": {"inputs": 512, "targets": 114}}
BATCH = 8
EXTRA_IDS = 100
SEED = 0


# --------------------------------------------------------------------------- data
def prepare(workdir: str, num_docs: int) -> tuple[str, str]:
    """Writes the corpus as 8 text files and trains an 8k unigram SentencePiece model."""
    data_dir = os.path.join(workdir, "text")
    model_prefix = os.path.join(workdir, "spm8k")
    if os.path.exists(model_prefix + ".model"):
        return data_dir, model_prefix + ".model"
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "packages", "tasks", "src"))
    from t5x.tasks.builtin import generate_corpus  # no TensorFlow needed

    docs = generate_corpus(num_docs, seed=123, min_sentences=5, max_sentences=60)
    os.makedirs(data_dir, exist_ok=True)
    for shard in range(8):
        with open(os.path.join(data_dir, f"corpus-{shard:02d}.txt"), "w") as f:
            f.write("\n".join(docs[shard::8]) + "\n")
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=os.path.join(data_dir, "corpus-00.txt"),
        model_prefix=model_prefix,
        vocab_size=8000,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        num_threads=2,
        minloglevel=2,
    )
    return data_dir, model_prefix + ".model"


# --------------------------------------------------------------------------- children
def _measure(batches, count_fn, num_batches: int, t_start: float) -> dict:
    first = next(batches)
    latency = time.perf_counter() - t_start
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(num_batches):
        tokens += count_fn(next(batches))
    elapsed = time.perf_counter() - t0
    return {
        "first_batch_s": latency,
        "tokens_per_s": tokens / elapsed,
        "steady_s": elapsed,
        "batches": num_batches,
        "first_batch_tokens": count_fn(first),
    }


def _count(workload: str):
    if workload == "data-lm":
        return lambda b: int((b["decoder_target_tokens"] != 0).sum())
    return lambda b: int((b["encoder_input_tokens"] != 0).sum() + (b["decoder_target_tokens"] != 0).sum())


def child_ours(workload: str, data_dir: str, model: str, num_batches: int) -> dict:
    import functools

    import t5x.tasks as tt
    from t5x.feature_converters import EncDecFeatureConverter, LMFeatureConverter
    from t5x.vocabularies import SentencePieceVocabulary

    t_start = time.perf_counter()
    vocab = SentencePieceVocabulary(model, extra_ids=EXTRA_IDS)
    source = tt.TextLineDataSource({"train": os.path.join(data_dir, "*.txt")})
    if workload == "data-lm":
        features = {"targets": tt.Feature(vocab)}
        preps = [
            functools.partial(tt.rekey, key_map={"targets": "text"}),
            tt.tokenize,
            tt.append_eos_after_trim,
        ]
        converter = LMFeatureConverter(pack=True)
    else:
        features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)}
        preps = [
            functools.partial(tt.rekey, key_map={"inputs": None, "targets": "text"}),
            tt.tokenize,
            tt.span_corruption,
            tt.append_eos_after_trim,
        ]
        converter = EncDecFeatureConverter(pack=True)
    task = tt.Task(f"bench_{workload}", source, features, preps)
    it = tt.BatchIterator(task, converter, LENGTHS[workload], BATCH, seed=SEED)
    return _measure(it, _count(workload), num_batches, t_start)


def child_peer(workload: str, data_dir: str, model: str, num_batches: int) -> dict:
    import functools

    import seqio
    import tensorflow as tf
    from t5.data import preprocessors as t5_preprocessors

    t_start = time.perf_counter()
    vocab = seqio.SentencePieceVocabulary(model, extra_ids=EXTRA_IDS)
    source = seqio.TextLineDataSource({"train": os.path.join(data_dir, "*.txt")})

    @seqio.map_over_dataset
    def to_dict(line):
        return {"text": line}

    if workload == "data-lm":
        features = {"targets": seqio.Feature(vocab)}
        preps = [
            to_dict,
            functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ]
        converter = seqio.LMFeatureConverter(pack=True)
    else:
        features = {"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)}
        preps = [
            to_dict,
            functools.partial(seqio.preprocessors.rekey, key_map={"inputs": None, "targets": "text"}),
            seqio.preprocessors.tokenize,
            t5_preprocessors.span_corruption,
            seqio.preprocessors.append_eos_after_trim,
        ]
        converter = seqio.EncDecFeatureConverter(pack=True)
    name = f"bench_{workload}".replace("-", "_")
    seqio.TaskRegistry.add(name, source=source, preprocessors=preps, output_features=features)
    ds = seqio.get_dataset(
        name,
        LENGTHS[workload],
        dataset_split="train",
        shuffle=True,
        num_epochs=None,
        feature_converter=converter,
        seed=SEED,
    )
    ds = ds.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return _measure(ds.as_numpy_iterator(), _count(workload), num_batches, t_start)


# --------------------------------------------------------------------------- driver
def run_child(python: str, impl: str, workload: str, data_dir: str, model: str, num_batches: int) -> dict:
    from t5x.launch import user_environment  # here: the children need not import it

    # seqio runs as its users run it, without t5x-launch's malloc tunables (see _peer.py).
    env = {**(os.environ if impl == "ours" else user_environment()), "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [
        python,
        os.path.abspath(__file__),
        "--child",
        impl,
        "--workload",
        workload,
        "--data-dir",
        data_dir,
        "--model",
        model,
        "--batches",
        str(num_batches),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode or not out.stdout.strip():
        raise RuntimeError(f"{impl} {workload} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="all", choices=["data-lm", "data-span", "all"])
    parser.add_argument(
        "--peer-python", default=None, help="python with seqio + t5 (e.g. peers/seqio/bin/python)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=200, help="steady-state batches per run")
    parser.add_argument("--docs", type=int, default=20000, help="documents in the generated corpus")
    parser.add_argument(
        "--workdir", default=None, help="where the corpus and model are kept (default: a temp dir)"
    )
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        fn = child_ours if args.child == "ours" else child_peer
        print(json.dumps(fn(args.workload, args.data_dir, args.model, args.batches)), flush=True)
        # Skip interpreter teardown: tf.data threads still running Python-backed
        # tokenizers (numpy_function) can abort the process while it finalizes.
        os._exit(0)

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_data_")
    data_dir, model = prepare(workdir, args.docs)
    workloads = ["data-lm", "data-span"] if args.workload == "all" else [args.workload]
    impls = [("ours", sys.executable)] + ([("seqio", args.peer_python)] if args.peer_python else [])
    results: dict = {}
    for workload in workloads:
        for _ in range(args.repeats):
            for impl, python in impls:  # alternate ours / peer
                r = run_child(
                    python, "ours" if impl == "ours" else "peer", workload, data_dir, model, args.batches
                )
                results.setdefault(workload, {}).setdefault(impl, []).append(r)

    rows, summary = [], {}
    for workload, by_impl in results.items():
        for impl, runs in by_impl.items():
            tps = statistics.median(r["tokens_per_s"] for r in runs)
            first = statistics.median(r["first_batch_s"] for r in runs)
            summary.setdefault(workload, {})[impl] = {
                "tokens_per_s": tps,
                "first_batch_s": first,
                "runs": runs,
            }
            rows.append((workload, impl, tps, first, len(runs)))
        if "seqio" in by_impl:
            ours, peer = summary[workload]["ours"], summary[workload]["seqio"]
            summary[workload]["speedup"] = ours["tokens_per_s"] / peer["tokens_per_s"]
            summary[workload]["first_batch_ratio"] = ours["first_batch_s"] / peer["first_batch_s"]

    print(
        f"load average: {os.getloadavg()}  batch {BATCH}, {args.batches} steady batches, {args.repeats} repeats"
    )
    print(f"{'workload':<10} {'impl':<6} {'non-pad tokens/s':>17} {'first batch s':>14} {'runs':>5}")
    for workload, impl, tps, first, n in rows:
        print(f"{workload:<10} {impl:<6} {tps:>17,.0f} {first:>14.2f} {n:>5}")
    for workload, s in summary.items():
        if "speedup" in s:
            print(
                f"{workload}: ours/seqio tokens/s = {s['speedup']:.2f}x; first-batch latency ratio = "
                f"{s['first_batch_ratio']:.2f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_average": os.getloadavg(), "results": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
