"""t5x.export_lib: upstream's export run file under `t5x-launch export`, and ``save`` from Python.

A tiny T5.1.1-style model (upstream's small.gin, shrunk) gets a checkpoint written here;
the installed ``t5x-launch`` exports it through a user's copy of upstream's
``t5x/configs/runs/export.gin`` (found first on ``--gin_search_paths``), TensorFlow loads
the SavedModel, and its decodes and scores are the JAX model's. A refused keyword is
one message with exit code 2 (through the run file t5x-upstream ships). ``save`` called
from Python exports score mode and writes TF Serving warm-up records.
"""

import concurrent.futures
import functools
import json
import os
import pathlib
import subprocess
import sys

import gin
import numpy as np
import pytest
from _upstream_fixtures import write_experiment

LENGTHS = {"inputs": 16, "targets": 8}
TEXTS = ["the quick brown fox jumps", "seven small birds sing near the river"]

# A user's copy of upstream's run file: its macros and bindings, with BATCH_SIZE = 2 where
# upstream's has None (so the test can tell this copy from the one t5x-upstream ships).
USER_EXPORT_GIN = """\
from __gin__ import dynamic_registration

import seqio

from t5x import checkpoints
from t5x import models
from t5x import partitioning
from t5x import utils
from t5x import export_lib

OUTPUT_FEATURES = %gin.REQUIRED
TASK_FEATURE_LENGTHS = %gin.REQUIRED
CHECKPOINT_PATH = %gin.REQUIRED
MODEL_OUTPUT_DIR = %gin.REQUIRED
MODEL_NAME = %gin.REQUIRED
BATCH_SIZE = 2
BEAM_SIZE = 1

OUTPUT_FEATURES = {'inputs': @inputs/seqio.Feature(), 'targets': @outputs/seqio.Feature()}
inputs/seqio.Feature.vocabulary = @models.get_input_vocabulary()
models.get_input_vocabulary.model = %MODEL
outputs/seqio.Feature.vocabulary = @models.get_output_vocabulary()
models.get_output_vocabulary.model = %MODEL

ACTIVATION_DTYPE = 'bfloat16'

export_lib.save:
  model = %MODEL
  inference_mode = 'predict'
  restore_checkpoint_cfg = @utils.RestoreCheckpointConfig()
  exportable_module_cls = @export_lib.ExportableModule
  create_preprocessor_fn = @export_lib.create_preprocessor
  create_postprocessor_fn = @export_lib.create_postprocessor
  write_warmup_example_fn = @export_lib.write_warmup_examples
  partitioner = @partitioning.PjitPartitioner()
  output_features = %OUTPUT_FEATURES
  task_feature_lengths = %TASK_FEATURE_LENGTHS
  output_dir = %MODEL_OUTPUT_DIR
  model_name = %MODEL_NAME
  batch_size = %BATCH_SIZE
  native_lowering = False

utils.RestoreCheckpointConfig:
  path = %CHECKPOINT_PATH
  mode = 'specific'
  dtype = %ACTIVATION_DTYPE
  checkpointer_cls = @checkpoints.Checkpointer
  use_gda = False

export_lib.create_preprocessor:
  output_features = %OUTPUT_FEATURES
  task_feature_lengths = %TASK_FEATURE_LENGTHS

export_lib.create_postprocessor:
  output_feature_names = None

export_lib.ExportableModule:
  jit_compile = True
  use_batch_function = False

partitioning.PjitPartitioner:
  num_partitions = 1
  params_on_devices = True
  logical_axis_rules = @partitioning.standard_logical_axis_rules()

models.EncoderDecoderModel.predict_batch_with_aux:
  num_decodes = %BEAM_SIZE
  return_all_decodes = True
"""


@pytest.fixture(autouse=True)
def _clean_gin():
    yield
    gin.clear_config()


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, spm_path):
    """(folder, model gin, checkpoint_1 folder, model): a tiny model's checkpoint, written here."""
    import jax

    from t5x.checkpointing import save_t5x_checkpoint
    from t5x.launch._gin_config import GinArgs, macro_value, parse_gin

    folder = tmp_path_factory.mktemp("export")
    model_gin, _ = write_experiment(folder, spm_path)
    parse_gin(GinArgs((str(model_gin),)))
    model = macro_value("MODEL")
    shapes = {k: (1, 8) for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")}
    params = model.get_initial_variables(jax.random.PRNGKey(3), shapes)["params"]
    checkpoint = save_t5x_checkpoint(folder / "model", 1, {"target": params, "state": {"step": 1}})
    return folder, model_gin, pathlib.Path(checkpoint), model


def _launch(folder, *args):
    script = pathlib.Path(sys.executable).with_name("t5x-launch")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [str(script), "export", *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )


def _ids(vocabulary, texts, length):
    out = np.zeros((len(texts), length), np.int32)
    for row, text in enumerate(texts):
        ids = [*list(vocabulary.encode(text))[: length - 1], vocabulary.eos_id]
        out[row, : len(ids)] = ids
    return out


def _params(model, checkpoint, dtype=None):
    import jax
    import jax.numpy as jnp

    from t5x.launch import load_checkpoint_params

    params = load_checkpoint_params(model, str(checkpoint))
    return params if dtype is None else jax.tree.map(lambda x: np.asarray(x).astype(jnp.dtype(dtype)), params)


def _serve(path, **inputs):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece op the SavedModel uses)

    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    return {k: v.numpy() for k, v in signature(**{k: tf.constant(v) for k, v in inputs.items()}).items()}


def test_shipped_export_gin_binds_export_lib_save(experiment):
    import t5x.export
    from t5x import export_lib, models
    from t5x.launch._gin_config import GinArgs, configured_job, macro_value, parse_gin

    _, model_gin, checkpoint, _ = experiment
    bindings = (
        f"CHECKPOINT_PATH = {str(checkpoint)!r}",
        "MODEL_OUTPUT_DIR = '/tmp/unused/1'",
        "MODEL_NAME = 'm'",
        f"TASK_FEATURE_LENGTHS = {LENGTHS}",
    )
    parse_gin(GinArgs((str(model_gin), "t5x/configs/runs/export.gin"), bindings))
    # t5x-launch export runs the job the config binds: t5x-upstream's save, found through its extension.
    assert configured_job("export", t5x.export.export_saved_model) is export_lib.save
    bound = gin.get_bindings(export_lib.save)
    assert (bound["output_dir"], bound["model_name"], bound["inference_mode"]) == (
        "/tmp/unused/1",
        "m",
        "predict",
    )
    model = macro_value("MODEL")
    features = bound["output_features"]
    assert features["inputs"].vocabulary.sp_model == models.get_input_vocabulary(model).sp_model
    assert features["inputs"].add_eos and features["targets"].add_eos


def test_upstream_export_gin_runs_under_t5x_launch_export(experiment):
    folder, model_gin, checkpoint, model = experiment
    user_configs = folder / "user_t5x"
    (user_configs / "t5x" / "configs" / "runs").mkdir(parents=True)
    (user_configs / "t5x" / "configs" / "runs" / "export.gin").write_text(USER_EXPORT_GIN)
    common = [
        f"--gin_file={model_gin}",
        "--gin_file=t5x/configs/runs/export.gin",
        f"--gin.CHECKPOINT_PATH={checkpoint}",
        "--gin.MODEL_NAME=my_model",
        f"--gin.TASK_FEATURE_LENGTHS={LENGTHS}",
    ]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        exporting = pool.submit(
            _launch, folder, f"--gin_search_paths={user_configs}", *common,
            f"--gin.MODEL_OUTPUT_DIR={folder / 'serving' / '7'}", "--gin.BEAM_SIZE=2",
        )  # fmt: skip
        # t5x-upstream's own copy of the run file, with a keyword the export refuses.
        refusing = pool.submit(
            _launch, folder, *common, f"--gin.MODEL_OUTPUT_DIR={folder / 'refused' / '1'}",
            "--gin.export_lib.ExportableModule.use_batch_function=True",
        )  # fmt: skip
        exported, refused = exporting.result(), refusing.result()

    assert exported.returncode == 0, exported.stderr[-5000:]
    # Upstream's layout: MODEL_OUTPUT_DIR=BASE/VERSION writes the SavedModel to BASE_cpu/VERSION.
    savedmodel = folder / "serving_cpu" / "7"
    assert "exported a predict SavedModel" in exported.stdout and str(savedmodel) in exported.stdout
    assert not (folder / "serving").exists()
    metadata = json.loads((savedmodel / "t5x_export.json").read_text())
    assert metadata["batch_size"] == 2  # the user's copy of export.gin was read, not t5x-upstream's
    assert metadata["task_feature_lengths"] == LENGTHS
    assert "export_lib.save" in (savedmodel / "config.gin").read_text()

    served = _serve(savedmodel, text_batch=TEXTS)
    # The JAX model: parameters rounded through ACTIVATION_DTYPE (bfloat16), a beam of BEAM_SIZE.
    params = _params(model, checkpoint, "bfloat16")
    batch = {
        "encoder_input_tokens": _ids(model.input_vocabulary, TEXTS, LENGTHS["inputs"]),
        "decoder_input_tokens": np.zeros((len(TEXTS), LENGTHS["targets"]), np.int32),
    }
    model.cpu_kernels = False  # XLA's own ops, as in the SavedModel (which cannot hold the CPU kernels)
    # export.gin's return_all_decodes = True: every beam, [batch, BEAM_SIZE], as upstream serves them.
    decodes, aux = model.predict_batch_with_aux(params, batch, num_decodes=2, return_all_decodes=True)
    expected = [
        [model.output_vocabulary.decode([int(t) for t in beam]) for beam in row]
        for row in np.asarray(decodes)
    ]
    assert served["output_0"].shape == (len(TEXTS), 2)
    assert [[text.decode() for text in row] for row in served["output_0"]] == expected
    np.testing.assert_allclose(served["output_1"], np.asarray(aux["scores"]), rtol=1e-4, atol=1e-4)

    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert (
        "upstream option ExportableModule.use_batch_function=True is not supported by t5x-upstream's export"
        in refused.stderr
    )
    assert not (folder / "refused_cpu").exists()


def test_save_from_python_scores_and_writes_warmup_requests(experiment, tmp_path):
    import tensorflow as tf

    from t5x import export_lib, utils
    from t5x.seqio import Feature

    _, _, checkpoint, model = experiment
    vocabulary = model.input_vocabulary
    pairs = ["the quick brown fox\tthe quick brown fox", "seven small birds\tsing near the river"]
    exported = export_lib.save(
        model=model,
        inference_mode="score",
        restore_checkpoint_cfg=utils.RestoreCheckpointConfig(path=str(checkpoint), mode="specific"),
        exportable_module_cls=export_lib.ExportableModule,
        create_preprocessor_fn=functools.partial(export_lib.create_preprocessor, split_separator="\t"),
        output_features={"inputs": Feature(vocabulary), "targets": Feature(vocabulary)},
        task_feature_lengths=LENGTHS,
        batch_size=None,
        output_dir={"cpu": str(tmp_path / "scorer")},
        model_name="scorer",
        warmup_examples=pairs[:1],
    )
    assert exported.path == tmp_path / "scorer" and exported.mode == "score"

    served = _serve(exported.path, text_batch=pairs)
    split = [p.split("\t") for p in pairs]
    targets = _ids(vocabulary, [t for _, t in split], LENGTHS["targets"])
    batch = {
        "encoder_input_tokens": _ids(vocabulary, [i for i, _ in split], LENGTHS["inputs"]),
        "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (targets > 0).astype(np.int32),
    }
    expected = np.asarray(model.score_batch(_params(model, checkpoint), batch))
    np.testing.assert_allclose(served["output_0"], expected, rtol=1e-4, atol=1e-4)

    records = list(tf.data.TFRecordDataset(str(exported.path / export_lib.WARMUP_FILE)).as_numpy_iterator())
    assert len(records) == 1
    log = _prediction_log_class().FromString(records[0])
    request = log.predict_log.request
    assert (request.model_spec.name, request.model_spec.signature_name) == ("scorer", "serving_default")
    assert [v.decode() for v in tf.make_ndarray(request.inputs["text_batch"])] == pairs[:1]


def _prediction_log_class():
    """TF Serving's PredictionLog (its field numbers), built here: tensorflow-serving-api is not installed."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tensorflow.core.framework import tensor_pb2

    pool = descriptor_pool.Default()
    name = "t5x_export_lib_test/prediction_log.proto"
    try:
        pool.FindFileByName(name)
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto(
            name=name, package="t5x_export_lib_test", syntax="proto3",
            dependency=[tensor_pb2.DESCRIPTOR.name],
        )  # fmt: skip
        string, message = (
            descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
            descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        )
        optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
        repeated = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED

        def add(msg, field, number, kind, label=optional, type_name=None):
            msg.field.add(name=field, number=number, type=kind, label=label, type_name=type_name)

        spec = proto.message_type.add(name="ModelSpec")
        add(spec, "name", 1, string)
        add(spec, "signature_name", 3, string)
        request = proto.message_type.add(name="PredictRequest")
        entry = request.nested_type.add(name="InputsEntry")
        entry.options.map_entry = True
        add(entry, "key", 1, string)
        add(entry, "value", 2, message, type_name=".tensorflow.TensorProto")
        add(request, "model_spec", 1, message, type_name=".t5x_export_lib_test.ModelSpec")
        add(request, "inputs", 2, message, repeated, ".t5x_export_lib_test.PredictRequest.InputsEntry")
        predict_log = proto.message_type.add(name="PredictLog")
        add(predict_log, "request", 1, message, type_name=".t5x_export_lib_test.PredictRequest")
        log = proto.message_type.add(name="PredictionLog")
        add(log, "predict_log", 6, message, type_name=".t5x_export_lib_test.PredictLog")
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t5x_export_lib_test.PredictionLog"))


def test_refusals_name_the_keyword_before_anything_is_read(tmp_path):
    from t5x import export_lib, launch, utils

    restore = utils.RestoreCheckpointConfig(path=str(tmp_path / "missing"), mode="specific")
    common = dict(
        model=None, restore_checkpoint_cfg=restore, output_features=None, task_feature_lengths=LENGTHS,
        batch_size=None, model_name="m",
    )  # fmt: skip
    with pytest.raises(export_lib.UnsupportedExportOption, match="tokenized_inputs=True"):
        export_lib.save(
            inference_mode="predict", output_dir={"cpu": str(tmp_path)}, tokenized_inputs=True, **common
        )
    with pytest.raises(export_lib.UnsupportedExportOption, match="inference_mode=CustomInferenceMode"):
        export_lib.save(
            inference_mode=export_lib.CustomInferenceMode("compute_logits"),
            output_dir=str(tmp_path),
            **common,
        )
    with pytest.raises(launch.ConfigurationError, match="BASE/VERSION"):
        export_lib.save(inference_mode="predict", output_dir=str(tmp_path / "serving"), **common)


def test_decoder_only_model_exports_its_prompt_without_eos(tmp_path):
    import jax
    import tensorflow as tf

    from t5x import export_lib, models, utils
    from t5x.checkpointing import save_t5x_checkpoint
    from t5x.seqio import Feature
    from t5x.vocabularies import ByteVocabulary

    vocabulary = ByteVocabulary()
    config = models.DecoderOnlyConfig(
        vocab_size=vocabulary.vocab_size, emb_dim=16, num_heads=2, head_dim=8, num_layers=1, mlp_dim=32
    )
    model = models.DecoderOnlyModel(config=config, vocabulary=vocabulary, inputs_bidirectional_attention=True)
    shapes = {
        k: (1, 8) for k in ("decoder_input_tokens", "decoder_target_tokens", "decoder_causal_attention")
    }
    params = model.get_initial_variables(jax.random.PRNGKey(1), shapes)["params"]
    checkpoint = save_t5x_checkpoint(tmp_path / "model", 1, {"target": params, "state": {"step": 1}})
    features = {"inputs": Feature(vocabulary), "targets": Feature(vocabulary)}
    save = functools.partial(
        export_lib.save,
        model=model,
        inference_mode="predict",
        restore_checkpoint_cfg=utils.RestoreCheckpointConfig(path=checkpoint, mode="specific"),
        output_features=features,
        task_feature_lengths={"inputs": 8, "targets": 6},
        batch_size=None,
        output_dir={"cpu": str(tmp_path / "lm")},
        model_name="lm",
    )
    # Upstream's encoder-decoder preprocessor does not fit a decoder-only model.
    with pytest.raises(export_lib.UnsupportedExportOption, match="create_decoder_preprocessor"):
        save()
    exported = save(create_preprocessor_fn=export_lib.create_decoder_preprocessor)

    texts = ["ab", "hello"]
    signature = tf.saved_model.load(str(exported.path)).signatures["serving_default"]
    served = signature(text_batch=tf.constant(texts))
    # The prefix-LM layout of the prompt without EOS: 0, prompt, room for 6 tokens.
    tokens, causal = np.zeros((2, 14), np.int32), np.zeros((2, 14), np.int32)
    for row, text in enumerate(texts):
        ids = list(vocabulary.encode(text))
        tokens[row, 1 : 1 + len(ids)], causal[row, : len(ids) + 1] = ids, 1
    model.cpu_kernels = False
    decodes, aux = model.predict_batch_with_aux(
        params, {"decoder_input_tokens": tokens, "decoder_causal_attention": causal}
    )
    expected = [vocabulary.decode([int(t) for t in row]) for row in np.asarray(decodes)]
    assert [t.decode() for t in served["output_0"].numpy()] == expected
    np.testing.assert_allclose(served["output_1"].numpy(), np.asarray(aux["scores"]), rtol=1e-4, atol=1e-4)
