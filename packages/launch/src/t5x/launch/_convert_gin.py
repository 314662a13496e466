"""The model gin file ``convert`` writes beside a T5X checkpoint, and reading a model back from gin."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class VocabularyInfo:
    """The vocabulary of a converted model.

    Attributes:
      kind: ``"sentencepiece"`` or ``"byte"``.
      path: the SentencePiece ``.model`` file (``kind == "sentencepiece"``).
      extra_ids: sentinel count.
    """

    kind: str
    path: str | None = None
    extra_ids: int = 0


_FIELDS = (
    "vocab_size",
    "emb_dim",
    "num_heads",
    "head_dim",
    "num_encoder_layers",
    "num_decoder_layers",
    "mlp_dim",
    "mlp_activations",
    "logits_via_embedding",
    "num_buckets",
    "max_distance",
    "per_layer_relpos_bias",
)


def _vocabulary_lines(vocab: VocabularyInfo | None) -> list[str]:
    if vocab is not None and vocab.kind == "byte":
        return [
            "# ByT5 reads UTF-8 bytes: no SentencePiece model.",
            "VOCABULARY = @vocabularies.ByteVocabulary()",
            f"vocabularies.ByteVocabulary.extra_ids = {vocab.extra_ids}",
        ]
    if vocab is not None and vocab.path is not None:
        model = repr(vocab.path)
        extra = vocab.extra_ids
    else:
        model = "%gin.REQUIRED  # no vocabulary was known: set --gin.SENTENCEPIECE_MODEL='/path/spiece.model'"
        extra = 100
    return [
        f"SENTENCEPIECE_MODEL = {model}",
        "VOCABULARY = @vocabularies.SentencePieceVocabulary()",
        "vocabularies.SentencePieceVocabulary.sentencepiece_model_file = %SENTENCEPIECE_MODEL",
        f"vocabularies.SentencePieceVocabulary.extra_ids = {extra}",
    ]


def model_gin_text(config: Any, vocab: VocabularyInfo | None) -> str:
    """A model gin file (macros as the shipped ``models/*.gin``) for ``config`` and ``vocab``.

    Args:
      config: the network's ``T5Config``.
      vocab: its vocabulary, or None (then ``SENTENCEPIECE_MODEL`` is required).

    Returns:
      The file's text.
    """
    lines = [
        "# Model config written by `t5x-launch convert`; use it with --gin_file=model.gin.",
        "from __gin__ import dynamic_registration",
        "from t5x import models",
        "from t5x import vocabularies",
        "",
        "DROPOUT_RATE = 0.0",
        "Z_LOSS = 1e-4",
        "LABEL_SMOOTHING = 0.0",
        "LOSS_NORMALIZING_FACTOR = None",
        "# The checkpoint's layer layout: changing it needs `t5x-launch convert --layout=...`.",
        f"SCAN_LAYERS = {bool(config.scan_layers)}",
        "",
        *_vocabulary_lines(vocab),
        "",
        "MODEL = @models.EncoderDecoderModel()",
        "models.EncoderDecoderModel:",
        "  config = @models.T5Config()",
        "  input_vocabulary = %VOCABULARY",
        "  output_vocabulary = %VOCABULARY",
        "  z_loss = %Z_LOSS",
        "  label_smoothing = %LABEL_SMOOTHING",
        "  loss_normalizing_factor = %LOSS_NORMALIZING_FACTOR",
        "models.T5Config:",
        *(f"  {name} = {getattr(config, name)!r}" for name in _FIELDS),
        "  dropout_rate = %DROPOUT_RATE",
        "  scan_layers = %SCAN_LAYERS",
    ]
    return "\n".join(lines) + "\n"


def vocabulary_info(vocabulary: Any) -> VocabularyInfo | None:
    """Describes a t5x vocabulary object (None for kinds Hugging Face T5 tokenizers cannot express)."""
    from t5x.vocabularies import ByteVocabulary, SentencePieceVocabulary

    if isinstance(vocabulary, ByteVocabulary):
        return VocabularyInfo("byte", None, vocabulary.extra_ids)
    if isinstance(vocabulary, SentencePieceVocabulary) and vocabulary.sentencepiece_model_file:
        return VocabularyInfo("sentencepiece", vocabulary.sentencepiece_model_file, vocabulary.extra_ids)
    return None


def read_model_gin(files: Sequence[str], bindings: Sequence[str] = ()) -> tuple[Any, VocabularyInfo | None]:
    """Builds the gin-configured ``MODEL`` and returns its config and output vocabulary.

    Raises:
      GinConfigError: the files do not configure an encoder-decoder ``MODEL``.
    """
    import gin

    from t5x.launch._gin_config import GinArgs, GinConfigError, check_required_macros, macro_value, parse_gin
    from t5x.models import T5Config

    parse_gin(GinArgs(tuple(files), tuple(bindings)))
    check_required_macros()
    try:
        # A run's operative config.gin binds the model's arguments in the MODEL scope.
        with gin.config_scope("MODEL"):
            model = macro_value("MODEL")
    except (ValueError, TypeError) as err:
        raise GinConfigError(f"{', '.join(files)}: building MODEL failed: {err}") from None
    if model is gin.REQUIRED:
        raise GinConfigError(f"{', '.join(files)}: the macro MODEL is not set (expected a model gin file)")
    config = getattr(model, "config", None)
    if not isinstance(config, T5Config):
        raise GinConfigError(
            f"{', '.join(files)}: MODEL must be an encoder-decoder with a T5Config, got {type(config).__name__}"
        )
    return config, vocabulary_info(getattr(model, "output_vocabulary", None))
