"""Benchmark: SentencePiece tokenisation, the first stage of `data-lm` (docs/benchmarks.md).

Generated English-like text lines (Zipf-distributed words, 4-60 words a line)
train an 8k unigram SentencePiece model with T5's special ids; then each
implementation tokenises the same lines and we time ids per second:

* `python-loop`   encode() one line at a time
* `python-batch`  encode_batch() on batches of --batch lines (ours only; seqio has no batch form)
* `tf-map`        tf.data: Dataset.map(encode_tf, num_parallel_calls=AUTOTUNE) per line
* `tf-batch-map`  tf.data: batch(--batch) -> map(encode_tf, AUTOTUNE) -> unbatch

tf.data figures are steady state, the dataset consumed inside TensorFlow with
`reduce` (no Python iterator per element); the first element of a fresh iterator
(graph building, tracing, pipeline start-up) is timed separately as the
first-batch latency. seqio's tf path
is tensorflow-text's SentencepieceTokenizer; ours calls the SentencePiece Python
processor through tf.numpy_function. Each implementation runs in its own worker
process (ours: this interpreter; seqio: --peer-python); runs alternate between
them and the table shows medians. Usage:

    python tools/bench_tokenize.py [--peer-python peers/seqio/bin/python]
        [--lines 20000] [--batch 64] [--repeats 5] [--model FILE] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

CASES = ("python-loop", "python-batch", "tf-map", "tf-batch-map")
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ou", "ea")]


def generate_lines(n_lines: int, seed: int = 0) -> list[str]:
    """English-like lines: a 30k-word Zipf lexicon, capitals, punctuation and digits."""
    rng = random.Random(seed)
    lexicon = sorted(
        {"".join(rng.choices(SYLLABLES, k=rng.choice((1, 1, 2, 2, 2, 3, 3, 4)))) for _ in range(40000)}
    )
    rng.shuffle(lexicon)
    lexicon = lexicon[:30000]
    weights = [1.0 / (rank + 2) for rank in range(len(lexicon))]
    lines = []
    for _ in range(n_lines):
        words = rng.choices(lexicon, weights, k=rng.randint(4, 60))
        words[0] = words[0].capitalize()
        for i in range(len(words)):
            roll = rng.random()
            if roll < 0.06:
                words[i] += ","
            elif roll < 0.08:
                words[i] = str(rng.randint(0, 2000))
        lines.append(" ".join(words) + rng.choice(".?!."))
    return lines


def train_model(lines: list[str], directory: str, vocab_size: int) -> str:
    import sentencepiece

    corpus = os.path.join(directory, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    prefix = os.path.join(directory, f"unigram{vocab_size}")
    sentencepiece.SentencePieceTrainer.train(
        input=corpus,
        model_prefix=prefix,
        vocab_size=vocab_size,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        minloglevel=2,
    )
    return prefix + ".model"


# ----------------------------------------------------------------------------- worker side


def _worker(impl: str, model: str, text_path: str, batch: int) -> None:
    import tensorflow as tf

    if impl == "ours":
        from t5x.vocabularies import SentencePieceVocabulary
    else:
        from seqio import SentencePieceVocabulary

    vocab = SentencePieceVocabulary(model)
    with open(text_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    batches = [lines[i : i + batch] for i in range(0, len(lines), batch)]

    def python_loop() -> dict:
        start = time.perf_counter()
        tokens = sum(len(vocab.encode(line)) for line in lines)
        return {"seconds": time.perf_counter() - start, "tokens": tokens}

    def python_batch() -> dict:
        if not hasattr(vocab, "encode_batch"):
            return {}
        start = time.perf_counter()
        tokens = sum(len(ids) for b in batches for ids in vocab.encode_batch(b))
        return {"seconds": time.perf_counter() - start, "tokens": tokens}

    def count(ids):
        return tf.size(ids, out_type=tf.int64)

    def tf_pipeline(batched: bool) -> dict:
        ds = tf.data.Dataset.from_tensor_slices(lines)
        if batched:
            ds = ds.batch(batch).map(vocab.encode_tf, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
        else:
            ds = ds.map(vocab.encode_tf, num_parallel_calls=tf.data.AUTOTUNE)
        start = time.perf_counter()
        next(iter(ds))
        first_s = time.perf_counter() - start
        # Steady state: the whole pipeline consumed inside TensorFlow (no Python per
        # element), so the figure is the tokenizer's, not the Python iterator's.
        start = time.perf_counter()
        tokens = int(ds.map(count).reduce(tf.constant(0, tf.int64), tf.math.add))
        return {"seconds": time.perf_counter() - start, "tokens": tokens, "first_s": first_s}

    cases = {
        "python-loop": python_loop,
        "python-batch": python_batch,
        "tf-map": lambda: tf_pipeline(False),
        "tf-batch-map": lambda: tf_pipeline(True),
    }
    print(json.dumps({"ready": True}), flush=True)
    for request in sys.stdin:
        print(json.dumps(cases[json.loads(request)["case"]]()), flush=True)


# ----------------------------------------------------------------------------- driver side


class _Worker:
    def __init__(self, python: str, impl: str, model: str, text_path: str, batch: int) -> None:
        command = [python, os.path.abspath(__file__), "--_worker", impl, "--model", model]
        command += ["--_text", text_path, "--batch", str(batch)]
        # Keep TensorFlow's start-up chatter out of the table.
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self._read()  # waits until the worker has imported everything

    def _read(self) -> dict:
        assert self.proc.stdout
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker exited with {self.proc.wait()}")
        return json.loads(line)

    def run(self, case: str) -> dict:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps({"case": case}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-python", help="interpreter with seqio installed, to compare against")
    parser.add_argument("--lines", type=int, default=20000, help="text lines tokenised per run")
    parser.add_argument("--batch", type=int, default=64, help="lines per batch for the batch cases")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--model", help="use this SentencePiece model instead of training one")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    parser.add_argument("--_text", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        _worker(args._worker, args.model, args._text, args.batch)
        return

    cases = args.cases.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        model = args.model or train_model(generate_lines(50000, seed=1), tmp, args.vocab_size)
        train_s = time.perf_counter() - start
        text_path = os.path.join(tmp, "lines.txt")
        with open(text_path, "w", encoding="utf-8") as f:
            f.write("\n".join(generate_lines(args.lines, seed=2)))
        impls = {"ours": _Worker(sys.executable, "ours", model, text_path, args.batch)}
        if args.peer_python:
            impls["seqio"] = _Worker(args.peer_python, "seqio", model, text_path, args.batch)
        results: dict[str, dict[str, list[dict]]] = {c: {i: [] for i in impls} for c in cases}
        try:
            for _ in range(args.repeats):
                for case in cases:
                    for name, worker in impls.items():
                        results[case][name].append(worker.run(case))
        finally:
            for worker in impls.values():
                worker.close()

    load = os.getloadavg()
    summary: dict = {
        "loadavg": load,
        "lines": args.lines,
        "batch": args.batch,
        "repeats": args.repeats,
        "model_train_s": train_s,
        "cases": {},
    }
    print(
        f"SentencePiece tokenisation, {args.vocab_size // 1000}k unigram, {args.lines} lines, batch {args.batch}, "
        f"{args.repeats} alternating runs, medians; loadavg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    names = list(impls)
    header = f"{'case':<14}" + "".join(f" {n + ' tok/s':>14}" for n in names)
    header += f" {'ours/seqio':>11}" if "seqio" in impls else ""
    header += "".join(f" {n + ' 1st s':>12}" for n in names)
    print(header)
    print("-" * len(header))
    for case in cases:
        row, meds = f"{case:<14}", {}
        for name in names:
            runs = [r for r in results[case][name] if r]
            if not runs:
                row += f" {'n/a':>14}"
                continue
            meds[name] = {
                "tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in runs),
                "tokens": runs[0]["tokens"],
            }
            if "first_s" in runs[0]:
                meds[name]["first_batch_s"] = statistics.median(r["first_s"] for r in runs)
            row += f" {meds[name]['tokens_per_s']:>14,.0f}"
        if "seqio" in impls:
            ratio = meds["ours"]["tokens_per_s"] / meds["seqio"]["tokens_per_s"] if len(meds) == 2 else None
            row += f" {ratio:>10.2f}x" if ratio else f" {'n/a':>11}"
            if ratio:
                meds["ratio"] = ratio
        for name in names:
            first = meds.get(name, {}).get("first_batch_s")
            row += f" {first:>12.3f}" if first is not None else f" {'':>12}"
        print(row)
        summary["cases"][case] = meds
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
