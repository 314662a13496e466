"""Hugging Face T5-family conversion, both ways.

The ``transformers`` side runs in a separate interpreter named by the
``T5X_HF_PYTHON`` environment variable (one with torch + transformers); those
tests skip when it is not given. The t5x -> HF -> t5x round trip needs neither.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import jax
import numpy as np
import pytest
from flax import traverse_util

from t5x import decoding
from t5x.models import EncoderDecoderModel, T5Config
from t5x.models._hf_names import hf_to_t5x_params, t5x_to_hf_state

_HF_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    import transformers

    mode, folder, batch_path, out_path = sys.argv[1:5]
    torch.manual_seed(0)
    if mode == "build":
        kwargs = json.loads(sys.argv[5])
        arch = kwargs.pop("arch", "T5")
        cfg = getattr(transformers, arch + "Config")(**kwargs)
        model = getattr(transformers, arch + "ForConditionalGeneration")(cfg)
        with torch.no_grad():  # random norms so that a swapped scale would show
            for name, p in model.named_parameters():
                if "layer_norm" in name:
                    p.uniform_(0.5, 1.5)
        model.save_pretrained(folder, safe_serialization=True)
    else:
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder)
    model.eval()
    batch = np.load(batch_path)
    enc = torch.from_numpy(batch["encoder_input_tokens"]).long()
    dec = torch.from_numpy(batch["decoder_input_tokens"]).long()
    with torch.no_grad():
        logits = model(input_ids=enc, attention_mask=(enc > 0).long(), decoder_input_ids=dec).logits
        greedy = model.generate(
            input_ids=enc, attention_mask=(enc > 0).long(), do_sample=False, num_beams=1,
            max_new_tokens=dec.shape[1], min_new_tokens=0, decoder_start_token_id=0,
            # transformers 5 sizes its KV cache by num_layers, which breaks when the
            # decoder is deeper than the encoder.
            use_cache=False,
        )
    np.save(out_path, logits.float().numpy())
    np.save(out_path + ".greedy.npy", greedy[:, 1:].numpy())
    """
)

_FAMILIES = {
    # T5.1.1 / Flan-T5: gated GELU, unscaled head.
    "t5_1_1": {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
    # T5.1.0: ReLU, tied head scaled by d_model**-0.5.
    "t5_1_0": {"feed_forward_proj": "relu", "tie_word_embeddings": True},
    # UMT5: gated GELU with one relative-position table per layer.
    "umt5": {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "arch": "UMT5"},
}


def _tiny_config(**overrides) -> T5Config:
    base = dict(
        vocab_size=40,
        emb_dim=16,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=3,
        head_dim=4,
        mlp_dim=24,
        dropout_rate=0.0,
        num_buckets=8,
        max_distance=16,
    )
    base.update(overrides)
    return T5Config(**base)


def _batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    enc = rng.integers(2, 40, size=(2, 9)).astype(np.int32)
    enc[1, 6:] = 0  # padding
    targets = rng.integers(2, 40, size=(2, 6)).astype(np.int32)
    inputs = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": enc,
        "decoder_input_tokens": inputs,
        "decoder_target_tokens": targets,
        "decoder_loss_weights": np.ones_like(targets, np.float32),
    }


def _init(config: T5Config, seed: int = 0):
    model = EncoderDecoderModel(config)
    batch = _batch()
    shapes = {k: v.shape for k, v in batch.items()}
    types = {k: v.dtype for k, v in batch.items()}
    params = model.get_initial_variables(jax.random.PRNGKey(seed), shapes, types)["params"]
    return model, jax.tree_util.tree_map(np.asarray, params)


def _flat(tree):
    return {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(dict(tree)).items()}


@pytest.mark.parametrize(
    "overrides",
    [
        {"mlp_activations": ("gelu", "linear")},
        {"mlp_activations": ("relu",), "logits_via_embedding": True},
        {"mlp_activations": ("gelu", "linear"), "per_layer_relpos_bias": True},
    ],
    ids=["gated_untied", "relu_tied", "umt5"],
)
def test_t5x_hf_t5x_round_trip_is_exact(overrides):
    config = _tiny_config(**overrides)
    _, params = _init(config)
    state, hf_config = t5x_to_hf_state(params, config)
    assert state["encoder.block.0.layer.0.SelfAttention.q.weight"].shape == (16, 16)
    assert state["decoder.block.0.layer.2.DenseReluDense.wo.weight"].shape == (16, 24)
    np.testing.assert_array_equal(
        state["encoder.block.1.layer.1.DenseReluDense.wo.weight"],
        params["encoder"]["layers_1"]["mlp"]["wo"]["kernel"].T,
    )
    back, back_config = hf_to_t5x_params(state, json.loads(json.dumps(hf_config)))
    assert back_config == config
    ours, theirs = _flat(params), _flat(back)
    assert ours.keys() == theirs.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def test_scanned_params_export_like_unscanned():
    config = _tiny_config(mlp_activations=("gelu", "linear"))
    _, params = _init(config)
    state, _ = t5x_to_hf_state(params, config)
    scanned, scanned_config = hf_to_t5x_params(state, t5x_to_hf_state(params, config)[1], scan_layers=True)
    assert scanned_config.scan_layers and "layers" in scanned["encoder"]
    state2, _ = t5x_to_hf_state(scanned, scanned_config)
    assert state.keys() == state2.keys()
    for key in state:
        np.testing.assert_array_equal(state[key], state2[key], err_msg=key)


def test_bad_inputs_name_the_problem():
    config = _tiny_config()
    _, params = _init(config)
    state, hf_config = t5x_to_hf_state(params, config)
    del state["encoder.block.1.layer.0.SelfAttention.k.weight"]
    with pytest.raises(KeyError, match="encoder.block.1.layer.0.SelfAttention.k.weight"):
        hf_to_t5x_params(state, hf_config)
    with pytest.raises(ValueError, match="feed_forward_proj"):
        hf_to_t5x_params(state, {**hf_config, "feed_forward_proj": "gated-gelu-x"})
    with pytest.raises(ValueError, match="exact erf|no t5x equivalent"):
        hf_to_t5x_params(state, {**hf_config, "feed_forward_proj": "gelu"})


def test_hf_folder_round_trip(tmp_path):
    _require_hf_io()
    from t5x.checkpointing import read_hf_folder, write_hf_folder

    config = _tiny_config(mlp_activations=("gelu", "linear"))
    _, params = _init(config)
    state, hf_config = t5x_to_hf_state(params, config)
    write_hf_folder(tmp_path / "m", state, hf_config)
    assert not list((tmp_path / "m").glob("*.bin"))
    state2, config2 = read_hf_folder(tmp_path / "m")
    assert config2 == hf_config
    assert state.keys() == state2.keys()
    for key in state:
        np.testing.assert_array_equal(state[key], state2[key], err_msg=key)
    with pytest.raises(FileNotFoundError, match="config.json"):
        read_hf_folder(tmp_path)
    # Sharded folders: an index naming the shard of each tensor.
    from safetensors.numpy import save_file

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({k: state[k] for k in keys}, str(sharded / shard))
    weight_map = {k: shard for shard, keys in halves.items() for k in keys}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (sharded / "config.json").write_text(json.dumps(hf_config))
    state3, _ = read_hf_folder(sharded)
    assert state3.keys() == state.keys()
    np.testing.assert_array_equal(state3[names[1]], state[names[1]])
    # bfloat16 checkpoints (common on the hub) read back widened to float32.
    shared = state["shared.weight"].astype(jax.numpy.bfloat16)
    write_hf_folder(tmp_path / "bf16", {"shared.weight": shared}, hf_config)
    loaded, _ = read_hf_folder(tmp_path / "bf16")
    assert loaded["shared.weight"].dtype == np.float32
    np.testing.assert_array_equal(loaded["shared.weight"], shared.astype(np.float32))


def _require_hf_io() -> None:
    pytest.importorskip("safetensors", reason="safetensors (t5x-checkpointing's hf extra) is not installed")
    pytest.importorskip("t5x.checkpointing", reason="t5x-checkpointing (folder I/O) is not installed")


def _run_hf(python: str, script: str, *args: str) -> None:
    proc = subprocess.run([python, script, *args], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"transformers subprocess failed:\n{proc.stderr[-4000:]}")


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_matches_transformers_logits_both_ways(family, tmp_path):
    python = os.environ.get("T5X_HF_PYTHON")
    if not python:
        pytest.skip("T5X_HF_PYTHON (an interpreter with torch + transformers) is not set")
    _require_hf_io()
    from t5x.checkpointing import read_hf_folder, write_hf_folder

    script = tmp_path / "hf.py"
    script.write_text(_HF_SCRIPT)
    batch = _batch()
    np.savez(tmp_path / "batch.npz", **batch)
    hf_kwargs = dict(
        vocab_size=40,
        d_model=16,
        d_kv=4,
        d_ff=24,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
        **_FAMILIES[family],
    )
    src = tmp_path / "src"
    _run_hf(
        python,
        str(script),
        "build",
        str(src),
        str(tmp_path / "batch.npz"),
        str(tmp_path / "a.npy"),
        json.dumps(hf_kwargs),
    )
    hf_logits = np.load(tmp_path / "a.npy")

    state, hf_config = read_hf_folder(src)
    params, config = hf_to_t5x_params(state, hf_config)
    assert config.per_layer_relpos_bias == (family == "umt5")
    assert config.logits_via_embedding == (family == "t5_1_0")
    assert config.mlp_activations == (("relu",) if family == "t5_1_0" else ("gelu", "linear"))
    model = EncoderDecoderModel(config, decode_fn=decoding.temperature_sample)
    logits = np.asarray(model.compute_logits(params, batch))
    assert logits.shape == hf_logits.shape == (2, 6, 40)
    assert np.std(hf_logits) > 0.1  # a model whose logits are not all alike
    np.testing.assert_allclose(logits, hf_logits, atol=1e-4, rtol=0)

    # Scores: summed target log-probabilities under the transformers logits.
    log_probs = hf_logits - np.log(np.sum(np.exp(hf_logits), axis=-1, keepdims=True))
    hf_scores = np.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1).sum((1, 2))
    np.testing.assert_allclose(np.asarray(model.score_batch(params, batch)), hf_scores, atol=1e-4, rtol=0)

    # Greedy decodes agree up to and including the first EOS.
    hf_greedy = np.load(tmp_path / "a.npy.greedy.npy")
    ours, _ = model.predict_batch_with_aux(params, batch, jax.random.PRNGKey(0), decoder_params={"topk": 1})
    ours = np.asarray(ours)
    compared = 0
    for row_ours, row_hf in zip(ours, hf_greedy, strict=True):
        row_hf = row_hf[: row_ours.shape[0]]
        stop = np.flatnonzero(row_hf == 1)
        end = int(stop[0]) + 1 if stop.size else row_hf.shape[0]
        np.testing.assert_array_equal(row_ours[:end], row_hf[:end])
        compared += end
    assert compared >= 4, f"too few greedy tokens compared: {ours} vs {hf_greedy}"

    out_state, out_config = t5x_to_hf_state(params, config)
    write_hf_folder(tmp_path / "dst", out_state, out_config)
    _run_hf(
        python,
        str(script),
        "load",
        str(tmp_path / "dst"),
        str(tmp_path / "batch.npz"),
        str(tmp_path / "b.npy"),
    )
    np.testing.assert_allclose(np.load(tmp_path / "b.npy"), hf_logits, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy.greedy.npy"), hf_greedy)


@pytest.mark.parametrize(
    "overrides",
    [{"mlp_activations": ("gelu", "linear")}, {"mlp_activations": ("relu",), "logits_via_embedding": True}],
    ids=["gated_untied", "relu_tied"],
)
def test_t5x_born_model_loads_in_transformers(overrides, tmp_path):
    python = os.environ.get("T5X_HF_PYTHON")
    if not python:
        pytest.skip("T5X_HF_PYTHON (an interpreter with torch + transformers) is not set")
    _require_hf_io()
    from t5x.checkpointing import write_hf_folder

    # An untied head differs from the embedding here, unlike transformers' own models.
    config = _tiny_config(**overrides)
    model, params = _init(config, seed=3)
    batch = _batch()
    ours = np.asarray(model.compute_logits(params, batch))
    state, hf_config = t5x_to_hf_state(params, config)
    write_hf_folder(tmp_path / "m", state, hf_config)
    script = tmp_path / "hf.py"
    script.write_text(_HF_SCRIPT)
    np.savez(tmp_path / "batch.npz", **batch)
    _run_hf(
        python, str(script), "load", str(tmp_path / "m"), str(tmp_path / "batch.npz"), str(tmp_path / "b.npy")
    )
    np.testing.assert_allclose(np.load(tmp_path / "b.npy"), ours, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("version", "tied"), [("5.24.0", False), ("4.46.3", True)])
def test_mt5_head_scaling_follows_the_transformers_version_that_saved_it(version, tied):
    # transformers 5's mT5 always ties lm_head to the embedding and never scales the
    # decoder output; transformers 4 scaled (and tied) when tie_word_embeddings was true.
    config = _tiny_config(mlp_activations=("gelu", "linear"), logits_via_embedding=True)
    _, params = _init(config)
    state, hf_config = t5x_to_hf_state(params, config)
    del state["lm_head.weight"]
    hf_config = {
        **hf_config,
        "model_type": "mt5",
        "transformers_version": version,
        "tie_word_embeddings": True,
    }
    del hf_config["scale_decoder_outputs"]
    back, back_config = hf_to_t5x_params(state, hf_config)
    assert back_config.logits_via_embedding == tied
    if not tied:
        np.testing.assert_array_equal(back["decoder"]["logits_dense"]["kernel"], state["shared.weight"].T)
