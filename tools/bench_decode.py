"""Benchmark: the `decode` workload (docs/benchmarks.md) with t5x.models + t5x.decoding.

Greedy decoding of ``--new-tokens`` (64) new tokens with a KV cache, at batch 8 and 1, of
ENCDEC-S (T5.1.1 encoder-decoder, inputs of ``--prompt`` = 256 tokens) and DEC-S (causal
decoder, 12 layers, a prompt of 256 tokens: BOS + 255 tokens on our side, 256 tokens on
the peer's), float32, random weights. EOS never stops a row (ours: an EOS id no token
has; the peer: ``min_new_tokens``), so every row generates exactly ``--new-tokens``
tokens. What is timed is the whole `predict_batch_with_aux` under one `jax.jit`: the
encoder or the prompt prefill, then the decoding loop (one `lax.while_loop`). Compile
time (lower + compile) is reported apart; the steady state is the median of
``--repeats`` calls after one warm-up. Generated tokens/s = batch x new tokens / time.

With ``--peer-python`` (an interpreter with torch + transformers), Hugging Face
`transformers` on PyTorch CPU runs the same workloads in a separate process:
`T5ForConditionalGeneration` (gated-GELU, untied; as tools/bench_train_step.py) and a
`LlamaForCausalLM` of DEC-S's layer shape, `generate(do_sample=False, num_beams=1,
max_new_tokens=64, min_new_tokens=64)` under `torch.inference_mode()` (timing includes
the encoder / prompt pass, as ours does). Ours and the peer's calls alternate one by one;
the peer's first call (model build excluded) stands in for its compile time. Each timed call
waits until both processes have gone idle (`Peer.settle`), so neither side runs beside the
other's still-spinning threads. Ours runs with
t5x-launch's XLA:CPU loop option (`t5x.launch.add_backend_defaults`: decoding loops keep
XLA's threaded matmuls); YNNPACK stays on (only the demo's gin file turns it off). On a busy
machine (1-minute load above the CPU count) the peer runs with ``OMP_WAIT_POLICY=PASSIVE``
(see `Peer`); the JSON records the policy used. The peer runs in the user's own environment,
or with our glibc malloc settings under ``--peer-malloc ours``.

``--products`` also times, for each workload, the weight products one generated token goes
through, chained in a loop of their own and nothing else (ours as a step runs them: through
the packed CPU kernel where `t5x.models.cpu_kernels_ready()`, else XLA's products with the
joined kernels a one-row step uses; the peer's in torch): a floor under a step, which says how
much of a step is the products and how much the rest (attention, the cache, norms). For
greedy rows it splits a step (the call less a call with one new token, over the new tokens
but one) into those products, attention alone (`attention_alone`: every layer's cache read
through the same attention a step calls) and the rest, and sets it against its floor: the
bytes a step streams (float32 weights, the visible keys and values) at the read bandwidth
this process measured (`read_bandwidth`).

``--methods greedy,beam4,topk40`` times beam search (4 beams, length penalty 0.6; HF
``num_beams=4, length_penalty=0.6``) and top-k sampling (k 40, temperature 1; HF
``do_sample=True, top_k=40``) on both sides too; tokens/s count one output per example.

Decoding steps run on t5x.models' CPU kernels (weights packed once per call, the KV cache
streamed) where they build; ``T5X_CPU_KERNELS=0`` times XLA's products alone. The header
line and the JSON (``meta.cpu_kernels``) say which ran.

``--workloads toy`` adds the decoder-machinery table on a one-layer toy model: greedy,
top-k, top-p and beam search, and a bare ``fori_loop`` ``floor``. Usage:

    python tools/bench_decode.py [--workloads encdec,dec] [--batches 8,1] [--repeats 3]
        [--methods greedy,beam4,topk40] [--peer-python peers/hf/bin/python]
        [--peer-malloc user|ours] [--products] [--json OUT]
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
import numpy as np
from _peer import Peer, add_peer_malloc_flag
from _train_step import median_seconds
from flax import traverse_util

from t5x import decoding
from t5x.decoding import DecodingState, beam_search, temperature_sample
from t5x.launch import add_backend_defaults, cpu_kernels_override, restart_with_malloc_defaults
from t5x.models import (
    CpuKernels,
    DecoderOnlyConfig,
    DecoderOnlyModel,
    EncoderDecoderModel,
    T5Config,
    cpu_kernels_ready,
)
from t5x.models._attention import _attend_to_cache
from t5x.models._cpu_kernels import pack_kernel, packed_matmul
from t5x.models._joined import join_decode_kernels


def _cpu_kernels() -> CpuKernels:
    """The models' ``cpu_kernels``: ``auto``, or as ``T5X_CPU_KERNELS`` (read as t5x-launch does) says."""
    return cpu_kernels_override(os.environ, CpuKernels())


def _kernels_on() -> bool:
    option = _cpu_kernels()
    return option.enabled is not False and cpu_kernels_ready(option.cache_dir, option.compiler)


VOCAB, D, HEADS, HEAD_DIM, MLP = 32128, 512, 8, 64, 1024
NAMES = {"encdec": "ENCDEC-S", "dec": "DEC-S"}

PEER_SCRIPT = r"""
import json, sys, time
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration
VOCAB, D, HEADS, HEAD_DIM, MLP = 32128, 512, 8, 64, 1024
torch.manual_seed(0)
models, state = {}, {}
def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
def model(kind, total):
    if kind not in models:
        if kind == "encdec":
            cfg = T5Config(vocab_size=VOCAB, d_model=D, d_kv=HEAD_DIM, d_ff=MLP, num_layers=6, num_decoder_layers=6,
                           num_heads=HEADS, feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
                           decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
            models[kind] = T5ForConditionalGeneration(cfg).eval()
        else:
            cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=MLP, num_hidden_layers=12,
                              num_attention_heads=HEADS, num_key_value_heads=HEADS, tie_word_embeddings=False,
                              max_position_embeddings=total, hidden_act="gelu_pytorch_tanh",
                              bos_token_id=0, eos_token_id=1, pad_token_id=0)
            models[kind] = LlamaForCausalLM(cfg).eval()
    return models[kind]
def generate():
    t = time.perf_counter()
    with torch.inference_mode():
        out = state["model"].generate(**state["inputs"], generation_config=state["config"])
    return time.perf_counter() - t, out.shape[1] - state["prefix"]
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "setup":
        kind, batch, prompt, new = cmd["kind"], cmd["batch"], cmd["prompt"], cmd["new"]
        m = model(kind, prompt + new)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(2, VOCAB, (batch, prompt), generator=g)
        # generate() returns the decoder start token (T5) or the prompt (Llama) before the new tokens.
        search = {"greedy": dict(do_sample=False, num_beams=1),
                  "beam4": dict(do_sample=False, num_beams=4, length_penalty=0.6, early_stopping=False),
                  "topk40": dict(do_sample=True, top_k=40, top_p=1.0, temperature=1.0, num_beams=1)}[cmd["method"]]
        state.update(model=m, inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                     prefix=1 if kind == "encdec" else prompt,
                     config=GenerationConfig(**search, max_new_tokens=new, min_new_tokens=new,
                                             eos_token_id=1, pad_token_id=0, decoder_start_token_id=0))
        s, n = generate()
        reply({"first_s": s, "new_tokens": n, "threads": torch.get_num_threads(),
               "params": sum(p.numel() for p in m.parameters())})
    elif cmd["op"] == "run":
        s, n = generate(); reply({"s": s, "new_tokens": n})
    elif cmd["op"] == "products":
        # The weight products of one generated token, chained as a step chains them (see `products_alone`).
        kernels = [torch.randn(n, k) * 0.02 for k, n in cmd["shapes"]]
        widest = max(k for k, _ in cmd["shapes"])
        def step(x):
            h = x
            for w in kernels:
                y = torch.nn.functional.linear(h[:, : w.shape[1]], w)
                h = y if y.shape[1] >= widest else y.repeat(1, -(-widest // y.shape[1]))
            return x + h[:, : x.shape[1]] * 1e-3
        x, times = torch.randn(cmd["rows"], cmd["shapes"][0][0]), []
        with torch.inference_mode():
            for _ in range(cmd["repeats"] + 1):
                t = time.perf_counter()
                for _ in range(cmd["steps"]):
                    x = step(x)
                times.append((time.perf_counter() - t) / cmd["steps"])
        reply({"s_per_step": sorted(times[1:])[len(times[1:]) // 2]})
    else:
        break
"""


CROSS_KEY_VALUE = {
    ("encoder_decoder_attention", "key"),
    ("encoder_decoder_attention", "value"),
}


class _NoEos:
    """An output vocabulary whose EOS id no token has: every row decodes to its full length."""

    eos_id = -1


def step_kernel_shapes(params, joined: bool) -> list[tuple[int, int]]:
    """``[in, out]`` of each weight product one generated token runs through.

    Every 2-D decoder kernel but cross-attention's key and value (projected once per call);
    with ``joined``, each group `join_decode_kernels` joins counts as its one product.
    """
    flat = traverse_util.flatten_dict(params["decoder"])
    products = {
        path[:-1]: tuple(kernel.shape)
        for path, kernel in flat.items()
        if path[-1] == "kernel" and kernel.ndim == 2 and path[-3:-1] not in CROSS_KEY_VALUE
    }
    if joined:
        groups = traverse_util.flatten_dict(join_decode_kernels(params["decoder"]))
        for path, kernel in groups.items():
            members = (
                ("query", "key", "value")
                if path[-1] == "qkv"
                else [p[-1] for p in products if p[:-1] == path[:-1] and p[-1].startswith("wi_")]
            )
            for member in members:
                del products[(*path[:-1], member)]
            products[path] = tuple(kernel.shape)
    return list(products.values())


def products_alone(shapes: list[tuple[int, int]], rows: int, steps: int, repeats: int, packed: bool) -> float:
    """Seconds per step of ``steps`` steps that only chain ``rows`` rows through ``shapes``.

    Inside a `lax.fori_loop`, as decoding runs them (with ``packed``, through the packed CPU
    kernel, the kernels packed beforehand); what else a step does (attention, norms, the
    cache) is left out, so this bounds a step from below.
    """
    keys = jax.random.split(jax.random.PRNGKey(1), len(shapes))
    kernels = [jax.random.normal(k, s) * 0.02 for k, s in zip(keys, shapes, strict=True)]
    widest = max(k for k, _ in shapes)
    operands = [pack_kernel(w) for w in kernels] if packed else kernels

    def step(_, x):
        h = x
        for (k, n), w in zip(shapes, operands, strict=True):
            y = packed_matmul(h[:, :k], w, n) if packed else h[:, :k] @ w
            h = y if n >= widest else jnp.tile(y, (1, -(-widest // n)))
        return x + h[:, : x.shape[1]] * 1e-3

    run = jax.jit(lambda x: jax.lax.fori_loop(0, steps, step, x))
    x = jnp.ones((rows, shapes[0][0]), jnp.float32)
    return median_seconds(lambda: jax.block_until_ready(run(x)), repeats) / steps


# Method -> (decode_fn, decoder_params, num_decodes); HF's equivalents are in PEER_SCRIPT.
METHODS = {
    "greedy": (decoding.temperature_sample, {"temperature": 0.0}, 1),
    "beam4": (decoding.beam_search, {"alpha": 0.6}, 4),
    "topk40": (decoding.temperature_sample, {"temperature": 1.0, "topk": 40}, 1),
}


def _summed_bandwidth(gib: float, repeats: int) -> float:
    array = jnp.ones((int(gib * 2**28),), jnp.float32)
    total = jax.jit(jnp.sum)
    return array.nbytes / median_seconds(lambda: jax.block_until_ready(total(array)), repeats)


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """The fastest this process streams memory, in bytes per second: the better of two probes.

    XLA summing a ``gib`` GiB float32 array (median of ``repeats``), and one row through
    ``gib / 2`` GiB of weight products as a step runs them (`products_alone`: far beyond any
    L3 cache, so nothing is reused between steps), which often reads faster than the sum.
    """
    summed = _summed_bandwidth(gib, repeats)
    shapes = [(512, 32768)] * int(gib * 8)  # 64 MiB each
    streamed = sum(k * n * 4 for k, n in shapes) / products_alone(shapes, 1, 4, 3, _kernels_on())
    return max(summed, streamed)


def cache_geometry(kind: str, prompt: int, new: int) -> tuple[int, int, int, int]:
    """``(layers, self-attention cache length, first generated position, cross-attention length)``."""
    if kind == "dec":
        return 12, prompt - 1 + new, prompt - 1, 0
    return 6, new, 0, prompt


def attention_alone(kind: str, batch: int, prompt: int, new: int, repeats: int = 3) -> float:
    """Seconds per step of ``new`` steps that only attend, as a step does, to every layer's cache.

    Each layer's self-attention reads its own cache up to the step's position (the rest masked),
    and in ENCDEC-S its cross-attention reads the encoder's ``prompt`` keys and values, through
    the same `_attend_to_cache` a decoding step calls (the fused CPU kernel where it runs).
    """
    layers, length, first, cross = cache_geometry(kind, prompt, new)
    keys = iter(jax.random.split(jax.random.PRNGKey(2), 4 * layers))
    shape = (batch, HEADS, HEAD_DIM)
    # One buffer per layer and role, as in the model: slices of one stacked array would be
    # copied out for the kernel at every step.
    caches = tuple(
        tuple(jax.random.normal(next(keys), (*shape, n)) * 0.1 for n in (length, length, cross, cross))
        for _ in range(layers)
    )
    kernels = _kernels_on()

    def attend(query, key, value, bias):
        return _attend_to_cache(query, key, value, bias, jnp.float32, True, None, kernels)

    def step(i, carry):
        query, caches = carry
        bias = jnp.where(jnp.arange(length) <= first + i, 0.0, -1e10)[None, None, None, :]
        for self_k, self_v, cross_k, cross_v in caches:
            query = query + 1e-3 * attend(query, self_k, self_v, bias)
            if cross:
                query = query + 1e-3 * attend(query, cross_k, cross_v, None)
        return query, caches

    run = jax.jit(lambda q, c: jax.lax.fori_loop(0, new, step, (q, c))[0])
    query = jnp.ones((batch, 1, HEADS, HEAD_DIM), jnp.float32)
    return median_seconds(lambda: jax.block_until_ready(run(query, caches)), repeats) / new


def step_split(kind: str, params, batch: int, args, whole_call, features, kernel_shapes) -> dict:
    """A greedy step's time, split into weight products / attention / the rest, and its floor.

    The step is ``(call - call with one new token) / (new tokens - 1)``, so the encoder or the
    prompt's prefill drops out. Both calls are timed here, alternating, 5 times each with
    nothing in between: the whole call's time from the run against the peer carries what the
    peer's last call left behind (it came out 15% above this one, which put a third of the
    step into "rest"). Bytes streamed per step: every product's float32 weights, and the keys
    and values the attention reads (the visible part, half the new tokens on average); the
    floor is those bytes at XLA's measured read bandwidth.
    """
    short, arrays = build(kind, batch, args.prompt, 1)
    short_features = {k: jnp.asarray(v) for k, v in arrays.items()}
    short_call, _ = compile_predict(short, params, short_features, "greedy")
    whole_s, one_step_s = [], []
    for _ in range(6):  # the first pair warms up
        for call, inputs, times in (
            (whole_call, features, whole_s),
            (short_call, short_features, one_step_s),
        ):
            start = time.perf_counter()
            jax.block_until_ready(call(params, inputs, jax.random.PRNGKey(0)))
            times.append(time.perf_counter() - start)
    call_s, one_s = statistics.median(whole_s[1:]), statistics.median(one_step_s[1:])
    step_s = (call_s - one_s) / max(args.new_tokens - 1, 1)
    layers, _, first, cross = cache_geometry(kind, args.prompt, args.new_tokens)
    visible = first + (args.new_tokens + 1) / 2 + cross
    cache_bytes = layers * 2 * batch * HEADS * HEAD_DIM * visible * 4
    weight_bytes = sum(k * n * 4 for k, n in kernel_shapes)
    bandwidth = read_bandwidth()
    return {
        "step_s": step_s,
        "whole_call_alone_s": call_s,
        "one_new_token_call_s": one_s,
        "attention_s_per_step": attention_alone(kind, batch, args.prompt, args.new_tokens),
        "bytes_per_step": weight_bytes + cache_bytes,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "floor_s_per_step": (weight_bytes + cache_bytes) / bandwidth,
    }


def build(kind: str, batch: int, prompt: int, new: int, method: str = "greedy") -> tuple[object, dict]:
    """Returns (model, features) for decoding ``new`` tokens per row with ``method``."""
    decode_fn = METHODS[method][0]
    rng = np.random.default_rng(0)
    common = dict(
        vocab_size=VOCAB, emb_dim=D, num_heads=HEADS, head_dim=HEAD_DIM, mlp_dim=MLP,
        mlp_activations=("gelu", "linear"), dropout_rate=0.0, logits_via_embedding=False,
    )  # fmt: skip
    if kind == "encdec":
        model = EncoderDecoderModel(
            T5Config(num_encoder_layers=6, num_decoder_layers=6, **common),
            output_vocabulary=_NoEos(),
            decode_fn=decode_fn,
            cpu_kernels=_cpu_kernels(),
        )
        return model, {
            "encoder_input_tokens": rng.integers(2, VOCAB, (batch, prompt), dtype=np.int32),
            "decoder_input_tokens": np.zeros((batch, new), np.int32),
        }
    model = DecoderOnlyModel(
        DecoderOnlyConfig(num_layers=12, **common),
        vocabulary=_NoEos(),
        decode_fn=decode_fn,
        cpu_kernels=_cpu_kernels(),
    )
    # Position 0 is BOS, 1..prompt-1 the prompt; the cache holds prompt - 1 + new positions and
    # the continuation fills the last `new` of them.
    tokens = np.zeros((batch, prompt - 1 + new), np.int32)
    tokens[:, 1:prompt] = rng.integers(2, VOCAB, (batch, prompt - 1))
    causal = np.zeros_like(tokens)
    causal[:, :prompt] = 1
    return model, {"decoder_input_tokens": tokens, "decoder_causal_attention": causal}


def compile_predict(model, params, features: dict, method: str):
    """``predict_batch_with_aux`` with ``method``'s decoder, compiled: ``(call(params, features, rng), seconds)``."""
    _, decoder_params, num_decodes = METHODS[method]
    sampling = method.startswith("top")

    def predict(params, features, rng):
        return model.predict_batch_with_aux(
            params,
            features,
            rng=rng if sampling else None,
            decoder_params=dict(decoder_params),
            num_decodes=num_decodes,
        )[0]

    start = time.perf_counter()
    compiled = jax.jit(predict).lower(params, features, jax.random.PRNGKey(0)).compile()
    return compiled, time.perf_counter() - start


def run_model(
    kind: str, batch: int, args: argparse.Namespace, peer: Peer | None, method: str = "greedy"
) -> dict:
    model, features = build(kind, batch, args.prompt, args.new_tokens, method)
    shapes = {k: v.shape for k, v in features.items()}
    params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    features = {k: jnp.asarray(v) for k, v in features.items()}
    compiled, compile_s = compile_predict(model, params, features, method)
    decodes = np.asarray(compiled(params, features, jax.random.PRNGKey(0)))  # warm-up
    # Continuations are left-aligned: the first `new_tokens` positions of each row are generated.
    new_tokens = decodes.shape[1] if kind == "encdec" else args.new_tokens
    peer_info = None
    if peer is not None:
        peer_info = peer.ask(
            op="setup", kind=kind, batch=batch, prompt=args.prompt, new=args.new_tokens, method=method
        )
        if peer_info["new_tokens"] != args.new_tokens:
            raise RuntimeError(
                f"peer generated {peer_info['new_tokens']} tokens per row, not {args.new_tokens}"
            )
    ours, theirs = [], []
    for i in range(args.repeats):
        if peer is not None:
            peer.settle()
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, features, jax.random.PRNGKey(i)))
        ours.append(time.perf_counter() - start)
        if peer is not None:
            peer.settle()
            theirs.append(peer.ask(op="run")["s"])
    split = args.products and method == "greedy"
    if split:
        rows, packed = batch, model.step_kernels(params, batch) == "packed"
        shapes = step_kernel_shapes(params, joined=rows == 1 and not packed)
        ours_products = products_alone(shapes, rows, args.new_tokens, 3, packed)
        if peer is not None:
            shapes = step_kernel_shapes(params, joined=False)
            theirs_products = peer.ask(
                op="products",
                shapes=shapes,
                rows=rows,
                steps=args.new_tokens,
                repeats=3,
            )
    tokens = batch * new_tokens
    median = statistics.median(ours)
    result = {
        "workload": NAMES[kind],
        "method": method,
        "batch": batch,
        "prompt": args.prompt,
        "new_tokens": new_tokens,
        "compile_s": compile_s,
        "median_s": median,
        "tokens_per_s": tokens / median,
        "times_s": ours,
    }
    if split:
        result["products_s_per_step"] = ours_products
        unjoined = step_kernel_shapes(params, joined=False)
        result.update(step_split(kind, params, batch, args, compiled, features, unjoined))
        if result["step_s"] > result["products_s_per_step"]:
            result["split_ms"] = split_ms(result)
        # else the two calls' difference drowned in noise (a busy machine): no split to report
    if peer_info is not None:
        peer_median = statistics.median(theirs)
        result["peer"] = {
            "first_call_s": peer_info["first_s"],
            "median_s": peer_median,
            "tokens_per_s": tokens / peer_median,
            "times_s": theirs,
            "threads": peer_info["threads"],
            "omp_wait_policy": peer.omp_wait_policy,
            "malloc": peer.malloc,
            "params": peer_info["params"],
        }
        if split:
            result["peer"]["products_s_per_step"] = theirs_products["s_per_step"]
        result["ratio"] = peer_median / median
    return result


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
        state = DecodingState(
            cur_index=jnp.full((batch,), i),
            sequences=inputs,
            cur_token=token,
            cache=cache,
        )
        logits, cache = fn(state)
        return jnp.argmax(logits, axis=-1)[:, None].astype(jnp.int32), cache

    return jax.lax.fori_loop(0, steps, body, (jnp.zeros((batch, 1), jnp.int32), cache))


def build_toy(decoder: str, tokens_to_logits, steps: int):
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


def measure_toy(decoder: str, batch: int, args, model) -> dict:
    params, tokens_to_logits, init_cache = model
    fn, per_example = build_toy(decoder, tokens_to_logits, args.new_tokens)
    inputs = jnp.zeros((batch, args.new_tokens), jnp.int32)
    # Beam search and several-sample decoding expand the cache per row themselves.
    cache = init_cache(batch, args.new_tokens + 1)
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
    tokens = batch * per_example * args.new_tokens
    return {
        "decoder": decoder,
        "batch": batch,
        "rows": batch * per_example,
        "steps": args.new_tokens,
        "compile_s": compile_s,
        "median_s": median,
        "tokens_per_s": tokens / median,
        "ms_per_step": 1000 * median / args.new_tokens,
    }


def _print_models(results: list[dict]) -> None:
    header = f"{'workload':9} {'method':7} {'batch':>5} {'impl':8} {'run s':>8} {'tokens/s':>9} {'compile s':>10} {'ours/peer':>9}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['workload']:9} {r['method']:7} {r['batch']:>5} {'ours':8} {r['median_s']:8.3f} {r['tokens_per_s']:9.1f}"
            f" {r['compile_s']:10.1f}"
        )
        if "peer" in r:
            p = r["peer"]
            print(
                f"{'':9} {'':7} {'':>5} {'HF-torch':8} {p['median_s']:8.3f} {p['tokens_per_s']:9.1f}"
                f" {p['first_call_s']:10.1f} {r['ratio']:8.2f}x"
            )
        if "products_s_per_step" in r:
            theirs = r.get("peer", {}).get("products_s_per_step")
            line = f"{'':15} weight products alone: ours {r['products_s_per_step'] * 1e3:.2f} ms/token"
            print(line + (f", torch {theirs * 1e3:.2f} ms/token" if theirs is not None else ""))
        if "split_ms" in r:
            split = r["split_ms"]
            print(
                f"{'':15} step {split['step']:.2f} ms = products {split['products']:.2f} + attention "
                f"{split['attention']:.2f} + rest {split['rest']:.2f}; floor {split['floor']:.2f} ms "
                f"({r['bytes_per_step'] / 1e6:.0f} MB at {r['read_bandwidth_gb_s']:.1f} GB/s), "
                f"step / floor {split['step'] / split['floor']:.2f}x; a call alone "
                f"{r['whole_call_alone_s']:.3f} s, of which before the first step "
                f"{r['one_new_token_call_s']:.3f} s"
            )


def split_ms(result: dict) -> dict[str, float]:
    """A result's step split in ms: step, products, attention, rest (what neither explains) and floor."""
    step = result["step_s"] * 1e3
    products = result["products_s_per_step"] * 1e3
    attention = result["attention_s_per_step"] * 1e3
    return {
        "step": step,
        "products": products,
        "attention": attention,
        "rest": step - products - attention,
        "floor": result["floor_s_per_step"] * 1e3,
    }


def _print_toy(results: list[dict]) -> None:
    header = f"{'decoder':<9} {'batch':>5} {'rows':>5} {'compile s':>10} {'run s':>9} {'ms/step':>8} {'tokens/s':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['decoder']:<9} {r['batch']:>5} {r['rows']:>5} {r['compile_s']:>10.2f} {r['median_s']:>9.3f}"
            f" {r['ms_per_step']:>8.2f} {r['tokens_per_s']:>10.0f}"
        )


def main() -> None:
    add_backend_defaults(os.environ)  # XLA:CPU's loop options, as under t5x-launch
    restart_with_malloc_defaults()  # glibc malloc settings, as under t5x-launch
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="encdec,dec", help="comma-separated: encdec, dec, toy")
    parser.add_argument("--batches", default="8,1")
    parser.add_argument(
        "--prompt",
        type=int,
        default=256,
        help="input (ENCDEC-S) or prompt (DEC-S) tokens",
    )
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--methods", default="greedy", help=f"encdec / dec: comma-separated decoders from {list(METHODS)}"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer-python", default=None, help="interpreter with torch + transformers")
    add_peer_malloc_flag(parser)
    parser.add_argument("--decoders", default=",".join(DECODERS), help="toy workload: decoders to time")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="toy workload: vocabulary size")
    parser.add_argument("--dim", type=int, default=D, help="toy workload: model width")
    parser.add_argument(
        "--products",
        action="store_true",
        help="also time each side's weight products of one generated token alone (a floor under a step)",
    )
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.workloads.split(",") if k.strip()]
    for k in kinds:
        if k not in (*NAMES, "toy"):
            parser.error(f"unknown workload {k!r}; choose from {[*NAMES, 'toy']}")
    if args.prompt < 2 or args.new_tokens < 1 or args.repeats < 1:
        parser.error(f"--prompt >= 2, --new-tokens >= 1, --repeats >= 1 wanted, got {args.prompt}, "
                     f"{args.new_tokens}, {args.repeats}")  # fmt: skip
    batches = [int(b) for b in args.batches.split(",")]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            parser.error(f"unknown --methods entry {m!r}; choose from {list(METHODS)}")
    loads, results, toy = [], [], []
    peer = (
        Peer(args.peer_python, PEER_SCRIPT, "decode", args.peer_malloc)
        if args.peer_python and set(kinds) & set(NAMES)
        else None
    )
    try:
        for kind in kinds:
            for batch in batches:
                loads.append(os.getloadavg())
                if kind == "toy":
                    model = make_model(args.vocab, args.dim)
                    toy += [measure_toy(d, batch, args, model) for d in args.decoders.split(",")]
                else:
                    for method in methods:
                        loads.append(os.getloadavg())
                        results.append(
                            dict(run_model(kind, batch, args, peer, method), load_before=loads[-1])
                        )
    finally:
        if peer is not None:
            peer.close()
    load = os.getloadavg()
    device = jax.devices()[0]
    print(
        f"decode, {'/'.join(methods)}, {args.new_tokens} new tokens, float32, {device.platform} ({platform.machine()}), "
        f"jax {jax.__version__}, median of {args.repeats}; load average before "
        f"{max(x[0] for x in loads):.2f} (max 1-min), now {tuple(round(x, 2) for x in load)}; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; CPU kernels: "
        f"{'on' if _kernels_on() else 'off (XLA only)'}"
    )
    if results:
        _print_models(results)
        policies = {r["peer"]["omp_wait_policy"] for r in results if "peer" in r}
        if policies:
            print(
                f"peer: Hugging Face transformers on PyTorch CPU, OMP_WAIT_POLICY {', '.join(sorted(policies))}, "
                f"malloc: {args.peer_malloc}"
            )
    if toy:
        print(f"toy one-layer model, vocab {args.vocab}, d {args.dim}:")
        _print_toy(toy)
    if args.json_out:
        meta = {
            "platform": device.platform,
            "device_kind": device.device_kind,
            "jax": jax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "cpu_kernels": _kernels_on(),
            "loadavg": load,
            "cpus": os.cpu_count(),
            "prompt": args.prompt,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "vocab": args.vocab,
            "dim": args.dim,
        }
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "results": results, "toy": toy}, f, indent=1)


if __name__ == "__main__":
    main()
