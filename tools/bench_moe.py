"""Benchmark: an MoE train step next to its dense twin, and an MoE-vs-dense training run.

`train-step` (the default): ENCDEC-S of docs/benchmarks.md (6 + 6 layers, width 512, gated
GELU, 8 x (256 + 64) tokens) and its Switch-style MoE twin (8 experts in every other layer,
top-1, capacity factor 1.25), each one jitted step (forward, backward, optax Adafactor),
float32 on the CPU. Tokens/s counts inputs + targets; MFU counts only the active
parameters (one expert per token and the routers: `MoeEncoderDecoderModel.flops_per_token`)
against the same-process float32 matmul peak, like tools/bench_train_step.py.

`--quality STEPS`: trains a tiny MoE (`--experts` experts every other layer, top-1, train
capacity factor `--capacity`) and its dense twin (same widths: the MoE has more MLP
parameters at about the same FLOPs per token) for STEPS optimizer steps (Adam at a constant 3e-3
unless `--optimizer`, `--lr`, `--schedule` say otherwise) on the built-in synthetic
problems of `synthetic_text_to_text` (byte vocabulary; `--task all` mixes the four, or name
one), same batches (32 sequences unless `--batch`) and seed, and reports both cross-entropies
per target token at the end (mean of the last 10 steps) and at quarter points. `--task corpus`
pretrains on `synthetic_corpus_span_corruption` instead and adds the validation cross entropy
at quarter points; `--task facts` is a memorisation problem (a fixed table of `--facts`
random keys and values), where extra parameters should matter most. `--set FIELD=VALUE`
changes the MoE's config (top-k, router, grouping, layer period), `--dense-mlp-dim` the
dense twin's.

Usage:
    python tools/bench_moe.py [--steps 5] [--warmup 1] [--quick] [--json OUT]
    python tools/bench_moe.py --quality 400 [--task all|corpus|facts|NAME] [--facts 2000] [--experts 8] [--capacity 2.0]
        [--set num_selected_experts=2 ...] [--dense-mlp-dim 1024] [--seeds 0,1,2]
        [--optimizer adam|adafactor] [--lr 3e-3] [--schedule constant|cosine] [--batch 32] [--json OUT]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
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
    return _text_batches(pairs, steps, batch, length, vocab), vocab.vocab_size


def _facts_batches(
    num_facts: int, steps: int, batch: int, length: int, seed: int = 0
) -> tuple[list[dict], int]:
    """A memorisation problem: ``recall 04817`` -> two words, from a fixed table of ``num_facts``.

    The keys are distinct random five-digit numbers and the values random pairs of
    the synthetic problems' 50 words (about 11 bits a fact); the table is the same
    for every seed, which draws the examples (uniformly, with repetition).
    """
    from t5x.tasks.builtin import WORDS, builtin_vocabulary

    table = np.random.default_rng(1234)
    keys = table.choice(100_000, num_facts, replace=False)
    values = table.integers(0, len(WORDS), (num_facts, 2))
    facts = [(f"recall {k:05d}", f"{WORDS[a]} {WORDS[b]}") for k, (a, b) in zip(keys, values, strict=True)]
    drawn = np.random.default_rng(seed + 77).integers(0, num_facts, steps * batch)
    vocab = builtin_vocabulary()
    return _text_batches([facts[i] for i in drawn], steps, batch, length, vocab), vocab.vocab_size


def _text_batches(pairs: list[tuple[str, str]], steps: int, batch: int, length: int, vocab) -> list[dict]:
    """Encoder-decoder batches of (input, target) texts, padded to ``length``."""

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
    return out


CORPUS_TASK = "synthetic_corpus_span_corruption"
CORPUS_LENGTHS = {"inputs": 128, "targets": 32}


def _corpus_task(train_docs: int | None) -> str:
    """The built-in span-corruption task, or the same objective on a train split of ``train_docs``
    generated documents (the same generator; the built-in validation documents)."""
    if not train_docs:
        return CORPUS_TASK
    import tensorflow as tf

    from t5x.tasks import FunctionDataSource
    from t5x.tasks.builtin import generate_corpus, objective_task

    sizes = {"train": train_docs, "validation": 200}  # the built-in validation split's 200 documents

    def documents(split: str, shuffle_files: bool) -> tf.data.Dataset:
        docs = generate_corpus(sizes[split], seed={"train": 11, "validation": 12}[split])
        return tf.data.Dataset.from_tensor_slices({"text": docs})

    source = FunctionDataSource(documents, splits=tuple(sizes), num_input_examples=sizes)
    return objective_task("span_corruption", source=source, corpus_name=f"moe_corpus_{train_docs}")


def _corpus_batches(
    steps: int, batch: int, seed: int, train_docs: int | None = None
) -> tuple[list[dict], list[dict], int]:
    """Train batches and the whole validation split of the built-in span-corruption task.

    Read through the real pipeline: the registered Task (generated corpus, byte
    vocabulary, T5 span corruption) and the encoder-decoder feature converter,
    unpacked. ``seed`` sets the shuffle order (and, through the task, the noise);
    ``train_docs`` replaces the 5,000 training documents by that many.
    """
    from t5x.feature_converters import EncDecFeatureConverter
    from t5x.tasks import get_mixture_or_task, register_builtin_tasks

    register_builtin_tasks()
    task = get_mixture_or_task(_corpus_task(train_docs))
    converter = EncDecFeatureConverter(pack=False)

    def read(split: str, shuffle: bool, epochs: int | None, count: int | None, size: int) -> list[dict]:
        ds = task.get_dataset(CORPUS_LENGTHS, split=split, shuffle=shuffle, seed=seed, num_epochs=epochs)
        ds = converter(ds, CORPUS_LENGTHS).batch(size, drop_remainder=True)
        if count is not None:
            ds = ds.take(count)
        return list(ds.as_numpy_iterator())

    vocab = task.output_features["targets"].vocabulary
    # Validation in batches of 32 whatever the train batch, so every run scores the same examples.
    return read("train", True, None, steps, batch), read("validation", False, 1, None, 32), vocab.vocab_size


def _tiny_config(vocab_size: int, experts: int, capacity: float, width: int):
    from t5x.moe import MoeT5Config

    return MoeT5Config(
        vocab_size=vocab_size, emb_dim=width, num_heads=4, head_dim=width // 4, mlp_dim=2 * width,
        mlp_activations=("gelu", "linear"), dropout_rate=0.0, num_encoder_layers=2, num_decoder_layers=2,
        num_experts=experts, num_selected_experts=1, train_capacity_factor=capacity, eval_capacity_factor=2.0,
    )  # fmt: skip


SCHEDULES = ("constant", "cosine")


def _learning_rate(schedule: str, peak: float, steps: int):
    """The learning rate: ``peak`` throughout, or 5% linear warm-up then cosine decay to 10%."""
    import optax

    if schedule == "constant":
        return peak
    warmup = max(1, steps // 20)
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, steps, end_value=peak / 10)


OPTIMIZERS = ("adam", "adafactor")


def _optimizer(name: str, learning_rate, params_axes):
    """Adam, or T5X's Adafactor (factored second moments, steps scaled by each parameter's RMS)."""
    import optax

    if name == "adafactor":
        from t5x.moe import logical_factor_rules
        from t5x.training import adafactor, standard_logical_factor_rules

        rules = logical_factor_rules(standard_logical_factor_rules())
        return adafactor(learning_rate=learning_rate, logical_factor_rules=rules).with_param_axes(params_axes)
    return optax.adam(learning_rate)


def quality(
    steps: int,
    task: str,
    experts: int,
    capacity: float,
    seed: int = 0,
    lr: float = 3e-3,
    width: int = 64,
    moe_fields: dict | None = None,
    dense_mlp_dim: int | None = None,
    train_docs: int | None = None,
    schedule: str = "constant",
    optimizer: str = "adam",
    loss_normalizing_factor: str | None = None,
    facts: int = 2000,
    batch: int = 32,
) -> dict:
    """Trains the tiny MoE and its dense twin on the same batches; their losses at the end.

    For the synthetic problems the figure is the training cross entropy (mean of the
    last 10 steps); for ``corpus`` (pretraining on ``synthetic_corpus_span_corruption``)
    also the cross entropy on the whole validation split, in eval mode (the MoE's eval
    capacity factor, no jitter).
    """
    import jax
    import optax

    from t5x.models import EncoderDecoderModel
    from t5x.moe import MoeEncoderDecoderModel, dense_twin

    if task == "corpus":
        batches, validation, vocab_size = _corpus_batches(steps, batch, seed, train_docs)
        name = _corpus_task(train_docs)
        lengths = dict(CORPUS_LENGTHS)
    else:
        if task == "facts":
            batches, vocab_size = _facts_batches(facts, steps, batch, 32, seed)
            name = f"recall {facts} facts"
        else:
            batches, vocab_size = _problem_batches(task, steps, batch, 32, seed)
            name = "synthetic_text_to_text problems" if task == "all" else f"synthetic_{task}"
        validation, lengths = [], {"inputs": 32, "targets": 32}
    cfg = dataclasses.replace(_tiny_config(vocab_size, experts, capacity, width), **(moe_fields or {}))
    dense = dense_twin(cfg)
    if dense_mlp_dim:
        dense = dataclasses.replace(dense, mlp_dim=dense_mlp_dim)
    result = {
        "task": name,
        "steps": steps,
        "batch": batch,
        "lengths": lengths,
        "width": width,
        "experts": experts,
        "capacity": capacity,
        "seed": seed,
        "lr": lr,
        "schedule": schedule,
        "optimizer": optimizer,
        "loss_normalizing_factor": loss_normalizing_factor,
        "moe_fields": dict(moe_fields or {}),
        "dense_mlp_dim": dense.mlp_dim,
        "train_docs": train_docs or 5000,
    }
    flop_lengths = {"encoder_input_tokens": lengths["inputs"], "decoder_target_tokens": lengths["targets"]}
    for name, model in (
        ("dense", EncoderDecoderModel(dense, loss_normalizing_factor=loss_normalizing_factor)),
        ("moe", MoeEncoderDecoderModel(cfg, loss_normalizing_factor=loss_normalizing_factor)),
    ):
        shapes = {k: v.shape for k, v in batches[0].items()}
        variables = model.get_initial_variables(jax.random.PRNGKey(seed), shapes)
        params = variables["params"]
        opt = _optimizer(optimizer, _learning_rate(schedule, lr, steps), variables.get("params_axes"))
        state = opt.init(params)

        def summed(metrics):
            # The cross entropy summed over the batch's target tokens, whatever the normalisation.
            loss = metrics["cross_ent_loss"]
            return loss if loss_normalizing_factor is None else loss * metrics["num_target_tokens"]

        def per_token(metrics):
            return summed(metrics) / metrics["num_target_tokens"]

        @jax.jit
        def step(params, state, batch, rng, model=model, opt=opt):
            # A dropout rng puts the model in training mode: the MoE routes with its
            # train capacity factor (dropout itself is off, rate 0).
            grad_fn = jax.value_and_grad(model.loss_fn, has_aux=True)
            (_, metrics), grads = grad_fn(params, batch, rng)
            updates, state = opt.update(grads, state, params)
            routing = {k: v for k, v in metrics.items() if k.startswith("experts/")}
            return optax.apply_updates(params, updates), state, per_token(metrics), routing

        @jax.jit
        def evaluate(params, batch, model=model):
            _, metrics = model.loss_fn(params, batch, None)
            return summed(metrics), metrics["num_target_tokens"]

        def validation_loss(params):
            sums = [evaluate(params, b) for b in validation]
            return float(sum(float(c) for c, _ in sums) / sum(float(n) for _, n in sums))

        rng = jax.random.PRNGKey(seed + 1000)
        losses, curve, train_curve = [], {}, {}
        for i, train_batch in enumerate(batches, 1):
            rng, step_rng = jax.random.split(rng)
            params, state, loss, routing = step(params, state, train_batch, step_rng)
            losses.append(float(loss))
            if i % max(1, steps // 4) == 0:
                train_curve[i] = float(np.mean(losses[-10:]))
                if validation:
                    curve[i] = validation_loss(params)
        result[name] = {
            "params": sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)),
            "first_loss": losses[0],
            "final_loss": float(np.mean(losses[-10:])),
            "train_curve": train_curve,  # the mean of the last 10 steps' losses at quarter points
            "flops_per_token": model.flops_per_token(flop_lengths),
            "last_step_routing": {k: float(v) for k, v in routing.items()},  # MoE only
        }
        if validation:
            result[name]["validation_loss"] = validation_loss(params)
            result[name]["validation_curve"] = curve
            result[name]["validation_tokens"] = int(sum(b["decoder_loss_weights"].sum() for b in validation))
    return result


def summarize(runs: list[dict]) -> dict:
    """Several seeds of one setting: each run, and the mean / spread (max - min) of each loss."""
    out = {k: v for k, v in runs[0].items() if k not in ("seed", "dense", "moe")}
    out["seeds"] = [r["seed"] for r in runs]
    out["runs"] = runs
    for loss in ("final_loss", "validation_loss"):
        if loss not in runs[0]["dense"]:
            continue
        for name in ("dense", "moe"):
            values = [r[name][loss] for r in runs]
            out[f"{name}_{loss}_mean"] = float(np.mean(values))
            out[f"{name}_{loss}_spread"] = float(np.max(values) - np.min(values))
        gaps = [r["moe"][loss] - r["dense"][loss] for r in runs]
        out[f"moe_minus_dense_{loss}"] = gaps
        out[f"moe_wins_{loss}"] = sum(g < 0 for g in gaps)
    return out


def moe_train_step_rows(run_tool, make_row, quick: bool, load, log, timeout) -> list[dict]:
    """tools/bench.py's train-step rows for the MoE and its dense twin (runs this file)."""
    args = ["--steps", "2" if quick else "5", "--warmup", "1"] + (["--quick"] if quick else [])
    rows = []
    data = run_tool("bench_moe.py", args, log, timeout)
    for r in data["results"]:
        config = f"{r['workload']} float32 ({r['tokens_per_step']} tokens/step)"
        rows.append(make_row("train-step", config, "tokens/s", r["tokens_per_s"], None, None, True, load))
        rows.append(
            make_row(
                "train-step", config, "MFU (active params, float32 peak)", r["mfu"], None, None, True, load
            )
        )
    memory = data.get("memory")  # tools/bench.py's peak of each process it ran
    own = memory and memory["processes"].get(memory["root"])
    if own:  # the MoE and its dense twin share this program's process: the larger of the two
        config = " / ".join(r["workload"] for r in data["results"]) + " float32, one process"
        row = make_row("train-step", config, "peak RSS GiB", own["peak_gib"], None, None, False, load)
        rows.append({**row, "malloc": f"ours: {memory.get('malloc', '-')}"})
    return rows


def _field_value(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    return name.strip(), ast.literal_eval(value.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="2 + 2 layers, batch 4")
    parser.add_argument("--quality", type=int, default=0, metavar="STEPS", help="MoE vs dense training run")
    parser.add_argument(
        "--task",
        default="all",
        help="with --quality: a synthetic problem, all four mixed, corpus (span-corruption pretraining) "
        "or facts (memorising --facts key-value pairs)",
    )
    parser.add_argument(
        "--facts", type=int, default=2000, help="with --quality --task facts: the table's size"
    )
    parser.add_argument(
        "--set",
        type=_field_value,
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="with --quality: an MoeT5Config field of the MoE (e.g. num_selected_experts=2, "
        "router='experts_choose', sequences_per_group=32, moe_layer_period=1); repeatable",
    )
    parser.add_argument(
        "--dense-mlp-dim", type=int, default=None, help="with --quality: the dense twin's MLP width"
    )
    parser.add_argument(
        "--corpus-docs",
        type=int,
        default=None,
        help="with --quality --task corpus: generated training documents (default: the built-in 5,000)",
    )
    parser.add_argument("--batch", type=int, default=32, help="with --quality: sequences per train batch")
    parser.add_argument("--width", type=int, default=64, help="with --quality: model width (MLP 2x)")
    parser.add_argument("--experts", type=int, default=8, help="with --quality")
    parser.add_argument("--capacity", type=float, default=2.0, help="with --quality: train capacity factor")
    parser.add_argument("--lr", type=float, default=3e-3, help="with --quality: the (peak) learning rate")
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="adam",
        help="with --quality: Adam, or T5X's Adafactor (pretraining uses it at --lr 0.01)",
    )
    parser.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="constant",
        help="with --quality: the learning rate, constant or warm-up + cosine decay",
    )
    parser.add_argument(
        "--seeds", default="0", help="with --quality: comma-separated seeds (init and example order)"
    )
    parser.add_argument(
        "--loss-normalizing-factor",
        choices=("NUM_REAL_TARGET_TOKENS",),
        default=None,
        help="with --quality: both models' loss normalisation (upstream's MoE model gins use "
        "NUM_REAL_TARGET_TOKENS, which gives the router losses their intended weight); default: a sum",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.quality:
        seeds = [int(s) for s in args.seeds.split(",")]
        runs = [
            quality(
                args.quality,
                args.task,
                args.experts,
                args.capacity,
                s,
                args.lr,
                args.width,
                dict(args.set),
                args.dense_mlp_dim,
                args.corpus_docs,
                args.schedule,
                args.optimizer,
                args.loss_normalizing_factor,
                args.facts,
                args.batch,
            )
            for s in seeds
        ]
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
