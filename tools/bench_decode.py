"""Benchmark: decoding throughput of t5x.decoding over a toy KV-cache model.

The model is deliberately small but shaped like the decode step of a real network: a token
embedding (vocab x d), one single-head attention layer that appends the new key/value to a
``[batch, length, d]`` cache and attends over it, and an untied vocab projection. The
decoders (greedy, top-k / top-p sampling, beam search) run as one jitted program each; the
EOS id is set to -1 so every run decodes exactly ``--steps`` tokens.

For every (decoder, batch) it reports the compile time (lower + compile, measured once)
separately from the steady state: the median of ``--repeats`` timed calls after one warm-up
call. The ``floor`` row runs the same model steps in a bare ``fori_loop`` with an argmax
between them: the difference to ``greedy`` is the cost of the decoding machinery. Tokens/s counts decoded tokens: batch x num_decodes x steps (for beam search, batch x
beams x steps, every beam being one decoded row). Usage:

    python tools/bench_decode.py [--vocab 32128] [--dim 512] [--steps 64]
        [--batches 1,8] [--repeats 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp

from t5x.decoding import DecodingState, beam_search, temperature_sample


def make_model(vocab: int, dim: int, seed: int = 0):
    """Returns (params, tokens_to_logits, init_cache(batch, length))."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 5)
    scale = dim**-0.5
    params = {
        "embed": jax.random.normal(keys[0], (vocab, dim)) * 0.02,
        "query": jax.random.normal(keys[1], (dim, dim)) * scale,
        "key": jax.random.normal(keys[2], (dim, dim)) * scale,
        "value": jax.random.normal(keys[3], (dim, dim)) * scale,
        "logits": jax.random.normal(keys[4], (dim, vocab)) * scale,
    }

    def init_cache(batch: int, length: int) -> dict:
        return {
            "keys": jnp.zeros((batch, length, dim), jnp.float32),
            "values": jnp.zeros((batch, length, dim), jnp.float32),
        }

    def tokens_to_logits(params, state):
        cache = state.cache
        x = params["embed"][state.cur_token[:, 0]]  # [rows, d]
        length = cache["keys"].shape[1]
        slot = jax.nn.one_hot(state.cur_index, length, dtype=x.dtype)[:, :, None]  # [rows, len, 1]
        keys = cache["keys"] * (1 - slot) + slot * (x @ params["key"])[:, None, :]
        values = cache["values"] * (1 - slot) + slot * (x @ params["value"])[:, None, :]
        scores = jnp.einsum("rd,rld->rl", x @ params["query"], keys) * dim**-0.5
        visible = jnp.arange(length)[None, :] <= state.cur_index[:, None]
        weights = jax.nn.softmax(jnp.where(visible, scores, -1e9), axis=-1)
        h = x + jnp.einsum("rl,rld->rd", weights, values)
        return h @ params["logits"], {"keys": keys, "values": values}

    return params, tokens_to_logits, init_cache


DECODERS = {
    "floor": dict(kind="floor"),
    "greedy": dict(kind="sample", temperature=0.0),
    "topk40": dict(kind="sample", temperature=1.0, topk=40),
    "topp0.9": dict(kind="sample", temperature=1.0, topp=0.9),
    "beam4": dict(kind="beam", num_decodes=4, alpha=0.6),
}


def model_only(fn, inputs, cache):
    """The floor: the same model steps with an argmax between them and no decoding logic."""
    batch, steps = inputs.shape

    def body(i, carry):
        token, cache = carry
        state = DecodingState(cur_index=jnp.full((batch,), i), sequences=inputs, cur_token=token, cache=cache)
        logits, cache = fn(state)
        return jnp.argmax(logits, axis=-1)[:, None].astype(jnp.int32), cache

    return jax.lax.fori_loop(0, steps, body, (jnp.zeros((batch, 1), jnp.int32), cache))


def build(decoder: str, tokens_to_logits, steps: int):
    options = dict(DECODERS[decoder])
    kind = options.pop("kind")

    def run(params, inputs, cache, rng):
        fn = lambda state: tokens_to_logits(params, state)  # noqa: E731
        if kind == "floor":
            return model_only(fn, inputs, cache)
        if kind == "beam":
            return beam_search(inputs, cache, fn, -1, **options)
        return temperature_sample(inputs, cache, fn, -1, rng, **options)

    rows_per_example = options.get("num_decodes", 1)
    return jax.jit(run), rows_per_example


def measure(decoder: str, batch: int, args, model) -> dict:
    params, tokens_to_logits, init_cache = model
    fn, per_example = build(decoder, tokens_to_logits, args.steps)
    inputs = jnp.zeros((batch, args.steps), jnp.int32)
    # Beam search and several-sample decoding expand the cache per row themselves.
    cache = init_cache(batch, args.steps + 1)
    rng = jax.random.PRNGKey(0)
    start = time.perf_counter()
    compiled = fn.lower(params, inputs, cache, rng).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(params, inputs, cache, rng))  # warm-up
    times = []
    for i in range(args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, inputs, cache, jax.random.PRNGKey(i)))
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    tokens = batch * per_example * args.steps
    return {
        "decoder": decoder,
        "batch": batch,
        "rows": batch * per_example,
        "steps": args.steps,
        "compile_s": compile_s,
        "median_s": median,
        "tokens_per_s": tokens / median,
        "ms_per_step": 1000 * median / args.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=32128)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--decoders", default=",".join(DECODERS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()

    model = make_model(args.vocab, args.dim)
    results = []
    for decoder in args.decoders.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            results.append(measure(decoder, batch, args, model))

    device = jax.devices()[0]
    print(
        f"t5x.decoding on {device.platform} ({device.device_kind}), jax {jax.__version__}, "
        f"{platform.machine()}, toy model vocab {args.vocab} d {args.dim}, {args.steps} steps, "
        f"median of {args.repeats}; load average {os.getloadavg()}"
    )
    header = f"{'decoder':<9} {'batch':>5} {'rows':>5} {'compile s':>10} {'run s':>9} {'ms/step':>8} {'tokens/s':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['decoder']:<9} {r['batch']:>5} {r['rows']:>5} {r['compile_s']:>10.2f} {r['median_s']:>9.3f}"
            f" {r['ms_per_step']:>8.2f} {r['tokens_per_s']:>10.0f}"
        )
    if args.json_out:
        meta = {
            "platform": device.platform,
            "device_kind": device.device_kind,
            "jax": jax.__version__,
            "loadavg": os.getloadavg(),
            "vocab": args.vocab,
            "dim": args.dim,
            "steps": args.steps,
            "repeats": args.repeats,
        }
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
