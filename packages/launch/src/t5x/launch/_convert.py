"""``t5x-launch convert``: T5X, Hugging Face and Mesh TensorFlow checkpoints, each way that makes sense.

Every source is read into one in-between form (a T5X state dict, the network's
:class:`~t5x.models.T5Config` when known, and the vocabulary when known) and
written from there, so any readable format reaches any writable one:

* ``t5x``: read and written (legacy T5X format; upstream's Orbax layout is read);
* ``hf``: a ``transformers`` T5 / mT5 / UMT5 / ByT5 folder, read and written
  (safetensors only);
* ``mtf``: Mesh TensorFlow / TF T5 ``model.ckpt-N``, read only.

A T5X target also gets ``model.gin`` (the model config ``t5x-launch`` jobs take with
``--gin_file``); a Hugging Face target also gets the tokenizer files.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import numpy as np

from t5x.launch._convert_gin import VocabularyInfo, model_gin_text, read_model_gin

FORMATS = ("hf", "t5x", "mtf")
_WRITABLE = ("hf", "t5x")
MODEL_GIN = "model.gin"


class ConvertError(ValueError):
    """A conversion cannot be done as asked (the message says why and what to change)."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One side of a conversion: ``FORMAT:PATH``."""

    format: str
    path: str


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """How to convert.

    Attributes:
      layout: ``"scanned"``, ``"unscanned"`` or ``"same"`` (T5X targets).
      dtype: cast floating parameters to ``"float32"`` / ``"bfloat16"`` (None: keep).
      vocabulary: a SentencePiece ``.model`` overriding the one the source names.
      extra_ids: sentinel count for ``vocabulary`` (None: the source's, else 100).
      gin_files: model gin files describing a T5X / MTF source (default: the
        ``model.gin`` or ``config.gin`` found beside the checkpoint).
      gin_bindings: extra gin bindings for those files.
      verify: run both sides on a random batch and compare logits.
      tolerance: the largest logit difference ``verify`` accepts.
    """

    layout: str = "same"
    dtype: str | None = None
    vocabulary: str | None = None
    extra_ids: int | None = None
    gin_files: tuple[str, ...] = ()
    gin_bindings: tuple[str, ...] = ()
    verify: bool = False
    tolerance: float = 1e-3


@dataclasses.dataclass
class Converted:
    """The in-between form of a conversion.

    Attributes:
      state: T5X state dict (``target`` params and ``state`` with ``step``).
      config: the network config, or None when unknown.
      vocabulary: the vocabulary, or None when unknown.
      notes: lines to show the user (assumptions made, things dropped).
      max_logit_difference: what ``--verify`` measured (None without it).
    """

    state: dict[str, Any]
    config: Any = None
    vocabulary: VocabularyInfo | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    max_logit_difference: float | None = None


def parse_endpoint(text: str, flag: str) -> Endpoint:
    """Splits ``FORMAT:PATH``; a bare path (or URL) means ``t5x``, as before formats existed.

    Raises:
      ConvertError: for an unknown format or an empty path.
    """
    head, sep, rest = text.partition(":")
    if not sep or rest.startswith("//") or os.sep in head or not head.isidentifier():
        fmt, path = "t5x", text
    else:
        fmt, path = head, rest
    if fmt not in FORMATS:
        raise ConvertError(
            f"{flag}: unknown format {fmt!r} in {text!r}; expected one of {', '.join(FORMATS)}"
        )
    if not path:
        raise ConvertError(f"{flag}: no path after {fmt + ':'!r}; expected {fmt}:PATH")
    return Endpoint(fmt, path)


def _cast(tree: Any, dtype: str | None) -> Any:
    if dtype is None:
        return tree
    import ml_dtypes

    target = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)

    def cast(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: cast(v) for k, v in value.items()}
        array = np.asarray(value)
        return array.astype(target) if array.dtype.kind == "f" or array.dtype.name == "bfloat16" else array

    return cast(tree)


def _is_scanned(params: Any) -> bool:
    return isinstance(params, dict) and any(
        isinstance(params.get(stack), dict) and "layers" in params[stack] for stack in ("encoder", "decoder")
    )


def _vocabulary_override(options: ConvertOptions, found: VocabularyInfo | None) -> VocabularyInfo | None:
    if options.vocabulary is not None:
        if not os.path.isfile(options.vocabulary):
            raise ConvertError(f"--vocabulary: no such SentencePiece model file: {options.vocabulary}")
        extra = options.extra_ids if options.extra_ids is not None else 100
        return VocabularyInfo("sentencepiece", os.path.abspath(options.vocabulary), extra)
    if found is not None and options.extra_ids is not None:
        return dataclasses.replace(found, extra_ids=options.extra_ids)
    return found


def _read_hf(path: str, options: ConvertOptions) -> Converted:
    from t5x.checkpointing import read_hf_folder, read_hf_tokenizer_info
    from t5x.models import hf_to_t5x_params

    hf_state, hf_config = read_hf_folder(path)
    try:
        params, config = hf_to_t5x_params(hf_state, hf_config)
    except (KeyError, ValueError) as err:
        raise ConvertError(f"hf:{path}: {err}") from None
    info = read_hf_tokenizer_info(path)
    notes = []
    if info.kind == "byte":
        # ByT5 was trained with seqio's ByteVocabulary() (no ids above the bytes); the
        # <extra_id_*> tokens ByT5Tokenizer adds (counting upwards from 259) are unused.
        vocab: VocabularyInfo | None = VocabularyInfo("byte", None, 0)
    elif info.kind == "sentencepiece":
        vocab = VocabularyInfo("sentencepiece", info.sentencepiece_model, info.extra_ids)
    else:
        vocab = None
    if vocab is None:
        notes.append(
            f"{path} has no tokenizer files: pass --vocabulary=PATH or set SENTENCEPIECE_MODEL in model.gin"
        )
    state = {"target": params, "state": {"step": np.int32(0), "param_states": {}}}
    return Converted(state, config, _vocabulary_override(options, vocab), notes)


def _model_gin_files(path: str, options: ConvertOptions) -> tuple[str, ...]:
    if options.gin_files:
        return options.gin_files
    here = pathlib.Path(path)
    folders = [here, here.parent] if here.name.startswith("checkpoint_") else [here]
    for name in (MODEL_GIN, "config.gin"):
        for folder in folders:
            if (folder / name).is_file():
                return (str(folder / name),)
    return ()


def _config_and_vocab(path: str, params: Any, options: ConvertOptions, notes: list[str]) -> tuple[Any, Any]:
    """The source's config (from gin, else inferred from shapes) and vocabulary."""
    from t5x.models import t5_config_from_params

    files = _model_gin_files(path, options)
    if files:
        try:
            config, vocab = read_model_gin(files, options.gin_bindings)
        except ValueError as err:
            if options.gin_files or not files[0].endswith("config.gin"):
                raise
            # A run's operative config.gin need not rebuild MODEL on its own: use the shapes.
            notes.append(f"{files[0]} does not rebuild the model ({str(err).splitlines()[0]})")
        else:
            notes.append(f"model config from {', '.join(files)}")
            return config, vocab
    from t5x.checkpointing import unscan_layers

    scanned = _is_scanned(params)
    config = t5_config_from_params(unscan_layers(params) if scanned else params)
    config = dataclasses.replace(config, scan_layers=scanned)
    notes.append(
        f"no model gin file found beside {path}: config inferred from parameter shapes "
        f"(mlp_activations={config.mlp_activations}, max_distance={config.max_distance}; "
        "pass --gin_file=MODEL.gin to be exact)"
    )
    return config, None


def _read_t5x(path: str, options: ConvertOptions) -> Converted:
    from t5x.checkpointing import load_t5x_checkpoint

    state = load_t5x_checkpoint(path)
    notes: list[str] = []
    try:
        config, vocab = _config_and_vocab(path, state["target"], options, notes)
    except ValueError as err:
        if _model_gin_files(path, options):
            raise  # a gin file that does not work: its error is the useful one
        # Not a T5 encoder-decoder (a decoder-only tree, say): copies, casts and generic
        # re-layouts still work; a Hugging Face target or --verify will ask for --gin_file.
        return Converted(state, None, _vocabulary_override(options, None), [f"no model config: {err}"])
    return Converted(state, config, _vocabulary_override(options, vocab), notes)


def _read_mtf(path: str, options: ConvertOptions) -> Converted:
    from t5x.checkpointing import read_mtf_checkpoint
    from t5x.models import mtf_to_t5x_state, t5_config_from_params

    try:
        state = mtf_to_t5x_state(read_mtf_checkpoint(path))
    except ValueError as err:
        raise ConvertError(f"mtf:{path}: {err}") from None
    notes: list[str] = []
    if options.gin_files:
        config, vocab = read_model_gin(options.gin_files, options.gin_bindings)
    else:
        config, vocab = t5_config_from_params(state["target"]), None
        notes.append(
            f"config inferred from parameter shapes (mlp_activations={config.mlp_activations}, "
            f"max_distance={config.max_distance}; pass --gin_file=MODEL.gin to be exact)"
        )
    return Converted(state, config, _vocabulary_override(options, vocab), notes)


def _relayout(converted: Converted, layout: str) -> None:
    """Scans or unscans the parameters in place (optimizer slots are dropped when they move)."""
    params = converted.state["target"]
    scanned = _is_scanned(params)
    if layout == "same" or (layout == "scanned") == scanned:
        return
    from t5x.checkpointing import scan_layers, unscan_layers
    from t5x.models import scan_params, unscan_params

    config = converted.config
    if config is not None:
        unscanned_config = dataclasses.replace(config, scan_layers=False)
        scanned_config = dataclasses.replace(config, scan_layers=True)
        if layout == "scanned":
            params = scan_params(params, scanned_config)
        else:
            params = unscan_params(params, scanned_config)
        converted.config = scanned_config if layout == "scanned" else unscanned_config
    else:
        params = scan_layers(params) if layout == "scanned" else unscan_layers(params)
    converted.state = dict(converted.state, target=params)
    slots = converted.state.get("state", {}).get("param_states")
    if slots:
        # Factored Adafactor slots lose the layers axis, so they cannot be re-stacked.
        converted.state["state"] = dict(converted.state["state"], param_states={})
        converted.notes.append("optimizer slots dropped: they do not follow a layer-layout change")


def _write_t5x(path: str, converted: Converted) -> list[str]:
    from t5x.checkpointing import save_t5x_checkpoint

    step = int(np.asarray(converted.state.get("state", {}).get("step", 0)))
    state = dict(converted.state)
    state["state"] = dict(state.get("state", {}), step=np.int32(step))
    written = [save_t5x_checkpoint(path, step, state)]
    if converted.config is not None:
        vocab = converted.vocabulary
        if vocab is not None and vocab.kind == "sentencepiece" and vocab.path is not None:
            import shutil

            local = os.path.join(path, "spiece.model")
            if os.path.abspath(vocab.path) != os.path.abspath(local):
                shutil.copyfile(vocab.path, local)
            vocab = dataclasses.replace(vocab, path=os.path.abspath(local))
            written.append(local)
        gin_path = os.path.join(path, MODEL_GIN)
        with open(gin_path, "w", encoding="utf-8") as f:
            f.write(model_gin_text(converted.config, vocab))
        written.append(gin_path)
    return written


def _write_hf(path: str, converted: Converted, dtype: str | None) -> list[str]:
    from t5x.checkpointing import write_hf_folder, write_hf_tokenizer
    from t5x.models import T5Config, t5x_to_hf_state

    config = converted.config
    if not isinstance(config, T5Config):
        raise ConvertError(
            "writing a Hugging Face folder needs the T5 model config: pass --gin_file=MODEL.gin "
            f"(got {type(config).__name__})"
        )
    try:
        hf_state, hf_config = t5x_to_hf_state(converted.state["target"], config)
    except (KeyError, ValueError) as err:
        raise ConvertError(f"cannot express the checkpoint in Hugging Face T5: {err}") from None
    write_hf_folder(path, _cast(hf_state, dtype), hf_config)
    written = [os.path.join(path, "model.safetensors"), os.path.join(path, "config.json")]
    vocab = converted.vocabulary
    if vocab is None:
        converted.notes.append("no vocabulary known: tokenizer files not written (pass --vocabulary=PATH)")
    else:
        spm = vocab.path if vocab.kind == "sentencepiece" else None
        if spm is None and vocab.extra_ids > 1:
            converted.notes.append(
                f"ByT5Tokenizer numbers its {vocab.extra_ids} <extra_id_*> tokens upwards from 259; "
                "t5x's ByteVocabulary numbers sentinels downwards from the top: only plain text encodes alike"
            )
        written += [
            os.path.join(path, n)
            for n in write_hf_tokenizer(path, sentencepiece_model=spm, extra_ids=vocab.extra_ids)
        ]
        if spm is not None:
            written += _add_fast_tokenizer(path, converted.notes)
    return written


def _add_fast_tokenizer(path: str, notes: list[str]) -> list[str]:
    """Adds ``tokenizer.json`` when ``transformers`` is installed.

    ``transformers`` 5 builds some families' tokenizers (UMT5's) only from that
    file; it derives it from ``spiece.model`` exactly, so we let it write it.
    """
    from t5x.launch._convert_verify import has_transformers, run_transformers

    if not has_transformers():
        notes.append(
            "tokenizer.json not written (needs transformers); AutoTokenizer builds T5 and mT5 tokenizers "
            "from spiece.model, UMT5 ones need tokenizer.json"
        )
        return []
    run_transformers("tokenizer", path)
    return [os.path.join(path, "tokenizer.json")]


_READERS = {"hf": _read_hf, "t5x": _read_t5x, "mtf": _read_mtf}


def read_source(source: Endpoint, options: ConvertOptions) -> Converted:
    """Reads ``source`` into the in-between form (no layout or dtype change)."""
    if not os.path.exists(source.path) and not (
        source.format == "mtf" and os.path.exists(source.path + ".index")
    ):
        raise FileNotFoundError(f"--from: {source.format}:{source.path}: no such file or folder")
    return _READERS[source.format](source.path, options)


def convert(source: Endpoint, target: Endpoint, options: ConvertOptions) -> tuple[Converted, list[str]]:
    """Converts ``source`` into ``target``.

    Args:
      source: what to read.
      target: what to write (``hf`` or ``t5x``).
      options: layout, dtype, vocabulary and model-config choices.

    Returns:
      ``(converted, written)``: the in-between form that was written and the
      paths written.

    Raises:
      ConvertError: for a format pair or option that cannot work (says which).
      FileNotFoundError: the source does not exist.
    """
    if target.format not in _WRITABLE:
        raise ConvertError(f"--to: {target.format!r} is read-only; write one of {', '.join(_WRITABLE)}")
    if target.format == "hf" and options.layout == "scanned":
        raise ConvertError(
            "--layout=scanned does not apply to Hugging Face folders (always one block per layer)"
        )
    converted = read_source(source, options)
    before = _source_logits(source, converted) if options.verify else None
    converted.state = dict(converted.state, target=_cast(converted.state["target"], options.dtype))
    if target.format == "t5x":
        _relayout(converted, options.layout)
        written = _write_t5x(target.path, converted)
    else:
        written = _write_hf(target.path, converted, options.dtype)
    if before is not None:
        batch, source_logits = before
        converted.max_logit_difference = _verify(target, written, converted, batch, source_logits)
    return converted, written


def _source_logits(source: Endpoint, converted: Converted) -> tuple[dict[str, np.ndarray], np.ndarray]:
    from t5x.launch._convert_verify import random_batch, t5x_logits, transformers_logits

    if converted.config is None:
        raise ConvertError("--verify needs the model config: pass --gin_file=MODEL.gin")
    batch = random_batch(converted.config.vocab_size)
    if source.format == "hf":
        return batch, transformers_logits(source.path, batch)
    return batch, t5x_logits(converted.state["target"], converted.config, batch)


def _verify(
    target: Endpoint,
    written: list[str],
    converted: Converted,
    batch: dict[str, np.ndarray],
    source_logits: np.ndarray,
) -> float:
    """The largest logit difference between the source and what was written (read back)."""
    from t5x.launch._convert_verify import max_logit_difference, t5x_logits, transformers_logits

    if target.format == "hf":
        target_logits = transformers_logits(target.path, batch)
    else:
        from t5x.checkpointing import load_t5x_checkpoint

        params = load_t5x_checkpoint(written[0])["target"]
        target_logits = t5x_logits(params, converted.config, batch)
    return max_logit_difference(source_logits, target_logits)
