"""Upstream t5x's ``t5x.export_lib``: ``save`` and the names its export run files bind.

Upstream's ``t5x/configs/runs/export.gin`` configures ``export_lib.save`` with an
``ExportableModule`` class and the functions that build the serving graph's pre- and
post-processing. Here the serving graph is ``t5x.export.export_saved_model``'s: raw
text in (``text_batch``), the decode loop inside, decoded text (``output_0``) and
scores (``output_1``) out, tokenization in the graph. So those functions and the
module class are settings here: ``create_preprocessor`` / ``create_postprocessor``
return records of what they were configured with, ``ExportableModule`` records its
serving options, and ``save`` reads them all. What the exporter implements is carried
over; what cannot change the SavedModel's outputs is accepted (logged where it is set
to something other than upstream's default); anything else is refused by name with
what to do instead (:class:`UnsupportedExportOption`: exit code 2 under t5x-launch).

The layout is upstream's: ``output_dir='BASE/VERSION'`` (a whole-number VERSION)
writes the SavedModel to ``BASE_cpu/VERSION``; ``output_dir={'cpu': DIR}`` writes it
to DIR.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t5x import checkpoints, utils
from t5x.launch import ConfigurationError, load_checkpoint_params

_LOG = logging.getLogger("t5x.export_lib")

# Upstream's names of the serving signature, its input and the warm-up records' file.
SIGNATURE_NAME = "serving_default"
INPUT_TENSOR_NAME = "text_batch"
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
_MODES = ("predict", "score")


class UnsupportedExportOption(ConfigurationError):
    """An upstream export keyword or value the exporter does not implement (named in the message)."""


def _refuse(option: str, value: Any, instead: str) -> UnsupportedExportOption:
    return UnsupportedExportOption(
        f"upstream option {option}={_shown(value)} is not supported by t5x-upstream's export: {instead}"
    )


def _accepted(option: str, value: Any, why: str) -> None:
    _LOG.warning("upstream option %s=%s is accepted and has no effect here: %s", option, _shown(value), why)


def _shown(value: Any) -> str:
    """A value as a message shows it: functions and classes by their name."""
    base = _base_function(value)
    name = getattr(base, "__qualname__", None)
    if callable(base) and isinstance(name, str):
        return f"{getattr(base, '__module__', '')}.{name}".lstrip(".")
    return repr(value)


def _base_function(fn: Any) -> Any:
    """The function under gin's wrapper and ``functools.partial`` layers."""
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif callable(fn) and hasattr(fn, "__wrapped__"):
            fn = inspect.unwrap(fn)
        else:
            return fn


# ---- the pieces upstream's run file binds ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CustomInferenceMode:
    """Upstream's inference mode naming another model method; ``save`` refuses it (see there)."""

    model_fn_name: str
    fetch_output: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True)
class TextPreprocessor:
    """What ``create_preprocessor`` / ``create_decoder_preprocessor`` were configured with.

    ``save`` hands these settings to ``t5x.export.export_saved_model``, whose graph
    tokenizes the text batch itself (trim to length - 1, EOS when the feature adds
    it, zero padding); the record is not a TensorFlow function.
    """

    output_features: Mapping[str, Any] | None
    task_feature_lengths: Mapping[str, int]
    tokenized_inputs: bool = False
    input_tensor_name: str = INPUT_TENSOR_NAME
    split_separator: str | None = None
    bucket_keys: Mapping[str, Sequence[int]] | None = None
    decoder_only: bool = False


@dataclasses.dataclass(frozen=True)
class TextPostprocessor:
    """What ``create_postprocessor`` was configured with (outputs ``output_0``, ``output_1``)."""

    vocabulary: Any
    inference_mode: Any
    decode_outputs: bool = True
    output_feature_names: Sequence[str] | None = None
    add_token_length_to_output: bool = False


def create_single_tensor_input_signature(
    batch_size: int | None,
    task_feature_lengths: Mapping[str, int],
    tokenized_inputs: bool = False,
    name: str = INPUT_TENSOR_NAME,
) -> tuple[Any, ...]:
    """The serving signature's one input: ``[batch]`` strings (``[batch, inputs length]`` int32 ids
    when ``tokenized_inputs``); ``batch_size`` None takes any batch size."""
    import tensorflow as tf

    if tokenized_inputs:
        return (tf.TensorSpec([batch_size, task_feature_lengths["inputs"]], tf.int32, name=name),)
    return (tf.TensorSpec([batch_size], tf.string, name=name),)


def create_preprocessor(
    batch_size: int | None,
    output_features: Mapping[str, Any] | None,
    task_feature_lengths: Mapping[str, int],
    tokenized_inputs: bool = False,
    *,
    input_tensor_name: str = INPUT_TENSOR_NAME,
    split_separator: str | None = None,
    bucket_keys: Mapping[str, Sequence[int]] | None = None,
) -> tuple[TextPreprocessor, tuple[Any, ...]]:
    """An encoder-decoder's text features, as upstream's keywords configure them.

    Returns ``(settings, input_signature)``: the settings ``save`` exports with
    (each feature's vocabulary and ``add_eos``; ``split_separator`` splits score
    mode's ``inputs<separator>targets``) and the signature's input spec.
    """
    settings = TextPreprocessor(
        output_features=output_features,
        task_feature_lengths=dict(task_feature_lengths),
        tokenized_inputs=tokenized_inputs,
        input_tensor_name=input_tensor_name,
        split_separator=split_separator,
        bucket_keys=bucket_keys,
    )
    signature = create_single_tensor_input_signature(
        batch_size, task_feature_lengths, tokenized_inputs, input_tensor_name
    )
    return settings, signature


def create_decoder_preprocessor(
    output_features: Mapping[str, Any] | None,
    task_feature_lengths: Mapping[str, int],
    tokenized_inputs: bool = False,
) -> TextPreprocessor:
    """A decoder-only model's prompt features (upstream's older call: no batch size, no signature).

    The prompt is the input text without EOS, as upstream's decoder
    preprocessor leaves it (it masks an appended EOS out of the prompt).
    """
    return TextPreprocessor(
        output_features=output_features,
        task_feature_lengths=dict(task_feature_lengths),
        tokenized_inputs=tokenized_inputs,
        decoder_only=True,
    )


def create_preprocessor_from_task(
    batch_size: int | None = None,
    output_features: Mapping[str, Any] | None = None,
    task_feature_lengths: Mapping[str, int] | None = None,
    tokenized_inputs: bool = False,
    *,
    model: Any = None,
    task_name: str = "",
    serialized_examples: bool = True,
    run_precache: bool = False,
    input_tensor_name: str = INPUT_TENSOR_NAME,
) -> Any:
    """Upstream's serving graph that runs a Task's preprocessors; refused (see the message)."""
    del batch_size, output_features, task_feature_lengths, tokenized_inputs, model
    del serialized_examples, run_precache, input_tensor_name
    raise _refuse_task_preprocessor(task_name)


def _refuse_task_preprocessor(task_name: Any) -> UnsupportedExportOption:
    return _refuse(
        "create_preprocessor_fn",
        create_preprocessor_from_task,
        f"the serving signature takes raw text ({INPUT_TENSOR_NAME}) and tokenizes it in the graph; a "
        f"task's preprocessors ({task_name or 'MIXTURE_OR_TASK_NAME'}) on serialized tf.Examples do not run "
        "in it. Export with t5x/configs/runs/export.gin (export_lib.create_preprocessor; "
        "export_lib.save.mixture_or_task_name takes the task's features) and send the text the task's "
        "preprocessors produce",
    )


def create_postprocessor(
    vocab: Any,
    inference_mode: Any,
    decode_outputs: bool = True,
    output_feature_names: Sequence[str] | None = None,
    add_token_length_to_output: bool = False,
) -> TextPostprocessor:
    """The outputs' settings, as upstream's keywords configure them (``save`` checks them)."""
    return TextPostprocessor(
        vocabulary=vocab,
        inference_mode=inference_mode,
        decode_outputs=decode_outputs,
        output_feature_names=list(output_feature_names) if output_feature_names is not None else None,
        add_token_length_to_output=bool(add_token_length_to_output),
    )


class ExportableModule:
    """The SavedModel's serving options, as upstream's ``ExportableModule`` takes them.

    Upstream's class is the ``tf.Module`` it saves; here ``t5x.export`` builds the
    module, and this records the options ``save`` checks: ``use_batch_function``
    (TF Serving's in-graph batching) is refused, the batching sizes only choose the
    warm-up records' batch sizes, and ``jit_compile`` / ``use_gpu`` cannot change
    the outputs (the model program is an XLA program either way).
    """

    def __init__(
        self,
        preproc_tf_fn: Any = None,
        model_tf_fn: Any = None,
        postproc_tf_fn: Any = None,
        params: Any = None,
        batch_size: int | None = None,
        num_batch_threads: int = 8,
        max_enqueued_batches: int = 64,
        batch_timeout_micros: int = 1_000_000,
        max_batch_size: int | None = None,
        allowed_batch_sizes: Sequence[int] | None = None,
        jit_compile: bool = True,
        use_batch_function: bool = False,
        use_gpu: bool = False,
        enable_large_batch_splitting: bool = True,
    ) -> None:
        self.preproc_tf_fn = preproc_tf_fn
        self.model_tf_fn = model_tf_fn
        self.postproc_tf_fn = postproc_tf_fn
        self.params = params
        self.batch_size = batch_size
        self.num_batch_threads = num_batch_threads
        self.max_enqueued_batches = max_enqueued_batches
        self.batch_timeout_micros = batch_timeout_micros
        self.max_batch_size = max_batch_size
        self.allowed_batch_sizes = list(allowed_batch_sizes) if allowed_batch_sizes else None
        self.jit_compile = jit_compile
        self.use_batch_function = use_batch_function
        self.use_gpu = use_gpu
        self.enable_large_batch_splitting = enable_large_batch_splitting

    @property
    def export_batch_sizes(self) -> list[int | None]:
        """The batch sizes warm-up records are written for."""
        if self.allowed_batch_sizes:
            return list(self.allowed_batch_sizes)
        return [self.batch_size]


# ---- warm-up records ----------------------------------------------------------------------------


def generate_examples_with_sequence_lengths(
    sequence_lengths: Sequence[int], single_token_example: Any = "Q"
) -> list[list[Any]]:
    """One warm-up batch per length: ``single_token_example`` repeated that many times."""
    return [[single_token_example * length] for length in sequence_lengths]


def write_warmup_examples(
    text_batch: Sequence[Any],
    output_dir: str,
    model_name: str,
    signature_name: str = SIGNATURE_NAME,
    *,
    generate_examples_fn: Callable[[], list[Sequence[Any]]] | None = None,
    batch_sizes: Sequence[int | None],
    input_tensor_name: str = INPUT_TENSOR_NAME,
    decoder_params_spec: Any = None,
    request_to_prediction_log: Callable[..., Any] | None = None,
) -> str:
    """Writes TF Serving warm-up requests to ``output_dir/assets.extra/tf_serving_warmup_requests``.

    One ``PredictionLog`` record per warm-up batch and batch size: the batch
    repeated or cut to the size (None: as it is). ``generate_examples_fn`` gives
    the batches instead of ``text_batch``. Returns the file's path.
    """
    if decoder_params_spec is not None:
        raise _refuse(
            "write_warmup_examples.decoder_params_spec",
            decoder_params_spec,
            "the serving signature has no decoder-parameter inputs",
        )
    if request_to_prediction_log is not None:
        raise _refuse(
            "write_warmup_examples.request_to_prediction_log",
            request_to_prediction_log,
            "records are written as TF Serving PredictionLogs of predict requests",
        )
    from t5x.export import write_warmup_requests

    batches = list(generate_examples_fn()) if generate_examples_fn is not None else [list(text_batch)]
    if generate_examples_fn is not None and text_batch:
        _LOG.warning("write_warmup_examples: the batches of generate_examples_fn replace text_batch")
    path = os.path.join(output_dir, WARMUP_FILE)
    write_warmup_requests(path, batches, batch_sizes, model_name, signature_name, input_tensor_name)
    return path


# ---- save -----------------------------------------------------------------------------------


def _savedmodel_dir(output_dir: Any) -> str:
    """Where the SavedModel goes, by upstream's rule (``BASE/VERSION`` -> ``BASE_cpu/VERSION``)."""
    if isinstance(output_dir, Mapping):
        dirs = {str(k): v for k, v in output_dir.items()}
        if "cpu" in dirs:
            if "tpu" in dirs:
                _LOG.info("output_dir['tpu'] is not written: the export is the CPU (jax2tf) SavedModel")
            return os.fspath(dirs["cpu"])
        if "tpu" not in dirs:
            raise ConfigurationError(f"output_dir={dict(output_dir)!r} needs a 'cpu' or a 'tpu' entry")
        base = os.fspath(dirs["tpu"])
    elif isinstance(output_dir, str | os.PathLike):
        base = os.fspath(output_dir)
    else:
        raise ConfigurationError(f"output_dir must be a path or a {{'cpu': path}} dict, got {output_dir!r}")
    base = base.rstrip("/")
    version = os.path.basename(base)
    if not version.isdigit():
        raise ConfigurationError(
            f"output_dir={base!r} is not BASE/VERSION with a whole-number VERSION, as upstream's export "
            f"requires (the SavedModel is written to BASE_cpu/VERSION): set MODEL_OUTPUT_DIR to e.g. "
            f"{base}/1, or export_lib.save.output_dir = {{'cpu': {base!r}}} to write into that folder"
        )
    return os.path.join(os.path.dirname(base) + "_cpu", version)


def _output_features(
    output_features: Mapping[str, Any] | None, mixture_or_task_name: str | None
) -> Mapping[str, Any]:
    if mixture_or_task_name is not None and output_features is not None:
        raise ConfigurationError(
            f"give export_lib.save either output_features or mixture_or_task_name "
            f"({mixture_or_task_name!r}), not both"
        )
    if mixture_or_task_name is not None:
        from t5x import seqio

        return dict(seqio.get_mixture_or_task(mixture_or_task_name).output_features)
    if output_features is None:
        raise ConfigurationError("export_lib.save needs output_features (or mixture_or_task_name)")
    return output_features


def _feature(features: Mapping[str, Any], name: str, who: str) -> Any:
    if name not in features:
        raise ConfigurationError(
            f"{who}: output_features has no {name!r} feature (it has {sorted(features)})"
        )
    return features[name]


def _check_preprocessor_fn(create_preprocessor_fn: Any) -> None:
    base = _base_function(create_preprocessor_fn)
    if base is create_preprocessor_from_task:
        raise _refuse_task_preprocessor(_bound_value(create_preprocessor_fn, "task_name"))
    if base not in (create_preprocessor, create_decoder_preprocessor):
        raise _refuse(
            "create_preprocessor_fn",
            create_preprocessor_fn,
            "the serving graph's tokenization is t5x.export's (trim, EOS, pad); use "
            "export_lib.create_preprocessor (encoder-decoder) or export_lib.create_decoder_preprocessor "
            "(decoder-only) and their keywords",
        )


def _preprocessor(
    create_preprocessor_fn: Any,
    batch_size: int | None,
    output_features: Mapping[str, Any],
    task_feature_lengths: Mapping[str, int],
    tokenized_inputs: bool,
) -> TextPreprocessor:
    _check_preprocessor_fn(create_preprocessor_fn)
    if _base_function(create_preprocessor_fn) is create_preprocessor:
        made = create_preprocessor_fn(batch_size, output_features, task_feature_lengths, tokenized_inputs)[0]
    else:  # upstream's older call, without the batch size
        made = create_preprocessor_fn(output_features, task_feature_lengths, tokenized_inputs)
    if made.tokenized_inputs:
        raise _refuse(
            "tokenized_inputs", True, f"the serving signature takes raw text ({INPUT_TENSOR_NAME}, tf.string)"
        )
    if made.input_tensor_name != INPUT_TENSOR_NAME:
        raise _refuse(
            "create_preprocessor.input_tensor_name",
            made.input_tensor_name,
            f"the signature's input is named {INPUT_TENSOR_NAME!r}",
        )
    if made.bucket_keys:
        raise _refuse(
            "create_preprocessor.bucket_keys",
            made.bucket_keys,
            "inputs are padded to task_feature_lengths (no length buckets)",
        )
    return made


def _bound_value(fn: Any, keyword: str) -> Any:
    """A keyword gin binds to a configurable function (None when unbound or not configurable)."""
    import gin

    try:
        return gin.get_bindings(_base_function(fn)).get(keyword)
    except (ValueError, TypeError, KeyError):
        return None


def _postprocessor(
    create_postprocessor_fn: Any, vocabulary: Any, inference_mode: str, decode_outputs: bool
) -> TextPostprocessor:
    if _base_function(create_postprocessor_fn) is not create_postprocessor:
        raise _refuse(
            "create_postprocessor_fn",
            create_postprocessor_fn,
            "the outputs are t5x.export's (predict: decoded text output_0 and score output_1; score: "
            "log-likelihood output_0); use export_lib.create_postprocessor",
        )
    made = create_postprocessor_fn(vocabulary, inference_mode, decode_outputs)
    if not made.decode_outputs:
        raise _refuse("decode_outputs", False, "output_0 is always the decoded text")
    if made.add_token_length_to_output:
        raise _refuse(
            "create_postprocessor.add_token_length_to_output", True, "the outputs are the text and the score"
        )
    names = list(made.output_feature_names) if made.output_feature_names is not None else None
    if names is not None and names != ["output_0", "output_1"][: len(names)]:
        raise _refuse(
            "create_postprocessor.output_feature_names",
            names,
            "the outputs keep upstream's unnamed keys output_0 (text, or score mode's log-likelihood) "
            "and output_1 (score); leave output_feature_names = None",
        )
    return made


def _module_settings(exportable_module_cls: Any, batch_size: int | None) -> ExportableModule:
    cls = _base_function(exportable_module_cls)
    if not (isinstance(cls, type) and issubclass(cls, ExportableModule)):
        raise _refuse(
            "exportable_module_cls",
            exportable_module_cls,
            "t5x.export builds the SavedModel's module; use export_lib.ExportableModule and its keywords",
        )
    module = exportable_module_cls(
        preproc_tf_fn=None, model_tf_fn=None, postproc_tf_fn=None, params=None, batch_size=batch_size
    )
    if module.use_batch_function:
        raise _refuse(
            "ExportableModule.use_batch_function",
            True,
            "TF Serving's in-graph batching is not written into the SavedModel; batch requests on the "
            "client or with TF Serving's --enable_batching",
        )
    if not module.jit_compile:
        _LOG.info("ExportableModule.jit_compile=False: the model program is an XLA program either way")
    if module.use_gpu:
        _accepted("ExportableModule.use_gpu", True, "the variables are placed where TensorFlow loads them")
    return module


def _decode_options(model: Any) -> dict[str, Any]:
    """The model's ``predict_batch_with_aux`` keywords bound in gin (upstream's BEAM_SIZE plumbing)."""
    import gin

    bound: dict[str, Any] = {}
    for klass in type(model).__mro__:
        method = vars(klass).get("predict_batch_with_aux")
        if method is None:
            continue
        try:
            bound = dict(gin.get_bindings(method))
        except (ValueError, TypeError, KeyError):
            continue
        if bound:
            break
    who = f"models.{type(model).__name__}.predict_batch_with_aux"
    options = {
        "num_decodes": int(bound.pop("num_decodes", 1)),
        "decoder_params": bound.pop("decoder_params", None),
        # Upstream's export.gin sets it: output_0 / output_1 are then [batch, num_decodes].
        "return_all_decodes": bool(bound.pop("return_all_decodes", False)),
    }
    if bound.pop("prompt_with_targets", False):
        raise _refuse(f"{who}.prompt_with_targets", True, "the signature's text is the inputs only")
    if bound:
        raise _refuse(f"{who}.{next(iter(bound))}", bound[next(iter(bound))], "not implemented by the export")
    return options


def _restore_params(model: Any, restore: Any) -> Any:
    """The checkpoint's parameters for ``model``, rounded through ``restore.dtype`` when set."""
    who = "utils.RestoreCheckpointConfig"
    if not isinstance(restore, utils.RestoreCheckpointConfig):
        raise ConfigurationError(f"restore_checkpoint_cfg must be a {who}, got {type(restore).__name__}")
    if restore.mode == "all":
        raise _refuse(
            f"{who}.mode", "all", "one export holds one checkpoint: use mode='specific' or 'latest'"
        )
    if restore.assignment_map is not None:
        raise _refuse(
            f"{who}.assignment_map",
            restore.assignment_map,
            "checkpoints restore by parameter name; convert the checkpoint first (t5x-launch convert)",
        )
    if restore.state_transformation_fns:
        raise _refuse(f"{who}.state_transformation_fns", restore.state_transformation_fns, "not implemented")
    if restore.fallback_to_scratch:
        raise _refuse(
            f"{who}.fallback_to_scratch", True, "every parameter of the model must be in the checkpoint"
        )
    cls = restore.checkpointer_cls
    if cls is not None and not (isinstance(cls, type) and issubclass(cls, checkpoints.Checkpointer)):
        raise _refuse(f"{who}.checkpointer_cls", cls, "checkpoints are read as T5X checkpoints")
    if restore.restore_dataset:
        _accepted(f"{who}.restore_dataset", True, "an export reads parameters only")
    paths = [restore.path] if isinstance(restore.path, str) else list(restore.path or [])
    if len(paths) != 1 or not paths[0]:
        raise ConfigurationError(
            f"{who}.path must name one checkpoint (a checkpoint_<step> or model folder), got {restore.path!r}: "
            "set CHECKPOINT_PATH"
        )
    path = os.fspath(paths[0])
    try:
        params = load_checkpoint_params(model, path)
    except ValueError as error:
        raise ConfigurationError(
            f"the checkpoint {path} does not fit the configured model: {error}"
        ) from error
    if restore.dtype is None:
        return params
    import jax
    import jax.numpy as jnp
    import numpy as np

    dtype = jnp.dtype(restore.dtype)
    return jax.tree.map(
        lambda leaf: (
            np.asarray(leaf).astype(dtype) if jnp.issubdtype(np.asarray(leaf).dtype, jnp.floating) else leaf
        ),
        params,
    )


def _check_partitioner(partitioner: Any) -> None:
    mesh = getattr(partitioner, "mesh", None)
    shape = dict(getattr(mesh, "shape", {}) or {})
    if shape.get("model", 1) > 1:
        _accepted(
            "partitioner",
            f"a mesh of {shape}",
            "the SavedModel holds one device's (unpartitioned) program; the model must fit one device",
        )


def save(
    *,
    model: Any,
    inference_mode: Any,
    restore_checkpoint_cfg: Any,
    exportable_module_cls: Any = ExportableModule,
    create_preprocessor_fn: Any = create_preprocessor,
    create_inference_function_fn: Any = None,
    create_postprocessor_fn: Any = create_postprocessor,
    partitioner: Any = None,
    create_decoding_state_callback_fn: Any = None,
    output_features: Mapping[str, Any] | None,
    task_feature_lengths: Mapping[str, int],
    batch_size: int | None,
    output_dir: str | Mapping[str, str],
    model_name: str,
    warmup_examples: Sequence[Any] | None = None,
    tokenized_inputs: bool = False,
    write_warmup_example_fn: Callable[..., Any] = write_warmup_examples,
    mixture_or_task_name: str | None = None,
    validation_examples: Sequence[str] | None = None,
    native_lowering: bool = False,
    enable_xla: bool = True,
    decode_outputs: bool | None = None,
    trailing_shapes: Mapping[str, tuple[int, ...]] | None = None,
    output_vocab_feature_name: str | None = "targets",
    signature_name: str | None = SIGNATURE_NAME,
    create_polymorphic_shapes_fn: Any = None,
    create_fake_input_fn: Any = None,
) -> Any:
    """Upstream's ``export_lib.save`` keywords, exported by ``t5x.export.export_saved_model``.

    Restores ``restore_checkpoint_cfg``'s checkpoint (parameters rounded through
    its ``dtype``) and writes a SavedModel whose ``serving_default`` signature takes
    ``text_batch`` (``[batch]`` strings; ``batch_size`` None: any batch size) and
    returns, for ``inference_mode='predict'``, the decoded text ``output_0`` and its
    score ``output_1``; for ``'score'``, each text is ``inputs<split_separator>targets``
    (``create_preprocessor.split_separator``) and ``output_0`` is the targets'
    log-likelihood. The vocabularies and EOS rules are ``output_features``' (or
    ``mixture_or_task_name``'s); the beam size or sample count is
    ``predict_batch_with_aux.num_decodes`` as bound in gin. ``warmup_examples``
    are written as TF Serving warm-up requests (``model_name`` names the model in
    them) and ``validation_examples`` are decoded in JAX too, into the folder's
    ``reference_predictions.json``.

    Returns:
      The ``t5x.export.ExportedModel`` written (upstream returns nothing).

    Raises:
      UnsupportedExportOption: a keyword or value whose meaning is not implemented.
      ConfigurationError: a wrong value (the output folder's layout, the features).
      t5x.export.ExportError: no serving signature is possible for the model or
        its vocabularies, or the output folder holds files.
    """
    # Refusals first: nothing is read or written for a configuration that cannot be exported.
    if isinstance(inference_mode, CustomInferenceMode):
        raise _refuse(
            "inference_mode",
            inference_mode,
            "the exported model function is predict_batch_with_aux ('predict') or score_batch ('score')",
        )
    if inference_mode not in _MODES:
        raise ConfigurationError(f"inference_mode must be one of {_MODES}, got {inference_mode!r}")
    for option, value in (
        ("create_inference_function_fn", create_inference_function_fn),
        ("create_decoding_state_callback_fn", create_decoding_state_callback_fn),
        ("create_polymorphic_shapes_fn", create_polymorphic_shapes_fn),
        ("create_fake_input_fn", create_fake_input_fn),
    ):
        if value is not None:
            raise _refuse(option, value, "the model function and its conversion are t5x.export's")
    if tokenized_inputs:
        raise _refuse(
            "tokenized_inputs", True, f"the signature takes raw text ({INPUT_TENSOR_NAME}, tf.string)"
        )
    if not enable_xla:
        raise _refuse(
            "enable_xla", False, "the model is converted as one XLA program (jax2tf native serialization)"
        )
    if trailing_shapes:
        raise _refuse("trailing_shapes", trailing_shapes, "the model's features are [batch, length] ids")
    if signature_name != SIGNATURE_NAME:
        raise _refuse("signature_name", signature_name, f"the signature is named {SIGNATURE_NAME!r}")
    if not output_vocab_feature_name:
        raise _refuse(
            "output_vocab_feature_name",
            output_vocab_feature_name,
            "decodes are detokenized with a vocabulary",
        )
    if decode_outputs is False:
        raise _refuse("decode_outputs", False, "output_0 is always the decoded text")
    if native_lowering:
        _LOG.info("native_lowering=True: the model is always converted with jax2tf's native serialization")

    _check_preprocessor_fn(create_preprocessor_fn)
    savedmodel_dir = _savedmodel_dir(output_dir)
    features = _output_features(output_features, mixture_or_task_name)
    preprocessor = _preprocessor(
        create_preprocessor_fn, batch_size, features, task_feature_lengths, tokenized_inputs
    )
    inputs = _feature(features, "inputs", "export_lib.save")
    targets = _feature(features, output_vocab_feature_name, "export_lib.save.output_vocab_feature_name")
    _postprocessor(create_postprocessor_fn, targets.vocabulary, inference_mode, True)
    module = _module_settings(exportable_module_cls, batch_size)

    from t5x import models

    decoder_only = isinstance(model, models.DecoderOnlyModel)
    if preprocessor.decoder_only != decoder_only:
        raise _refuse(
            "create_preprocessor_fn",
            create_preprocessor_fn,
            f"a {type(model).__name__} exports with export_lib."
            + ("create_decoder_preprocessor" if decoder_only else "create_preprocessor")
            + ", as upstream",
        )
    if inference_mode == "score":
        if decoder_only:
            raise _refuse(
                "inference_mode",
                "score",
                "create_decoder_preprocessor has no targets to score (upstream scores an empty target)",
            )
        if preprocessor.split_separator is None:
            raise _refuse(
                "create_preprocessor.split_separator",
                None,
                "score mode scores the text after the separator: set it, e.g. "
                "export_lib.create_preprocessor.split_separator = '\\t'",
            )
    elif preprocessor.split_separator is not None:
        raise _refuse(
            "create_preprocessor.split_separator",
            preprocessor.split_separator,
            "predict mode's text is the whole input (the separator splits score mode's inputs and targets)",
        )
    _check_partitioner(partitioner)
    decode = _decode_options(model) if inference_mode == "predict" else {}

    params = _restore_params(model, restore_checkpoint_cfg)
    import t5x.export

    _LOG.info("exporting %s to %s", type(model).__name__, savedmodel_dir)
    exported = t5x.export.export_saved_model(
        model,
        params,
        savedmodel_dir,
        task_feature_lengths=preprocessor.task_feature_lengths,
        mode=inference_mode,
        batch_size=batch_size,
        input_vocabulary=inputs.vocabulary,
        output_vocabulary=targets.vocabulary,
        # Upstream's decoder preprocessor keeps an appended EOS out of the prompt.
        inputs_add_eos=bool(inputs.add_eos) and not decoder_only,
        targets_add_eos=bool(targets.add_eos),
        split_separator=preprocessor.split_separator or "\t",
        reference_inputs=list(validation_examples or ()),
        **decode,
    )
    if warmup_examples:
        examples = list(warmup_examples)
        if batch_size:
            examples = examples[:batch_size] + [""] * max(0, batch_size - len(examples))
        write_warmup_example_fn(
            examples,
            output_dir=str(exported.path),
            model_name=model_name,
            batch_sizes=module.export_batch_sizes,
            signature_name=signature_name,
        )
    return exported
