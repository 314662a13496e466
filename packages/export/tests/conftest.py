"""Tiny models for the export tests, built once per session."""

import os
import pathlib

import pytest

# The models are tiny: XLA's optimising passes cost more compile time than they save.
_FAST = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST}".strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _tiny_model(vocabulary, decode_fn=None, vocab_size=None):
    import jax

    from t5x import decoding, models

    config = models.T5Config(
        vocab_size=vocab_size or vocabulary.vocab_size,
        emb_dim=16,
        num_heads=2,
        head_dim=8,
        num_encoder_layers=1,
        num_decoder_layers=1,
        mlp_dim=32,
        dropout_rate=0.0,
    )
    model = models.EncoderDecoderModel(
        config=config,
        input_vocabulary=vocabulary,
        output_vocabulary=vocabulary,
        decode_fn=decode_fn or decoding.temperature_sample,
    )
    shapes = {k: (1, 8) for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")}
    params = model.get_initial_variables(jax.random.PRNGKey(1), shapes)["params"]
    return model, params


@pytest.fixture(scope="session")
def tiny_model():
    """Builds a 1 + 1 layer, width-16 encoder-decoder (and its random parameters) for a vocabulary."""
    return _tiny_model


@pytest.fixture(scope="session")
def byte_model():
    from t5x.vocabularies import ByteVocabulary

    return _tiny_model(ByteVocabulary(extra_ids=5))


@pytest.fixture(scope="session")
def spm_vocabulary(tmp_path_factory):
    """A tiny SentencePiece vocabulary (T5 layout: pad 0, eos 1, unk 2, 3 sentinels), trained here."""
    import sentencepiece as spm

    from t5x.vocabularies import SentencePieceVocabulary

    folder = tmp_path_factory.mktemp("spm")
    corpus = folder / "corpus.txt"
    words = "the quick brown fox jumps over a lazy dog while seven small birds sing near the river".split()
    corpus.write_text(
        "\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(9)) for i in range(300))
    )
    prefix = folder / "tiny"
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), vocab_size=40, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
    )  # fmt: skip
    return SentencePieceVocabulary(pathlib.Path(f"{prefix}.model"), extra_ids=3)
