"""`t5x-launch convert` against `transformers` on PyTorch (the optional `hf_interop` session).

Tiny random models of every T5 family are built with `transformers`, saved as
safetensors, converted to T5X and back, and must agree with `transformers` on
logits, per-sequence scores and greedy decodes to 1e-4 in float32. Skipped (with
the reason) where PyTorch or `transformers` is not installed.
"""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the hf_interop session installs it)")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (hf_interop session)"
)

from t5x import decoding  # noqa: E402
from t5x.checkpointing import load_t5x_checkpoint  # noqa: E402
from t5x.launch._cli import main  # noqa: E402
from t5x.launch._convert_gin import read_model_gin  # noqa: E402
from t5x.models import EncoderDecoderModel  # noqa: E402
from t5x.vocabularies import ByteVocabulary, SentencePieceVocabulary  # noqa: E402

_EXTRA_IDS = 5
_COMMON = dict(
    d_model=16,
    d_kv=4,
    d_ff=24,
    num_layers=2,
    num_decoder_layers=3,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    dropout_rate=0.0,
)
# arch, config overrides; SentencePiece families get 40 pieces + 5 sentinels, padded to 48 rows.
_FAMILIES = {
    "t5_1_0": ("T5", {"feed_forward_proj": "relu", "tie_word_embeddings": True, "vocab_size": 48}),
    "t5_1_1": ("T5", {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "vocab_size": 48}),
    "mt5": ("MT5", {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "vocab_size": 48}),
    "umt5": ("UMT5", {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "vocab_size": 48}),
    "byt5": ("T5", {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "vocab_size": 384}),
}
_TEXTS = ["the quick brown fox", "a lazy dog sings near the river bank", "seven  birds", "Zürich 42 <x>"]


def _build_hf(family: str, folder, spm_path: str) -> None:
    arch, overrides = _FAMILIES[family]
    torch.manual_seed(sorted(_FAMILIES).index(family))
    config = getattr(transformers, f"{arch}Config")(**_COMMON, **overrides)
    model = getattr(transformers, f"{arch}ForConditionalGeneration")(config)
    with torch.no_grad():  # random norms, so that a misplaced scale shows
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(folder, safe_serialization=True)
    if family == "byt5":
        transformers.ByT5Tokenizer(extra_ids=125).save_pretrained(folder)
    else:
        transformers.T5Tokenizer(vocab_file=spm_path, extra_ids=_EXTRA_IDS).save_pretrained(folder)
        # Hub folders ship the SentencePiece model beside tokenizer.json.
        shutil.copyfile(spm_path, folder / "spiece.model")


def _batch(vocab_size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    encoder = rng.integers(2, vocab_size, size=(3, 9)).astype(np.int32)
    encoder[1, 6:] = 0
    targets = rng.integers(2, vocab_size, size=(3, 7)).astype(np.int32)
    inputs = np.concatenate([np.zeros((3, 1), np.int32), targets[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": encoder,
        "decoder_input_tokens": inputs,
        "decoder_target_tokens": targets,
        "decoder_loss_weights": np.ones_like(targets, np.float32),
    }


def _hf_run(folder, batch) -> tuple[np.ndarray, np.ndarray]:
    """``(logits [b, t, vocab], greedy tokens [b, t])`` of the transformers model in ``folder``."""
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()
    encoder = torch.from_numpy(batch["encoder_input_tokens"]).long()
    mask = (encoder > 0).long()
    with torch.no_grad():
        logits = model(
            input_ids=encoder,
            attention_mask=mask,
            decoder_input_ids=torch.from_numpy(batch["decoder_input_tokens"]).long(),
        ).logits
        greedy = model.generate(
            input_ids=encoder,
            attention_mask=mask,
            do_sample=False,
            num_beams=1,
            max_new_tokens=batch["decoder_input_tokens"].shape[1],
            decoder_start_token_id=0,
            # transformers sizes its KV cache by num_layers: wrong when the decoder is deeper.
            use_cache=False,
        )
    return logits.float().numpy(), greedy[:, 1:].numpy()


def _assert_greedy_agrees(ours: np.ndarray, theirs: np.ndarray) -> None:
    compared = 0
    for row_ours, row_theirs in zip(ours, theirs, strict=True):
        row_theirs = row_theirs[: row_ours.shape[0]]
        stop = np.flatnonzero(row_theirs == 1)
        end = int(stop[0]) + 1 if stop.size else row_theirs.shape[0]
        np.testing.assert_array_equal(row_ours[:end], row_theirs[:end])
        compared += end
    assert compared >= 6, f"too few greedy tokens compared: {ours} vs {theirs}"


def _convert(capsys, *argv: str) -> str:
    code = main(["convert", *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    return captured.out


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_convert_matches_transformers_both_ways(family, tmp_path, capsys, spm_path):
    _build_hf(family, tmp_path / "src", spm_path)
    out = _convert(
        capsys,
        f"--from=hf:{tmp_path / 'src'}",
        f"--to=t5x:{tmp_path / 't5x'}",
        "--verify",
        "--tolerance=1e-4",
    )
    assert "verify: largest absolute logit difference" in out and ": ok" in out

    config, vocab_info = read_model_gin([str(tmp_path / "t5x" / "model.gin")])
    assert config.logits_via_embedding == (family == "t5_1_0")
    assert config.per_layer_relpos_bias == (family == "umt5")
    assert config.mlp_activations == (("relu",) if family == "t5_1_0" else ("gelu", "linear"))
    params = load_t5x_checkpoint(tmp_path / "t5x")["target"]
    batch = _batch(config.vocab_size)
    hf_logits, hf_greedy = _hf_run(tmp_path / "src", batch)
    assert np.std(hf_logits) > 0.1  # logits that are not all alike

    model = EncoderDecoderModel(config, decode_fn=decoding.temperature_sample)
    logits = np.asarray(model.compute_logits(params, batch))
    np.testing.assert_allclose(logits, hf_logits, atol=1e-4, rtol=0)
    log_probs = hf_logits - np.log(np.sum(np.exp(hf_logits.astype(np.float64)), axis=-1, keepdims=True))
    hf_scores = np.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1).sum((1, 2))
    np.testing.assert_allclose(np.asarray(model.score_batch(params, batch)), hf_scores, atol=1e-4, rtol=0)
    ours, _ = model.predict_batch_with_aux(params, batch, jax.random.PRNGKey(0), decoder_params={"topk": 1})
    _assert_greedy_agrees(np.asarray(ours), hf_greedy)

    # Back to transformers, scanned on the way to exercise that layout too.
    _convert(capsys, f"--from=t5x:{tmp_path / 't5x'}", f"--to=t5x:{tmp_path / 'scanned'}", "--layout=scanned")
    out = _convert(
        capsys,
        f"--from=t5x:{tmp_path / 'scanned'}",
        f"--to=hf:{tmp_path / 'dst'}",
        "--verify",
        "--tolerance=1e-4",
    )
    assert ": ok" in out
    back_logits, back_greedy = _hf_run(tmp_path / "dst", batch)
    np.testing.assert_allclose(back_logits, hf_logits, atol=1e-4, rtol=0)
    with capsys.disabled():
        print(
            f"\n[parity] {family}: t5x vs transformers {np.max(np.abs(logits - hf_logits)):.2e}, "
            f"exported vs source {np.max(np.abs(back_logits - hf_logits)):.2e}"
        )
    np.testing.assert_array_equal(back_greedy, hf_greedy)

    # The exported tokenizer loads and encodes as our vocabulary does.
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "dst")
    if family == "byt5":
        assert vocab_info.kind == "byte"
        vocabulary = ByteVocabulary(extra_ids=vocab_info.extra_ids)
    else:
        assert vocab_info.kind == "sentencepiece" and vocab_info.extra_ids == _EXTRA_IDS
        vocabulary = SentencePieceVocabulary(vocab_info.path, extra_ids=vocab_info.extra_ids)
    for text in _TEXTS:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert ids == list(vocabulary.encode(text)), text
        assert tokenizer(text).input_ids == [*ids, vocabulary.eos_id]
    if family != "byt5":  # ByT5 has no sentinels above the bytes (ByteVocabulary(), as t5x's byt5 gin)
        assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == vocabulary.vocab_size - 1
        assert (
            tokenizer.convert_tokens_to_ids(f"<extra_id_{_EXTRA_IDS - 1}>")
            == vocabulary.vocab_size - _EXTRA_IDS
        )
    else:
        assert vocabulary.extra_ids == 0


def test_verify_without_pytorch_names_what_to_install(monkeypatch, tmp_path, capsys, spm_path):
    _build_hf("t5_1_1", tmp_path / "src", spm_path)
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # as if PyTorch were not installed
    code = main(["convert", f"--from=hf:{tmp_path / 'src'}", f"--to=t5x:{tmp_path / 'o'}", "--verify"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pip install --find-links dist 't5x-launch[hf]'" in err and "torch transformers" in err
