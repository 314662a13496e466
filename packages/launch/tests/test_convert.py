"""`t5x-launch convert` without PyTorch: T5X layouts, Hugging Face folders, Mesh TensorFlow checkpoints, errors."""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import numpy as np
import pytest

from t5x.checkpointing import (
    load_t5x_checkpoint,
    read_hf_folder,
    save_t5x_checkpoint,
    write_hf_folder,
    write_hf_tokenizer,
)
from t5x.launch._cli import main
from t5x.launch._convert import ConvertError, Endpoint, parse_endpoint
from t5x.launch._convert_gin import read_model_gin
from t5x.models import EncoderDecoderModel, T5Config, t5x_to_hf_state

_TINY = dict(
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


def _flat(tree, prefix=()):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, (*prefix, key)))
        else:
            out["/".join((*prefix, key))] = np.asarray(value)
    return out


def _assert_trees_equal(a, b):
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for key in fa:
        assert fa[key].shape == fb[key].shape, key
        np.testing.assert_array_equal(fa[key], fb[key], err_msg=key)


def _shapes():
    return {"encoder_input_tokens": (1, 8), "decoder_input_tokens": (1, 8), "decoder_target_tokens": (1, 8)}


@functools.cache
def _random_params(config: T5Config, seed: int = 0):
    variables = EncoderDecoderModel(config).get_initial_variables(jax.random.PRNGKey(seed), _shapes())
    return jax.tree_util.tree_map(np.asarray, variables["params"])


def _run(capsys, *argv):
    code = main(["convert", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def t5x_model_dir(tmp_path, spm_path):
    """An unscanned gated T5.1.1-style checkpoint with random weights and its model.gin."""
    config = T5Config(**_TINY, mlp_activations=("gelu", "linear"))
    params = _random_params(config)
    folder = tmp_path / "model"
    save_t5x_checkpoint(folder, 7, {"target": params, "state": {"step": np.int32(7), "param_states": {}}})
    from t5x.launch._convert_gin import VocabularyInfo, model_gin_text

    (folder / "model.gin").write_text(model_gin_text(config, VocabularyInfo("sentencepiece", spm_path, 0)))
    return folder, params, config


def test_endpoints_parse_formats_and_keep_bare_paths_as_t5x():
    assert parse_endpoint("hf:/a/b", "--from") == Endpoint("hf", "/a/b")
    assert parse_endpoint("mtf:ckpt/model.ckpt-5", "--from") == Endpoint("mtf", "ckpt/model.ckpt-5")
    assert parse_endpoint("/tmp/run/checkpoint_5", "--from") == Endpoint("t5x", "/tmp/run/checkpoint_5")
    assert parse_endpoint("gs://bucket/run", "--to") == Endpoint("t5x", "gs://bucket/run")
    with pytest.raises(ConvertError, match=r"--to: unknown format 'onnx'.*expected one of hf, t5x, mtf"):
        parse_endpoint("onnx:/x", "--to")
    with pytest.raises(ConvertError, match="no path after 'hf:'"):
        parse_endpoint("hf:", "--from")


def test_cli_errors_are_clear_and_exit_2(tmp_path, capsys):
    code, _, err = _run(capsys, "--from=safetensorz:/x", f"--to=t5x:{tmp_path / 'o'}")
    assert code == 2 and "unknown format 'safetensorz'" in err
    code, _, err = _run(capsys, f"--from=hf:{tmp_path / 'missing'}", f"--to=t5x:{tmp_path / 'o'}")
    assert code == 2 and "missing: no such file or folder" in err
    code, _, err = _run(capsys, f"--from=t5x:{tmp_path}", f"--to=mtf:{tmp_path / 'o'}")
    assert code == 2 and "'mtf' is read-only" in err
    code, _, err = _run(capsys, f"--from=mtf:{tmp_path}", f"--to=t5x:{tmp_path / 'o'}")
    assert code == 2 and "no model.ckpt-<step>.index" in err
    assert not (tmp_path / "o").exists()


def test_pickle_only_hf_folder_is_refused(tmp_path, capsys):
    folder = tmp_path / "pt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5"}))
    marker = tmp_path / "ran"
    # Never unpickled: if it were, this file would appear.
    (folder / "pytorch_model.bin").write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    code, _, err = _run(capsys, f"--from=hf:{folder}", f"--to=t5x:{tmp_path / 'o'}")
    assert code == 2
    assert "found only ['pytorch_model.bin']" in err and "never read" in err
    assert "safe_serialization=True" in err
    assert not marker.exists()


def test_scanned_unscanned_round_trip_through_the_cli_is_exact(t5x_model_dir, tmp_path, capsys):
    folder, params, config = t5x_model_dir
    code, out, _ = _run(
        capsys, f"--from=t5x:{folder}", f"--to=t5x:{tmp_path / 'scanned'}", "--layout=scanned", "--verify"
    )
    assert code == 0, out
    assert "largest absolute logit difference 0:" in out
    scanned = load_t5x_checkpoint(tmp_path / "scanned")
    assert int(scanned["state"]["step"]) == 7
    assert scanned["target"]["encoder"]["layers"]["mlp"]["wi_0"]["kernel"].shape == (16, 2, 24)
    gin_config, vocab = read_model_gin([str(tmp_path / "scanned" / "model.gin")])
    assert gin_config.scan_layers and vocab.kind == "sentencepiece"
    code, _, _ = _run(
        capsys, f"--from={tmp_path / 'scanned'}", f"--to={tmp_path / 'back'}", "--layout=unscanned"
    )
    assert code == 0
    back = load_t5x_checkpoint(tmp_path / "back")
    _assert_trees_equal(back["target"], params)
    assert read_model_gin([str(tmp_path / "back" / "model.gin")])[0] == config


def test_dtype_cast_keeps_the_legacy_flags(t5x_model_dir, tmp_path, capsys):
    folder, params, _ = t5x_model_dir
    code, _, _ = _run(
        capsys, f"--from={folder / 'checkpoint_7'}", f"--to={tmp_path / 'bf16'}", "--dtype=bfloat16"
    )
    assert code == 0
    state = load_t5x_checkpoint(tmp_path / "bf16")
    kernel = state["target"]["decoder"]["layers_2"]["mlp"]["wo"]["kernel"]
    assert kernel.dtype.name == "bfloat16"
    np.testing.assert_array_equal(
        kernel, params["decoder"]["layers_2"]["mlp"]["wo"]["kernel"].astype(kernel.dtype)
    )


@pytest.mark.parametrize("family", ["gated_untied", "relu_tied", "umt5"])
def test_hf_folder_round_trip_through_the_cli_is_exact(family, tmp_path, capsys, spm_path):
    overrides = {
        "gated_untied": {"mlp_activations": ("gelu", "linear")},
        "relu_tied": {"mlp_activations": ("relu",), "logits_via_embedding": True},
        "umt5": {"mlp_activations": ("gelu", "linear"), "per_layer_relpos_bias": True},
    }[family]
    config = T5Config(**_TINY, **overrides)
    params = _random_params(config, seed=1)
    hf_state, hf_config = t5x_to_hf_state(params, config)
    write_hf_folder(tmp_path / "hf", hf_state, hf_config)
    write_hf_tokenizer(tmp_path / "hf", sentencepiece_model=spm_path, extra_ids=3)

    code, out, _ = _run(capsys, f"--from=hf:{tmp_path / 'hf'}", f"--to=t5x:{tmp_path / 't5x'}")
    assert code == 0, out
    state = load_t5x_checkpoint(tmp_path / "t5x")
    _assert_trees_equal(state["target"], params)
    gin_config, vocab = read_model_gin([str(tmp_path / "t5x" / "model.gin")])
    assert gin_config == config
    assert vocab.kind == "sentencepiece" and vocab.extra_ids == 3
    assert pathlib.Path(vocab.path).read_bytes() == pathlib.Path(spm_path).read_bytes()

    code, out, _ = _run(capsys, f"--from=t5x:{tmp_path / 't5x'}", f"--to=hf:{tmp_path / 'hf2'}")
    assert code == 0, out
    state2, config2 = read_hf_folder(tmp_path / "hf2")
    assert config2 == json.loads(json.dumps(hf_config))
    assert state2.keys() == hf_state.keys()
    for name in hf_state:
        np.testing.assert_array_equal(state2[name], hf_state[name], err_msg=name)
    tokenizer_config = json.loads((tmp_path / "hf2" / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "T5Tokenizer" and tokenizer_config["extra_ids"] == 3
    # transformers (when installed) re-saves the config under its own key names.
    sentinels = tokenizer_config.get("additional_special_tokens") or tokenizer_config["extra_special_tokens"]
    assert sentinels == ["<extra_id_0>", "<extra_id_1>", "<extra_id_2>"]
    assert (tmp_path / "hf2" / "spiece.model").read_bytes() == pathlib.Path(spm_path).read_bytes()


def test_hf_export_without_a_model_config_says_what_to_pass(tmp_path, capsys):
    config = T5Config(**_TINY, mlp_activations=("gelu", "linear"))
    params = _random_params(config)
    save_t5x_checkpoint(tmp_path / "m", 1, {"target": params, "state": {"step": np.int32(1)}})
    # No model.gin: shapes give the config (gated -> GELU assumed), and the note says so.
    code, out, err = _run(capsys, f"--from={tmp_path / 'm'}", f"--to=hf:{tmp_path / 'hf'}")
    assert code == 0, err
    assert "config inferred from parameter shapes" in out and "--gin_file" in out
    assert "tokenizer files not written (pass --vocabulary=PATH)" in out
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["feed_forward_proj"] == "gated-gelu"


def test_byte_vocabulary_exports_a_byt5_tokenizer(tmp_path, capsys):
    config = T5Config(**{**_TINY, "vocab_size": 384}, mlp_activations=("gelu", "linear"))
    params = _random_params(config)
    hf_state, hf_config = t5x_to_hf_state(params, config)
    write_hf_folder(tmp_path / "hf", hf_state, hf_config)
    write_hf_tokenizer(tmp_path / "hf", extra_ids=125)
    code, _, _ = _run(capsys, f"--from=hf:{tmp_path / 'hf'}", f"--to=t5x:{tmp_path / 't5x'}")
    assert code == 0
    _, vocab = read_model_gin([str(tmp_path / "t5x" / "model.gin")])
    assert (vocab.kind, vocab.extra_ids) == ("byte", 0)  # ByT5 proper has no sentinels above the bytes
    code, _, _ = _run(capsys, f"--from={tmp_path / 't5x'}", f"--to=hf:{tmp_path / 'hf2'}")
    assert code == 0
    tokenizer_config = json.loads((tmp_path / "hf2" / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "ByT5Tokenizer" and tokenizer_config["extra_ids"] == 0
    assert not (tmp_path / "hf2" / "spiece.model").exists()


def test_scanned_checkpoint_without_gin_exports_like_the_unscanned_one(t5x_model_dir, tmp_path, capsys):
    folder, params, config = t5x_model_dir
    code, _, _ = _run(capsys, f"--from={folder}", f"--to={tmp_path / 'scanned'}", "--layout=scanned")
    assert code == 0
    (tmp_path / "scanned" / "model.gin").unlink()  # only the shapes are left to go by
    code, out, err = _run(capsys, f"--from={tmp_path / 'scanned'}", f"--to=hf:{tmp_path / 'hf'}")
    assert code == 0, err
    assert "config inferred from parameter shapes" in out
    exported, _ = read_hf_folder(tmp_path / "hf")
    expected, _ = t5x_to_hf_state(params, config)
    assert exported.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(exported[name], expected[name], err_msg=name)
