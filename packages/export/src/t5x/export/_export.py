"""``export_saved_model``: a T5X encoder-decoder as a TensorFlow SavedModel for serving."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf
from jax.experimental import jax2tf

from t5x.export import _features
from t5x.export._errors import ExportError
from t5x.export._stablehlo import serialize_for_tensorflow
from t5x.export._text import graph_tokenizer
from t5x.models import DecoderOnlyModel, EncoderDecoderModel

SIGNATURE = "serving_default"
# Upstream t5x's names: the input tensor, and the outputs of its unnamed (tuple) postprocessor.
INPUT_NAME = "text_batch"
OUTPUT_NAMES = {"predict": ("output_0", "output_1"), "score": ("output_0",)}
METADATA_FILE = "t5x_export.json"
REFERENCE_FILE = "reference_predictions.json"
MODES = ("predict", "score")


@dataclasses.dataclass(frozen=True)
class ExportedModel:
    """What ``export_saved_model`` wrote.

    Attributes:
      path: the SavedModel folder.
      mode: ``"predict"`` (text -> decoded text ``output_0``, score ``output_1``) or
        ``"score"`` (``inputs<separator>targets`` -> log-likelihood ``output_0``).
      load_imports: modules to import before ``tf.saved_model.load`` (``tensorflow_text``
        for SentencePiece), also listed in the folder's ``t5x_export.json``.
      stablehlo_version: the StableHLO version the model computation was serialized at.
      reference: ``{"inputs": [...], outputs...}`` computed in JAX for ``reference_inputs``, or None.
    """

    path: pathlib.Path
    mode: str
    load_imports: tuple[str, ...]
    stablehlo_version: str
    reference: dict[str, list[Any]] | None


def _check_lengths(task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
    lengths = dict(task_feature_lengths or {})
    for key in ("inputs", "targets"):
        value = lengths.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExportError(
                f"task_feature_lengths[{key!r}] must be a positive int, got {value!r} "
                f"(task_feature_lengths={lengths!r})"
            )
    return lengths


def _check_model(model: Any, mode: str) -> None:
    if mode not in MODES:
        raise ExportError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(model, EncoderDecoderModel | DecoderOnlyModel):
        raise ExportError(
            "an export with no serving signature possible: export supports "
            f"t5x.models.EncoderDecoderModel and DecoderOnlyModel, got {type(model).__name__}"
        )


def _prompt_batch(inputs: jax.Array, targets_length: int) -> dict[str, jax.Array]:
    """A decoder-only model's prediction batch, as the prefix-LM converter lays it out.

    ``inputs`` are the padded prompt ids; the sequence is ``0, prompt, room for
    targets`` and ``decoder_causal_attention`` covers the prompt plus one position.
    """
    rows, width = inputs.shape
    prompt = jnp.sum(inputs != 0, axis=1)
    tokens = jnp.concatenate(
        [jnp.zeros((rows, 1), jnp.int32), inputs, jnp.zeros((rows, targets_length - 1), jnp.int32)], axis=1
    )
    positions = jnp.arange(width + targets_length)[None, :]
    return {
        "decoder_input_tokens": tokens,
        "decoder_causal_attention": (positions < prompt[:, None] + 1).astype(jnp.int32),
    }


def _scoring_batch(inputs: jax.Array, targets: jax.Array) -> dict[str, jax.Array]:
    """A decoder-only model's scoring batch: prompt and targets packed into one sequence.

    Only the target positions carry loss weight, so the score is the targets'
    log-likelihood given the prompt, as for the encoder-decoder.
    """
    width, targets_width = inputs.shape[1], targets.shape[1]
    prompt = jnp.sum(inputs != 0, axis=1)[:, None]
    positions = jnp.arange(width + targets_width)[None, :]
    from_inputs = inputs[:, jnp.minimum(jnp.arange(width + targets_width), width - 1)]
    offset = positions - prompt
    from_targets = jnp.take_along_axis(targets, jnp.clip(offset, 0, targets_width - 1), axis=1)
    sequence = jnp.where(positions < prompt, from_inputs, jnp.where(offset < targets_width, from_targets, 0))
    return {
        "decoder_target_tokens": sequence,
        "decoder_input_tokens": jnp.pad(sequence[:, :-1], ((0, 0), (1, 0))),
        "decoder_causal_attention": (positions < prompt + 1).astype(jnp.int32),
        "decoder_loss_weights": ((positions >= prompt) & (sequence > 0)).astype(jnp.int32),
    }


@contextlib.contextmanager
def _xla_decoding(model: Any) -> Iterator[None]:
    """The model's decode steps as plain XLA ops: its CPU kernels are custom calls a SavedModel lacks."""
    saved = model.cpu_kernels
    model.cpu_kernels = False
    try:
        yield
    finally:
        model.cpu_kernels = saved


def _tf_params(params: Any, as_variables: bool) -> Any:
    def leaf(path: Any, value: Any) -> Any:
        array = np.asarray(value)
        if not as_variables:
            return tf.constant(array)
        name = re.sub(r"[^A-Za-z0-9_.]+", "_", jax.tree_util.keystr(path)).strip("_")
        return tf.Variable(array, trainable=False, name=name or "param")

    return jax.tree_util.tree_map_with_path(leaf, params)


def _predict_fn(
    model: Any,
    targets_length: int,
    decoder_params: Mapping[str, Any] | None,
    num_decodes: int,
    seed: int,
    return_all_decodes: bool = False,
):
    def predict(params: Any, encoder_input_tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        if isinstance(model, DecoderOnlyModel):
            batch = _prompt_batch(encoder_input_tokens, targets_length)
        else:
            batch = {
                "encoder_input_tokens": encoder_input_tokens,
                "decoder_input_tokens": jnp.zeros((encoder_input_tokens.shape[0], targets_length), jnp.int32),
            }
        decodes, aux = model.predict_batch_with_aux(
            params,
            batch,
            rng=jax.random.PRNGKey(seed),
            decoder_params=decoder_params,
            num_decodes=num_decodes,
            return_all_decodes=return_all_decodes,
        )
        return decodes.astype(jnp.int32), aux["scores"].astype(jnp.float32)

    return predict


def _score_fn(model: Any):
    def score(params: Any, encoder_input_tokens: jax.Array, decoder_target_tokens: jax.Array) -> jax.Array:
        if isinstance(model, DecoderOnlyModel):
            return model.score_batch(
                params, _scoring_batch(encoder_input_tokens, decoder_target_tokens)
            ).astype(jnp.float32)
        batch = {
            "encoder_input_tokens": encoder_input_tokens,
            "decoder_input_tokens": jnp.pad(decoder_target_tokens[:, :-1], ((0, 0), (1, 0))),
            "decoder_target_tokens": decoder_target_tokens,
            "decoder_loss_weights": (decoder_target_tokens > 0).astype(jnp.int32),
        }
        return model.score_batch(params, batch).astype(jnp.float32)

    return score


class _ServingModule(tf.Module):
    """Holds the parameters and tokenizer resources the serving function uses."""


def export_saved_model(
    model: Any,
    params: Any,
    output_dir: str | pathlib.Path,
    *,
    task_feature_lengths: Mapping[str, int],
    mode: str = "predict",
    batch_size: int | None = None,
    input_vocabulary: Any = None,
    output_vocabulary: Any = None,
    inputs_add_eos: bool = True,
    targets_add_eos: bool = True,
    decoder_params: Mapping[str, Any] | None = None,
    num_decodes: int = 1,
    return_all_decodes: bool = False,
    seed: int = 0,
    split_separator: str = "\t",
    params_as_variables: bool = True,
    reference_inputs: Sequence[str] = (),
) -> ExportedModel:
    """Writes ``model`` with ``params`` as a SavedModel whose ``serving_default`` takes raw text.

    The signature's input ``text_batch`` is a ``tf.string [batch]`` tensor (``batch_size``
    None: any batch size). In ``predict`` mode it returns ``output_0`` (decoded text,
    ``tf.string [batch]``) and ``output_1`` (the decoder's scores, ``float32 [batch]``); the
    whole decode loop (the model's ``decode_fn``: greedy, temperature sampling or beam
    search, with ``decoder_params`` and ``num_decodes``) runs inside the graph. In ``score``
    mode each text is ``inputs<split_separator>targets`` and ``output_0`` is the targets'
    log-likelihood. Tokenization and detokenization run in the graph too.

    The model computation goes through ``jax.experimental.jax2tf`` (native serialization:
    an ``XlaCallModule`` op holding StableHLO), so the SavedModel runs in TensorFlow with no
    JAX installed. Parameters are saved as TF variables (``params_as_variables``, as
    upstream t5x does) or folded into the graph as constants.

    Args:
      model: a ``t5x.models.EncoderDecoderModel`` or ``DecoderOnlyModel`` (its prompt is
        the text, laid out as the prefix-LM feature converter does; decodes continue it).
      params: its parameter tree (e.g. from a checkpoint).
      output_dir: the SavedModel folder to write (it must not exist or be empty).
      task_feature_lengths: ``{"inputs": N, "targets": M}``: inputs are trimmed and padded to
        N tokens, decodes are M tokens long.
      mode: ``"predict"`` or ``"score"``.
      batch_size: a fixed batch size, or None for a batch-polymorphic signature.
      input_vocabulary / output_vocabulary: default the model's.
      inputs_add_eos / targets_add_eos: append EOS after trimming, as the task's features do.
      decoder_params: extra keyword arguments of the model's ``decode_fn`` (e.g.
        ``{"temperature": 0.0}``), fixed at export time.
      num_decodes: beams or samples per example (the best one is returned).
      return_all_decodes: return every one of them instead, as upstream's export run file
        asks: ``output_0`` / ``output_1`` are then ``[batch, num_decodes]``, ordered by
        increasing score as the model returns them.
      seed: the PRNG seed of sampling decoders (the same for every request).
      split_separator: score mode's separator of inputs and targets.
      params_as_variables: TF variables (True) or graph constants (False).
      reference_inputs: texts to run through the JAX model here as well; their results go to
        ``reference_predictions.json`` in the folder, for checking a deployment.

    Returns:
      An ``ExportedModel``.

    Raises:
      ExportError: no serving signature is possible (the model type, a vocabulary without a
        graph tokenizer, a bad mode or lengths), or ``output_dir`` holds files.
    """
    _check_model(model, mode)
    lengths = _check_lengths(task_feature_lengths)
    in_vocab = (  # a decoder-only model has one vocabulary for prompt and continuation
        input_vocabulary
        if input_vocabulary is not None
        else getattr(model, "input_vocabulary", getattr(model, "vocabulary", None))
    )
    out_vocab = (
        output_vocabulary if output_vocabulary is not None else getattr(model, "output_vocabulary", None)
    )
    in_tok = graph_tokenizer(in_vocab, "input")
    out_tok = graph_tokenizer(out_vocab, "output")
    out = pathlib.Path(output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"the export folder {out} exists and is not empty: choose a new folder")

    batch_dim = "b" if batch_size is None else str(int(batch_size))
    module = _ServingModule()
    module.params = _tf_params(params, params_as_variables)
    module.resources = list(in_tok.resources + out_tok.resources)
    text_spec = tf.TensorSpec([batch_size], tf.string, name=INPUT_NAME)

    if mode == "predict":
        model_tf = jax2tf.convert(
            _predict_fn(model, lengths["targets"], decoder_params, num_decodes, seed, return_all_decodes),
            polymorphic_shapes=[None, f"({batch_dim}, {lengths['inputs']})"],
            with_gradient=False,
        )

        def serve(text_batch: tf.Tensor) -> dict[str, tf.Tensor]:
            enc = _features.padded_ids_tf(in_tok, text_batch, lengths["inputs"], inputs_add_eos)
            decodes, scores = model_tf(module.params, enc)
            if return_all_decodes:  # [batch, num_decodes, length]: detokenize the rows, keep the grid
                texts = out_tok.decode(tf.reshape(decodes, [-1, lengths["targets"]]))
                return {"output_0": tf.reshape(texts, [-1, num_decodes]), "output_1": scores}
            return {"output_0": out_tok.decode(decodes), "output_1": scores}

    else:
        model_tf = jax2tf.convert(
            _score_fn(model),
            polymorphic_shapes=[
                None,
                f"({batch_dim}, {lengths['inputs']})",
                f"({batch_dim}, {lengths['targets']})",
            ],
            with_gradient=False,
        )

        def serve(text_batch: tf.Tensor) -> dict[str, tf.Tensor]:
            parts = tf.strings.split(text_batch, sep=split_separator, maxsplit=1).to_tensor(
                default_value="", shape=[None, 2]
            )
            enc = _features.padded_ids_tf(in_tok, parts[:, 0], lengths["inputs"], inputs_add_eos)
            dec = _features.padded_ids_tf(out_tok, parts[:, 1], lengths["targets"], targets_add_eos)
            return {"output_0": model_tf(module.params, enc, dec)}

    with _xla_decoding(model), serialize_for_tensorflow() as version:
        module.serve = tf.function(serve, input_signature=[text_spec], autograph=False)
        concrete = module.serve.get_concrete_function()
        tf.saved_model.save(module, str(out), signatures={SIGNATURE: concrete})

    load_imports = tuple(dict.fromkeys(in_tok.load_imports + out_tok.load_imports))
    metadata = {
        "signature": SIGNATURE,
        "mode": mode,
        "input": INPUT_NAME,
        "outputs": list(OUTPUT_NAMES[mode]),
        "all_decodes": num_decodes if mode == "predict" and return_all_decodes else None,
        "batch_size": batch_size,
        "task_feature_lengths": lengths,
        "split_separator": split_separator if mode == "score" else None,
        "load_imports": list(load_imports),
        "stablehlo_version": version,
        "params": "variables" if params_as_variables else "constants",
    }
    (out / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    reference = None
    if reference_inputs:
        reference = reference_outputs(
            model,
            params,
            list(reference_inputs),
            mode=mode,
            task_feature_lengths=lengths,
            input_vocabulary=in_vocab,
            output_vocabulary=out_vocab,
            inputs_add_eos=inputs_add_eos,
            targets_add_eos=targets_add_eos,
            decoder_params=decoder_params,
            num_decodes=num_decodes,
            return_all_decodes=return_all_decodes,
            seed=seed,
            split_separator=split_separator,
        )
        (out / REFERENCE_FILE).write_text(json.dumps(reference, indent=2, ensure_ascii=False) + "\n")
    return ExportedModel(out, mode, load_imports, version, reference)


def reference_outputs(
    model: Any,
    params: Any,
    texts: list[str],
    *,
    mode: str,
    task_feature_lengths: Mapping[str, int],
    input_vocabulary: Any,
    output_vocabulary: Any,
    inputs_add_eos: bool = True,
    targets_add_eos: bool = True,
    decoder_params: Mapping[str, Any] | None = None,
    num_decodes: int = 1,
    return_all_decodes: bool = False,
    seed: int = 0,
    split_separator: str = "\t",
) -> dict[str, list[Any]]:
    """What the serving signature should return for ``texts``, computed in JAX with the Python vocabularies."""
    lengths = _check_lengths(task_feature_lengths)
    if mode == "predict":
        enc = _features.padded_ids_np(input_vocabulary, texts, lengths["inputs"], inputs_add_eos)
        with _xla_decoding(model):
            decodes, scores = jax.jit(
                _predict_fn(model, lengths["targets"], decoder_params, num_decodes, seed, return_all_decodes)
            )(params, enc)
        decodes = np.asarray(decodes)
        rows = decodes.reshape(-1, decodes.shape[-1])
        decoded: list[Any] = [output_vocabulary.decode(row) for row in rows]
        if return_all_decodes:
            decoded = [decoded[i : i + num_decodes] for i in range(0, len(decoded), num_decodes)]
        return {"inputs": texts, "output_0": decoded, "output_1": np.asarray(scores).tolist()}
    pairs = [[*t.split(split_separator, 1), ""][:2] for t in texts]
    enc = _features.padded_ids_np(input_vocabulary, [p[0] for p in pairs], lengths["inputs"], inputs_add_eos)
    dec = _features.padded_ids_np(
        output_vocabulary, [p[1] for p in pairs], lengths["targets"], targets_add_eos
    )
    scores = jax.jit(_score_fn(model))(params, enc, dec)
    return {"inputs": texts, "output_0": np.asarray(scores).tolist()}
