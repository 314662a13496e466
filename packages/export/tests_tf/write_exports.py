"""Writes the SavedModels that test_load.py loads, from an environment with JAX and t5x-export.

Usage: python write_exports.py OUT_DIR

OUT_DIR/byte (ByteVocabulary, greedy) and OUT_DIR/sentencepiece (SentencePiece, beam search),
each with reference_predictions.json: the JAX model's outputs for the same texts.
"""

from __future__ import annotations

import pathlib
import sys

import jax
import sentencepiece

from t5x import decoding, models
from t5x.export import export_saved_model
from t5x.vocabularies import ByteVocabulary, SentencePieceVocabulary

TEXTS = ["sort: 3 1 2", "héllo wörld", "", "the quick brown fox jumps over the lazy dog"]
LENGTHS = {"inputs": 16, "targets": 8}


def _model(vocabulary, decode_fn):
    config = models.T5Config(
        vocab_size=vocabulary.vocab_size, emb_dim=16, num_heads=2, head_dim=8,
        num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32, dropout_rate=0.0,
    )  # fmt: skip
    model = models.EncoderDecoderModel(
        config=config, input_vocabulary=vocabulary, output_vocabulary=vocabulary, decode_fn=decode_fn
    )
    shapes = {k: (1, 8) for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")}
    return model, model.get_initial_variables(jax.random.PRNGKey(3), shapes)["params"]


def _sentencepiece(folder: pathlib.Path) -> SentencePieceVocabulary:
    words = "the quick brown fox jumps over a lazy dog while seven small birds sing".split()
    corpus = folder / "corpus.txt"
    corpus.write_text(
        "\n".join(" ".join(words[(i * 5 + j) % len(words)] for j in range(8)) for i in range(200))
    )
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "spm"), vocab_size=40, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
    )  # fmt: skip
    return SentencePieceVocabulary(folder / "spm.model", extra_ids=2)


def main(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model, params = _model(ByteVocabulary(), decoding.temperature_sample)
    export_saved_model(
        model, params, out / "byte", task_feature_lengths=LENGTHS,
        decoder_params={"temperature": 0.0}, reference_inputs=TEXTS,
    )  # fmt: skip
    model, params = _model(_sentencepiece(out), decoding.beam_search)
    export_saved_model(
        model,
        params,
        out / "sentencepiece",
        task_feature_lengths=LENGTHS,
        num_decodes=2,
        reference_inputs=TEXTS,
    )
    print(f"wrote {out / 'byte'} and {out / 'sentencepiece'}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
