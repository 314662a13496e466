"""Decoding kernels prepared once per call: joined (one-row steps) and packed (the CPU kernel).

For each: what is prepared, that a step really multiplies by it, that it changes nothing, and
how a model's ``cpu_kernels`` option chooses between them."""

import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from t5x import decoding
from t5x.models import (
    CpuKernels,
    DecoderOnlyModel,
    EncoderDecoderModel,
    _attention,
    _step_kernels,
    cpu_kernels_ready,
    preset,
)
from t5x.models._cpu_kernels import MAX_ROWS as PACKED_MAX_ROWS
from t5x.models._cpu_kernels import (
    PACKED,
    cache_attention,
    cache_step,
    pack_decode_kernels,
    pack_kernel,
    packed_matmul,
    packed_matmuls,
)
from t5x.models._joined import JOINED, join_decode_kernels

VOCAB = 40


def _encdec(batch=1):
    rng = np.random.default_rng(5)
    enc = rng.integers(2, VOCAB, size=(batch, 7)).astype(np.int32)
    tgt = rng.integers(2, VOCAB, size=(batch, 5)).astype(np.int32)
    dec_in = np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1)
    model = EncoderDecoderModel(preset("t5_1_1_tiny", vocab_size=VOCAB))
    feats = {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in, "decoder_target_tokens": tgt}
    params = model.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in feats.items()})[
        "params"
    ]
    return model, params, feats


def test_joins_each_decoder_self_attention_and_gated_mlp():
    _, params, _ = _encdec()
    joined = join_decode_kernels(params["decoder"])
    layers = sorted(k for k in params["decoder"] if k.startswith("layers_"))
    assert sorted(joined) == layers
    for name in layers:
        layer, got = params["decoder"][name], joined[name]
        assert sorted(got) == ["mlp", "self_attention"]  # no cross-attention: its keys read the encoder
        attention = layer["self_attention"]
        want = np.concatenate([attention[n]["kernel"] for n in ("query", "key", "value")], axis=1)
        np.testing.assert_array_equal(got["self_attention"]["qkv"], want)
        want = np.concatenate([layer["mlp"]["wi_0"]["kernel"], layer["mlp"]["wi_1"]["kernel"]], axis=1)
        np.testing.assert_array_equal(got["mlp"]["wi"], want)


def test_scanned_or_ungated_kernels_do_not_join():
    scanned = EncoderDecoderModel(preset("umt5_tiny", vocab_size=VOCAB))
    shapes = {"encoder_input_tokens": (1, 7), "decoder_input_tokens": (1, 5), "decoder_target_tokens": (1, 5)}
    params = scanned.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    assert join_decode_kernels(params["decoder"]) == {}
    relu = EncoderDecoderModel(preset("t5_1_1_tiny", vocab_size=VOCAB, mlp_activations=("relu",)))
    params = relu.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    assert all(
        sorted(layer) == ["self_attention"] for layer in join_decode_kernels(params["decoder"]).values()
    )


def _stepwise_logits(model, params, feats, prepared=None, step_kernels="xla"):
    """Teacher-forced logits of single decoding steps run as ``step_kernels`` says.

    ``prepared`` adds variable collections (the packed or joined kernels)."""
    module, enc, dec_in = model.module, feats["encoder_input_tokens"], feats["decoder_input_tokens"]
    stepper = module.clone(step_kernels=step_kernels)
    length = dec_in.shape[1]
    cache_shapes = jax.eval_shape(
        lambda: module.apply(
            {"params": params}, enc, dec_in, dec_in, enable_dropout=False, decode=True,
            max_decode_length=length, mutable=["cache"],
        )[1]["cache"]
    )  # fmt: skip
    cache = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), cache_shapes)
    encoded = module.apply({"params": params}, enc, enable_dropout=False, method="encode")
    variables = {"params": params, **(prepared or {})}

    def step(cache, tok):
        logits, new_vars = stepper.apply(
            {**variables, "cache": cache}, encoded, enc, tok[:, None], tok[:, None],
            enable_dropout=False, decode=True, max_decode_length=length, mutable=["cache"], method="decode",
        )  # fmt: skip
        return new_vars["cache"], logits[:, 0]

    return np.asarray(jax.jit(lambda c: jax.lax.scan(step, c, dec_in.T)[1])(cache))


def test_one_row_steps_read_the_joined_kernels_and_match_the_separate_products():
    model, params, feats = _encdec(batch=1)
    joined = join_decode_kernels(params["decoder"])
    full = model.module.apply({"params": params}, *feats.values(), enable_dropout=False)
    separate = _stepwise_logits(model, params, feats)
    together = _stepwise_logits(model, params, feats, {JOINED: {"decoder": joined}}, "joined")
    np.testing.assert_allclose(together, separate, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(together, np.swapaxes(np.asarray(full), 0, 1), atol=2e-5, rtol=2e-5)
    # Zeroed joined kernels change the logits: the step really multiplies by them.
    zeroed = jax.tree_util.tree_map(jnp.zeros_like, joined)
    assert not np.allclose(
        _stepwise_logits(model, params, feats, {JOINED: {"decoder": zeroed}}, "joined"), separate, atol=1e-3
    )
    # Steps on XLA's products ignore joined kernels they are given.
    np.testing.assert_array_equal(
        _stepwise_logits(model, params, feats, {JOINED: {"decoder": zeroed}}), separate
    )


def test_a_step_on_joined_or_packed_kernels_without_them_names_the_missing_collection():
    model, params, feats = _encdec(batch=1)
    with pytest.raises(ValueError, match="joined_kernels"):
        _stepwise_logits(model, params, feats, None, "joined")
    with pytest.raises(ValueError, match="packed_kernels"):
        _stepwise_logits(model, params, feats, None, "packed")


def test_steps_of_several_rows_ignore_joined_kernels():
    model, params, feats = _encdec(batch=2)
    zeroed = jax.tree_util.tree_map(jnp.zeros_like, join_decode_kernels(params["decoder"]))
    np.testing.assert_array_equal(
        _stepwise_logits(model, params, feats, {JOINED: {"decoder": zeroed}}, "joined"),
        _stepwise_logits(model, params, feats),
    )


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_greedy_decoding_of_one_example_equals_its_row_in_a_batch(kind):
    # Batch 1 decodes through the joined kernels, batch 2 through the separate ones (the
    # joined kernels are the fallback where the CPU kernels are off).
    rng = np.random.default_rng(7)
    if kind == "encdec":
        model, params, feats = _encdec(batch=2)
        model = EncoderDecoderModel(model.config, decode_fn=decoding.temperature_sample, cpu_kernels=False)
        batch = {
            "encoder_input_tokens": feats["encoder_input_tokens"],
            "decoder_input_tokens": np.zeros((2, 6), np.int32),
        }
    else:
        model = DecoderOnlyModel(preset("decoder_tiny", vocab_size=VOCAB), cpu_kernels=False)
        tokens = rng.integers(2, VOCAB, size=(2, 10)).astype(np.int32)
        dca = (np.arange(10)[None, :] <= np.array([[4], [6]])).astype(np.int32)
        batch = {"decoder_input_tokens": tokens * dca, "decoder_causal_attention": dca}
        shapes = {"decoder_input_tokens": (2, 10), "decoder_target_tokens": (2, 10)}
        params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    assert model.step_kernels(params, 1) == "joined" and model.step_kernels(params, 2) == "xla"
    greedy = {"temperature": 0.0}
    both, both_aux = model.predict_batch_with_aux(params, batch, decoder_params=greedy)
    for row in range(2):
        one, one_aux = model.predict_batch_with_aux(
            params, {k: v[row : row + 1] for k, v in batch.items()}, decoder_params=greedy
        )
        np.testing.assert_array_equal(one[0], both[row])
        np.testing.assert_allclose(one_aux["scores"][0], both_aux["scores"][row], rtol=1e-5, atol=1e-5)


# --- packed kernels ---------------------------------------------------------------------

requires_compiler = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")) and not os.environ.get("CXX"),
    reason="the CPU kernels are built with a C++ compiler, and none is installed",
)


@requires_compiler
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20])
@pytest.mark.parametrize(("k", "n"), [(1, 5), (7, 32), (64, 33), (130, 100)])
def test_packed_matmul_equals_the_product(rows, k, n):
    assert cpu_kernels_ready()
    rng = np.random.default_rng(rows * 1000 + k + n)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    kernel = rng.normal(size=(k, n)).astype(np.float32)
    got = jax.jit(lambda x, p: packed_matmul(x, p, n))(x, pack_kernel(kernel))
    assert got.shape == (rows, n) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, x.astype(np.float64) @ kernel.astype(np.float64), rtol=1e-5, atol=1e-5)


@requires_compiler
def test_packed_matmul_keeps_leading_axes_and_vmaps():
    assert cpu_kernels_ready()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 16)).astype(np.float32)
    kernel = rng.normal(size=(16, 40)).astype(np.float32)
    packed = pack_kernel(kernel)
    want = np.einsum("abk,kn->abn", x, kernel)
    np.testing.assert_allclose(packed_matmul(x, packed, 40), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        jax.vmap(lambda r: packed_matmul(r, packed, 40))(x), want, rtol=1e-5, atol=1e-5
    )


@requires_compiler
@pytest.mark.parametrize("rows", [1, 8, 9])
def test_packed_matmuls_equal_each_product_in_one_call(rows):
    assert cpu_kernels_ready()
    rng = np.random.default_rng(rows)
    x = rng.normal(size=(rows, 24)).astype(np.float32)
    kernels = [rng.normal(size=(24, n)).astype(np.float32) for n in (32, 70, 5)]
    fn = jax.jit(lambda x, *packed: packed_matmuls(x, [(p, k.shape[1]) for p, k in zip(packed, kernels)]))
    packed = [pack_kernel(k) for k in kernels]
    for got, kernel in zip(fn(x, *packed), kernels, strict=True):
        np.testing.assert_allclose(got, x.astype(np.float64) @ kernel, rtol=1e-5, atol=1e-5)
    assert fn.lower(x, *packed).as_text().count("t5x_packed_matmul") == 1


@requires_compiler
def test_a_decoding_step_multiplies_its_query_key_value_and_gates_in_one_call_each():
    assert cpu_kernels_ready()
    model, params, features = _greedy_case("decoder", 2)
    fn = jax.jit(lambda p, b: model.predict_batch_with_aux(p, b, decoder_params={"temperature": 0.0}))
    hlo = fn.lower(params, features).as_text()
    # Per layer: query|key|value, the gates wi_0|wi_1, out and wo; then the logits.
    assert hlo.count("@t5x_packed_matmul(") == 4 * model.config.num_layers + 1


@requires_compiler
def test_pack_kernel_lays_out_32_column_blocks():
    kernel = np.arange(3 * 70, dtype=np.float32).reshape(3, 70)
    packed = np.asarray(pack_kernel(kernel))
    assert packed.shape == (3, 3, 32)  # ceil(70 / 32) blocks of [in, 32]
    for block in range(3):
        width = min(32, 70 - 32 * block)
        np.testing.assert_array_equal(packed[block, :, :width], kernel[:, 32 * block : 32 * block + width])
        np.testing.assert_array_equal(packed[block, :, width:], 0)


def test_pack_decode_kernels_packs_every_2d_kernel():
    _, params, _ = _encdec()
    packed = pack_decode_kernels(params["decoder"])
    flat = traverse_util.flatten_dict(params["decoder"])
    got = traverse_util.flatten_dict(packed)
    assert sorted(got) == sorted(path for path, v in flat.items() if path[-1] == "kernel")
    for path, value in got.items():
        np.testing.assert_array_equal(value, pack_kernel(flat[path]))
    scanned = EncoderDecoderModel(preset("umt5_tiny", vocab_size=VOCAB))
    shapes = {"encoder_input_tokens": (1, 7), "decoder_input_tokens": (1, 5), "decoder_target_tokens": (1, 5)}
    stacked = scanned.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    # Scanned layers' kernels are 3-D (a layer axis): only the logits kernel packs.
    assert list(pack_decode_kernels(stacked["decoder"])) == ["logits_dense"]


@requires_compiler
@pytest.mark.parametrize("batch", [1, 2])
def test_steps_read_the_packed_kernels_and_match_the_separate_products(batch):
    assert cpu_kernels_ready()
    model, params, feats = _encdec(batch=batch)
    packed = pack_decode_kernels(params["decoder"])
    separate = _stepwise_logits(model, params, feats)
    np.testing.assert_allclose(
        _stepwise_logits(model, params, feats, {PACKED: {"decoder": packed}}, "packed"),
        separate,
        atol=1e-5,
        rtol=1e-5,
    )
    # Zeroed packed kernels change the logits: the step really multiplies by them.
    zeroed = jax.tree_util.tree_map(jnp.zeros_like, packed)
    assert not np.allclose(
        _stepwise_logits(model, params, feats, {PACKED: {"decoder": zeroed}}, "packed"), separate, atol=1e-3
    )


@requires_compiler
def test_steps_of_more_rows_than_the_packed_kernel_takes_ignore_it():
    assert cpu_kernels_ready()
    # Zeroed packed kernels would zero the products; only the cache kernels, which a step
    # on the CPU kernels attends with, may move the last bits.
    model, params, feats = _encdec(batch=PACKED_MAX_ROWS + 1)
    zeroed = jax.tree_util.tree_map(jnp.zeros_like, pack_decode_kernels(params["decoder"]))
    np.testing.assert_allclose(
        _stepwise_logits(model, params, feats, {PACKED: {"decoder": zeroed}}, "packed"),
        _stepwise_logits(model, params, feats),
        rtol=1e-5,
        atol=1e-5,
    )


def _greedy_case(kind, batch):
    rng = np.random.default_rng(11)
    if kind == "encdec":
        model, params, feats = _encdec(batch=batch)
        model = EncoderDecoderModel(model.config, decode_fn=decoding.temperature_sample)
        return (
            model,
            params,
            {
                "encoder_input_tokens": feats["encoder_input_tokens"],
                "decoder_input_tokens": np.zeros((batch, 6), np.int32),
            },
        )
    model = DecoderOnlyModel(preset("decoder_tiny", vocab_size=VOCAB))
    tokens = rng.integers(2, VOCAB, size=(batch, 10)).astype(np.int32)
    dca = (np.arange(10)[None, :] <= rng.integers(2, 7, size=(batch, 1))).astype(np.int32)
    shapes = {"decoder_input_tokens": (batch, 10), "decoder_target_tokens": (batch, 10)}
    params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]
    return model, params, {"decoder_input_tokens": tokens * dca, "decoder_causal_attention": dca}


@requires_compiler
@pytest.mark.parametrize("kind", ["encdec", "decoder"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_decodes_with_the_packed_kernel_equal_xlas(kind, batch):
    assert cpu_kernels_ready()
    model, params, batch_features = _greedy_case(kind, batch)
    greedy = {"temperature": 0.0}

    def decode(cpu_kernels):
        model.cpu_kernels = cpu_kernels
        fn = jax.jit(lambda p, b: model.predict_batch_with_aux(p, b, decoder_params=greedy))
        return fn(params, batch_features), fn.lower(params, batch_features).as_text()

    assert model.cpu_kernels == CpuKernels("auto")
    (packed, packed_aux), packed_hlo = decode("auto")
    (xla, xla_aux), xla_hlo = decode(False)
    # Self-attention writes its cache and attends in one kernel; cross-attention only attends.
    cross = ("t5x_cache_attention",) if kind == "encdec" else ()
    for target in ("t5x_packed_matmul", "t5x_pack_kernel", "t5x_cache_step", *cross):
        assert target in packed_hlo and target not in xla_hlo
    np.testing.assert_array_equal(packed, xla)
    np.testing.assert_allclose(packed_aux["scores"], xla_aux["scores"], rtol=1e-5, atol=1e-5)


@requires_compiler
@pytest.mark.parametrize("cpu_kernels", ["auto", False])
def test_beams_read_their_examples_encoder_output_without_a_copy_each(cpu_kernels):
    assert cpu_kernels_ready()
    model, params, feats = _encdec(batch=2)
    model = EncoderDecoderModel(model.config, cpu_kernels=cpu_kernels)
    enc, beams, length = feats["encoder_input_tokens"], 3, 5
    rows = len(enc) * beams
    tokens = np.random.default_rng(2).integers(2, VOCAB, size=(rows, length)).astype(np.int32)
    ones = jnp.ones((rows, length), jnp.int32)
    apply = functools.partial(model.module.apply, enable_dropout=False, decode=True, max_decode_length=length)
    _, empty = jax.eval_shape(lambda: apply({"params": params}, ones, ones, ones, mutable=["cache"]))
    empty = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), empty)

    def steps(encoded, raw_inputs):
        """Logits of `length` steps, each row fed its own tokens."""
        step_module, variables = model._step(params, rows, after=encoded)
        cache, logits = empty["cache"], []
        for t in range(length):
            token = tokens[:, t : t + 1]
            out, new = step_module.apply(
                {**variables, "cache": cache},
                encoded,
                raw_inputs,
                token,
                token,
                enable_dropout=False,
                decode=True,
                max_decode_length=length,
                mutable=["cache"],
                method="decode",
            )
            cache = new["cache"]
            logits.append(out[:, 0])
        return jnp.stack(logits, 1)

    encoded = model.module.apply({"params": params}, enc, enable_dropout=False, method="encode")
    shared = jax.jit(steps)
    got = shared(encoded, enc)
    # Upstream's layout: the encoder's output and inputs repeated for each beam.
    want = jax.jit(steps)(*(jnp.repeat(a, beams, axis=0) for a in (encoded, enc)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # No array of the program holds the encoder's output, keys or values per beam.
    hlo = shared.lower(encoded, enc).compile().as_text()
    heads, depth, embed = model.config.num_heads, model.config.head_dim, model.config.emb_dim
    for per_beam in (f"f32[{rows},7,{embed}]", f"f32[{rows},{heads},{depth},7]"):
        assert per_beam not in hlo
    assert ("t5x_cache_attention" in hlo) == (cpu_kernels == "auto")


@requires_compiler
@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_a_decode_call_packs_its_kernels_after_the_encoder_or_prompt_pass(kind):
    # Packed before that pass, the kernels would be held through it: the call's temporary
    # memory would be the pass's plus theirs (here 11.7 against 8.0 MB, 9.0 against 6.5).
    assert cpu_kernels_ready()
    config = dict(vocab_size=4096, emb_dim=128, num_heads=4, head_dim=32, mlp_dim=256)
    batch, prompt, new = 8, 128, 8
    if kind == "encdec":
        model = EncoderDecoderModel(preset("t5_1_1_tiny", **config), cpu_kernels=True)
        features = {
            "encoder_input_tokens": jnp.ones((batch, prompt), jnp.int32),
            "decoder_input_tokens": jnp.zeros((batch, new), jnp.int32),
        }
        first_pass = lambda p, f: model._encode_jit(p, f["encoder_input_tokens"])  # noqa: E731
    else:
        model = DecoderOnlyModel(preset("decoder_tiny", **config), cpu_kernels=True)
        features = {
            "decoder_input_tokens": jnp.ones((batch, prompt + new), jnp.int32),
            "decoder_causal_attention": jnp.ones((batch, prompt + new), jnp.int32).at[:, prompt:].set(0),
        }
        first_pass = model.prefill_cache
    shapes = {k: v.shape for k, v in features.items()}
    params = model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"]

    def temp_bytes(fn):
        return jax.jit(fn).lower(params, features).compile().memory_analysis().temp_size_in_bytes

    call = temp_bytes(lambda p, f: model.predict_batch_with_aux(p, f)[0])
    packed = sum(leaf.nbytes for leaf in jax.tree.leaves(pack_decode_kernels(params["decoder"])))
    assert call < temp_bytes(first_pass) + packed


_READY_SCRIPT = """
import json, os, sys
from t5x.models._cpu_kernels import unavailable_reason
cache, compiler = sys.argv[1], sys.argv[2] or None
reason = unavailable_reason(cache_dir=cache, compiler=compiler)
built = sorted(os.listdir(cache)) if os.path.isdir(cache) else []
print(json.dumps({"reason": reason, "built": built}))
"""


def _ready_in_subprocess(tmp_path, compiler="", **env):
    # A fresh process: the kernels register once per process.
    full = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, "-c", _READY_SCRIPT, str(tmp_path / "cache"), compiler],
        env=full,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@requires_compiler
def test_the_kernels_are_built_once_into_the_cache(tmp_path):
    first = _ready_in_subprocess(tmp_path)
    assert first["reason"] is None and len(first["built"]) == 1 and first["built"][0].endswith(".so")
    library = tmp_path / "cache" / first["built"][0]
    stamp = library.stat().st_mtime_ns
    # Another process loads the cached build, even where no compiler would work.
    second = _ready_in_subprocess(tmp_path, compiler="/bin/false")
    assert second["reason"] is None and second["built"] == first["built"]
    assert library.stat().st_mtime_ns == stamp


def test_a_failed_build_says_why_and_the_library_reads_no_environment(tmp_path):
    # The compiler comes from the caller; CXX and T5X_CACHE_DIR are the launcher's to read.
    got = _ready_in_subprocess(
        tmp_path, compiler="/bin/false", CXX="/nonexistent", T5X_CACHE_DIR=str(tmp_path / "elsewhere")
    )
    assert got["reason"].startswith("the CPU kernels did not build") and got["built"] == []
    assert not (tmp_path / "elsewhere").exists()


def test_cpu_kernels_option_values():
    config = preset("t5_1_1_tiny", vocab_size=VOCAB)
    assert EncoderDecoderModel(config).cpu_kernels == CpuKernels(enabled="auto")
    assert EncoderDecoderModel(config, cpu_kernels=False).cpu_kernels == CpuKernels(enabled=False)
    option = CpuKernels(enabled=True, cache_dir="/tmp/k", compiler="clang++")
    assert EncoderDecoderModel(config, cpu_kernels=option).cpu_kernels is option
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="cpu_kernels must be True, False, 'auto'"):
            EncoderDecoderModel(config, cpu_kernels=bad)
    with pytest.raises(ValueError, match="CpuKernels.enabled"):
        CpuKernels(enabled="on")
    with pytest.raises(ValueError, match="needs unscanned layers"):
        EncoderDecoderModel(preset("umt5_tiny", vocab_size=VOCAB), cpu_kernels=True)
    with pytest.raises(ValueError, match="needs float32 layers"):
        DecoderOnlyModel(preset("decoder_tiny", vocab_size=VOCAB, dtype="bfloat16"), cpu_kernels=True)


def _fail_build(monkeypatch):
    monkeypatch.setattr(_step_kernels, "unavailable_reason", lambda *_: "the CPU kernels did not build: no")


def test_auto_falls_back_to_xla_with_a_warning_and_true_raises(monkeypatch):
    model, params, _ = _encdec(batch=2)
    _fail_build(monkeypatch)
    with pytest.warns(UserWarning, match="decoding uses XLA's products; the CPU kernels did not build"):
        assert model.step_kernels(params, 2) == "xla"
    model.cpu_kernels = True
    with pytest.raises(RuntimeError, match="cpu_kernels=True, but decoding cannot use the CPU kernels"):
        model.step_kernels(params, 2)
    model.cpu_kernels = False
    assert model.step_kernels(params, 1) == "joined"  # no build tried, no warning


@requires_compiler
def test_step_kernels_per_call():
    assert cpu_kernels_ready()
    model, params, _ = _encdec()
    assert [model.step_kernels(params, rows) for rows in (1, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1)] == [
        "packed",
        "packed",
        "xla",
    ]
    model.cpu_kernels = False
    assert [model.step_kernels(params, rows) for rows in (1, 2)] == ["joined", "xla"]
    scanned = EncoderDecoderModel(preset("umt5_tiny", vocab_size=VOCAB))
    assert scanned.step_kernels({"decoder": {}}, 1) == "xla"


# --- attention to the cache ---------------------------------------------------------------


def _softmax_attention(query, key, value, bias):
    """The float64 reference: softmax(q . k + bias) . v per group (and per query of a group)."""
    logits = np.einsum("...d,...dl->...l", query, key) + bias
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("...l,...dl->...d", weights, value)


def _shared_softmax_attention(query, key, value, bias):
    """The reference for ``[..., queries, depth]`` queries sharing each group's keys and values."""
    return _softmax_attention(query, key[..., None, :, :], value[..., None, :, :], bias)


@requires_compiler
@pytest.mark.parametrize("groups", [(1,), (2, 3)])
@pytest.mark.parametrize("queries", [1, 4])
@pytest.mark.parametrize(("depth", "length"), [(1, 1), (8, 31), (64, 32), (16, 33), (64, 319)])
def test_cache_attention_equals_the_softmax_of_the_einsums(groups, queries, depth, length):
    assert cpu_kernels_ready()
    rng = np.random.default_rng(depth * 1000 + length + queries)
    query = rng.normal(size=(*groups, queries, depth)).astype(np.float32)
    key, value = (rng.normal(size=(*groups, depth, length)).astype(np.float32) for _ in range(2))
    # Each query sees a different prefix of the cache; the rest is masked as the model masks it.
    visible = np.arange(length) <= rng.integers(0, length, size=(*groups, queries, 1))
    bias = np.where(visible, rng.normal(size=(*groups, queries, length)), -1e10).astype(np.float32)
    want = _shared_softmax_attention(*(a.astype(np.float64) for a in (query, key, value, bias)))
    got = jax.jit(cache_attention)(query, key, value, bias)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    unbiased = jax.jit(lambda q, k, v: cache_attention(q, k, v, None))(query, key, value)
    np.testing.assert_allclose(
        unbiased, _shared_softmax_attention(query, key, value, 0.0), rtol=1e-5, atol=1e-5
    )


@requires_compiler
@pytest.mark.parametrize("per_row", [False, True])
def test_cache_step_writes_the_position_then_attends_like_xla(per_row):
    assert cpu_kernels_ready()
    rng = np.random.default_rng(7)
    batch, heads, depth, length = 3, 2, 16, 37
    query, key, value = (rng.normal(size=(batch, heads, depth)).astype(np.float32) for _ in range(3))
    cached_key, cached_value = (
        rng.normal(size=(batch, heads, depth, length)).astype(np.float32) for _ in range(2)
    )
    # Per row, or one position for all; a position past the end is clamped to the last slot.
    index = np.array([4, 36, 40] if per_row else [9], np.int32)
    at = np.minimum(np.broadcast_to(index, (batch,)), length - 1)
    visible = np.arange(length)[None, None, :] <= at[:, None, None]
    bias = np.where(visible, rng.normal(size=(batch, 1, length)), -1e10).astype(np.float32)
    want_key, want_value = cached_key.copy(), cached_value.copy()
    for row in range(batch):
        want_key[row, :, :, at[row]] = key[row]
        want_value[row, :, :, at[row]] = value[row]
    out, new_key, new_value = jax.jit(cache_step)(query, key, value, cached_key, cached_value, index, bias)
    np.testing.assert_array_equal(new_key, want_key)
    np.testing.assert_array_equal(new_value, want_value)
    want = _softmax_attention(query, want_key, want_value, np.broadcast_to(bias, (batch, heads, length)))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@requires_compiler
def test_a_decoding_loop_updates_the_cache_in_place():
    # A reshaped cache operand made XLA copy the whole cache before each "in-place" write.
    assert cpu_kernels_ready()
    batch, heads, depth, length = 2, 2, 8, 64
    cache = jnp.zeros((batch, heads, depth, length), jnp.float32)

    def loop(query, cached_key, cached_value):
        def step(i, carry):
            query, cached_key, cached_value = carry
            index = jnp.full((1,), i, jnp.int32)
            out, cached_key, cached_value = cache_step(
                query, query, query, cached_key, cached_value, index, None
            )
            return out, cached_key, cached_value

        return jax.lax.fori_loop(0, length, step, (query, cached_key, cached_value))

    compiled = (
        jax.jit(loop, donate_argnums=(1, 2)).lower(jnp.ones((batch, heads, depth)), cache, cache).compile()
    )
    # Any copy of a whole cache, in whatever shape (the reshaped one was [4, 8, 64]).
    shapes = re.findall(r"= f32\[([\d,]+)\]\S* copy\(", compiled.as_text())
    whole = [shape for shape in shapes if math.prod(map(int, shape.split(","))) == cache.size]
    assert not whole, whole


@requires_compiler
def test_cache_attention_of_a_wholly_masked_row_averages_like_xla():
    # A row with every position masked (padding rows) spreads its weight evenly, as softmax does.
    assert cpu_kernels_ready()
    rng = np.random.default_rng(5)
    query = rng.normal(size=(2, 1, 8)).astype(np.float32)
    key, value = (rng.normal(size=(2, 8, 20)).astype(np.float32) for _ in range(2))
    bias = np.full((2, 1, 20), -1e10, np.float32)
    got = jax.jit(cache_attention)(query, key, value, bias)
    want = jax.jit(
        lambda q, k, v, b: jnp.einsum("gql,gdl->gqd", jax.nn.softmax(jnp.einsum("gqd,gdl->gql", q, k) + b), v)
    )
    np.testing.assert_allclose(got, want(query, key, value, bias), rtol=1e-5, atol=1e-5)


@requires_compiler
@pytest.mark.parametrize(("k", "n"), [(1, 1), (7, 32), (16, 33), (64, 100)])
def test_pack_kernel_on_the_cpu_kernel_equals_the_transpose(k, n):
    assert cpu_kernels_ready()
    kernel = np.random.default_rng(k * 100 + n).normal(size=(k, n)).astype(np.float32)
    packed = np.asarray(jax.jit(pack_kernel)(kernel))
    blocks = -(-n // 32)
    want = np.zeros((blocks, k, 32), np.float32)
    for b in range(blocks):
        width = min(32, n - 32 * b)
        want[b, :, :width] = kernel[:, 32 * b : 32 * b + width]
    np.testing.assert_array_equal(packed, want)
    assert "t5x_pack_kernel" in jax.jit(pack_kernel).lower(kernel).as_text()


@requires_compiler
def test_attention_to_the_cache_on_the_kernels_equals_xlas():
    assert cpu_kernels_ready()
    rng = np.random.default_rng(3)
    batch, heads, depth, length = 3, 4, 16, 37
    query = rng.normal(size=(batch, 1, heads, depth)).astype(np.float32)
    key, value = (rng.normal(size=(batch, heads, depth, length)).astype(np.float32) for _ in range(2))
    visible = np.arange(length)[None, :] <= np.array([[5], [20], [36]])
    mask_bias = np.where(visible, 0.0, -1e10).astype(np.float32)[:, None, None, :]
    relative = rng.normal(size=(1, heads, 1, length)).astype(np.float32)

    def attend(bias, cpu_kernels):
        fn = jax.jit(
            lambda q, k, v, b: _attention._attend_to_cache(q, k, v, b, jnp.float32, False, None, cpu_kernels)
        )
        return np.asarray(fn(query, key, value, bias)), fn.lower(query, key, value, bias).as_text()

    for bias in (mask_bias, mask_bias + relative):
        kernels, kernels_hlo = attend(bias, cpu_kernels=True)
        xla, xla_hlo = attend(bias, cpu_kernels=False)
        assert "t5x_cache_attention" in kernels_hlo
        assert "t5x_cache" not in xla_hlo
        assert kernels.shape == (batch, 1, heads, depth)
        np.testing.assert_allclose(kernels, xla, rtol=1e-5, atol=1e-5)


@requires_compiler
@pytest.mark.parametrize("cpu_kernels", [True, False])
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("bias_rows", ["none", "example", "row"])
def test_rows_sharing_an_examples_keys_attend_as_with_a_copy_each(cpu_kernels, q_len, bias_rows):
    # Beams read their example's encoder keys and values, not a copy per beam.
    assert cpu_kernels_ready()
    rng = np.random.default_rng(11)
    batch, share, heads, depth, length = 2, 3, 4, 16, 23
    query = rng.normal(size=(batch * share, q_len, heads, depth)).astype(np.float32)
    key, value = (rng.normal(size=(batch, heads, depth, length)).astype(np.float32) for _ in range(2))
    bias = {
        "none": None,
        "example": np.where(np.arange(length) < np.array([[9], [23]]), 0.0, -1e10)[:, None, None, :],
        "row": rng.normal(size=(batch * share, heads, q_len, length)),
    }[bias_rows]
    bias = None if bias is None else bias.astype(np.float32)
    attend = functools.partial(
        _attention._attend_to_cache, dtype=jnp.float32, float32_logits=False, cpu_kernels=cpu_kernels
    )
    shared = jax.jit(attend)(query, key, value, bias)
    copies = [np.repeat(a, share, axis=0) for a in (key, value)]
    own_bias = np.repeat(bias, share, axis=0) if bias_rows == "example" else bias
    want = jax.jit(functools.partial(attend, cpu_kernels=False))(query, *copies, own_bias)
    assert shared.shape == (batch * share, q_len, heads, depth)
    np.testing.assert_allclose(shared, want, rtol=1e-5, atol=1e-5)
    kernel_used = "t5x_cache_attention" in jax.jit(attend).lower(query, key, value, bias).as_text()
    assert kernel_used == (cpu_kernels and q_len == 1)


@requires_compiler
def test_training_through_one_query_attention_stays_on_xla():
    # A one-position target makes cross-attention one query per row outside any cache, the
    # cache layout's path; only decoding steps the model runs on the CPU kernels take them
    # (they have no gradient).
    assert cpu_kernels_ready()
    model = EncoderDecoderModel(preset("t5_1_1_tiny", vocab_size=VOCAB))
    rng = np.random.default_rng(2)
    feats = {
        "encoder_input_tokens": rng.integers(2, VOCAB, size=(2, 7)).astype(np.int32),
        "decoder_input_tokens": np.zeros((2, 1), np.int32),
        "decoder_target_tokens": rng.integers(2, VOCAB, size=(2, 1)).astype(np.int32),
    }
    params = model.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in feats.items()})[
        "params"
    ]
    grads = jax.grad(lambda p: model.loss_fn(p, feats, None)[0])(params)
    assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))
    assert any(np.abs(g).max() > 0 for g in jax.tree_util.tree_leaves(grads))
