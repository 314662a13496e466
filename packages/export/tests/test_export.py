"""export_saved_model: SavedModels that TensorFlow serves with the model's own predictions."""

import json

import jax
import numpy as np
import pytest
import tensorflow as tf

from t5x import decoding
from t5x.export import METADATA_FILE, REFERENCE_FILE, ExportError, export_saved_model, reference_outputs

LENGTHS = {"inputs": 12, "targets": 7}
TEXTS = ["sort 3 1 2", "héllo wörld", "", "a much longer input than twelve bytes"]


def _serve(path, texts):
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    return {k: v.numpy() for k, v in signature(text_batch=tf.constant(texts)).items()}


def _saved_variables(path):
    """The model parameters among a SavedModel's checkpointed variables."""
    listed = tf.train.list_variables(str(path / "variables" / "variables"))
    return [(name, shape) for name, shape in listed if name.startswith("params/")]


@pytest.fixture(scope="module")
def byte_export(byte_model, tmp_path_factory):
    model, params = byte_model
    out = tmp_path_factory.mktemp("export") / "predict"
    # Temperature sampling with a fixed seed inside the graph: not greedy, so it checks the rng too.
    exported = export_saved_model(
        model,
        params,
        out,
        task_feature_lengths=LENGTHS,
        decoder_params={"temperature": 0.7},
        reference_inputs=TEXTS,
    )
    return exported


def test_predict_signature_equals_jax_for_any_batch_size(byte_model, byte_export):
    model, params = byte_model
    reference = byte_export.reference
    whole = _serve(byte_export.path, TEXTS)
    assert [t.decode() for t in whole["output_0"]] == reference["output_0"]
    np.testing.assert_allclose(whole["output_1"], reference["output_1"], rtol=1e-5, atol=1e-5)
    assert any(reference["output_0"])  # the random model emits bytes
    assert len(set(reference["output_1"])) > 1  # sampled scores differ per row
    # Batch-polymorphic: two rows through the same signature, against JAX on those two rows.
    pair = _serve(byte_export.path, TEXTS[1:3])
    expected = reference_outputs(
        model, params, TEXTS[1:3], mode="predict", task_feature_lengths=LENGTHS,
        input_vocabulary=model.input_vocabulary, output_vocabulary=model.output_vocabulary,
        decoder_params={"temperature": 0.7},
    )  # fmt: skip
    assert pair["output_0"].shape == (2,)
    assert [t.decode() for t in pair["output_0"]] == expected["output_0"]


def test_folder_describes_the_export(byte_model, byte_export):
    metadata = json.loads((byte_export.path / METADATA_FILE).read_text())
    assert metadata["signature"] == "serving_default"
    assert metadata["input"] == "text_batch"
    assert metadata["outputs"] == ["output_0", "output_1"]
    assert metadata["params"] == "variables"
    assert metadata["load_imports"] == []
    reference = json.loads((byte_export.path / REFERENCE_FILE).read_text())
    assert reference["inputs"] == TEXTS
    names = [name for name, _ in _saved_variables(byte_export.path)]
    assert len(names) == len(jax.tree_util.tree_leaves(byte_model[1]))
    assert any("encoder" in n and "attention" in n for n in names)


def test_score_mode_with_constants(byte_model, tmp_path):
    model, params = byte_model
    texts = ["3 1 2\t1 2 3", "3 1 2\tzzz", "abc\t"]
    exported = export_saved_model(
        model, params, tmp_path / "score", task_feature_lengths=LENGTHS, mode="score",
        params_as_variables=False, reference_inputs=texts,
    )  # fmt: skip
    served = _serve(exported.path, texts)
    assert set(served) == {"output_0"}
    np.testing.assert_allclose(served["output_0"], exported.reference["output_0"], rtol=1e-5, atol=1e-4)
    assert len(set(np.round(served["output_0"], 3))) == 3  # different targets, different scores
    assert not _saved_variables(exported.path)  # folded into the graph


def test_sentencepiece_and_beam_search_inside_the_graph(tiny_model, spm_vocabulary, tmp_path):
    model, params = tiny_model(spm_vocabulary, decode_fn=decoding.beam_search)
    texts = ["the quick brown fox", "seven birds sing near the river", "unknown ÿ glyphs"]
    exported = export_saved_model(
        model,
        params,
        tmp_path / "spm",
        task_feature_lengths={"inputs": 8, "targets": 5},
        num_decodes=2,
        reference_inputs=texts,
    )
    assert exported.load_imports == ("tensorflow_text",)
    served = _serve(exported.path, texts)
    assert [t.decode() for t in served["output_0"]] == exported.reference["output_0"]
    np.testing.assert_allclose(served["output_1"], exported.reference["output_1"], rtol=1e-5, atol=1e-4)


def test_all_decodes_of_a_beam_search(byte_model, tmp_path):
    """Upstream's export run file asks for every beam: output_0 / output_1 are [batch, beams]."""
    model, params = byte_model
    texts = TEXTS[:3]
    exported = export_saved_model(
        model, params, tmp_path / "beams", task_feature_lengths=LENGTHS, num_decodes=3,
        return_all_decodes=True, reference_inputs=texts,
    )  # fmt: skip
    served = _serve(exported.path, texts)
    assert served["output_0"].shape == (3, 3) and served["output_1"].shape == (3, 3)
    assert [[t.decode() for t in row] for row in served["output_0"]] == exported.reference["output_0"]
    np.testing.assert_allclose(served["output_1"], exported.reference["output_1"], rtol=1e-5, atol=1e-4)
    # The best of them is what the default (one decode per input) returns.
    best = reference_outputs(
        model, params, texts, mode="predict", task_feature_lengths=LENGTHS, num_decodes=3,
        input_vocabulary=model.input_vocabulary, output_vocabulary=model.output_vocabulary,
    )  # fmt: skip
    order = np.argsort(served["output_1"], axis=1)[:, -1]
    assert [row[i] for row, i in zip(exported.reference["output_0"], order, strict=True)] == best["output_0"]
    assert json.loads((exported.path / METADATA_FILE).read_text())["all_decodes"] == 3


def test_sentencepiece_graph_tokens_equal_python_tokens(spm_vocabulary):
    from t5x.export._features import padded_ids_np, padded_ids_tf
    from t5x.export._text import graph_tokenizer

    tokenizer = graph_tokenizer(spm_vocabulary, "input")
    texts = ["the quick brown fox jumps over a lazy dog", "x", ""]
    graph = padded_ids_tf(tokenizer, tf.constant(texts), 9, add_eos=True).numpy()
    np.testing.assert_array_equal(graph, padded_ids_np(spm_vocabulary, texts, 9, add_eos=True))
    ids = np.array([[5, 9, 40, 1, 7], [0, 6, 1000, 0, 3]], np.int32)  # 40: a sentinel, 1000: out of range
    assert [t.decode() for t in tokenizer.decode(tf.constant(ids)).numpy()] == [
        spm_vocabulary.decode(row) for row in ids
    ]


class _CallbackVocabulary:
    """A vocabulary whose tf path calls back into Python, as Hugging Face tokenizers' does."""

    eos_id = 1
    vocab_size = 300

    def encode_tf(self, s):
        values = tf.numpy_function(lambda x: np.zeros([0], np.int32), [s], tf.int32)
        return tf.RaggedTensor.from_row_lengths(values, tf.zeros_like(s, tf.int64))

    def decode_tf(self, ids):
        return tf.strings.as_string(tf.reduce_sum(ids, -1))

    def __repr__(self):
        return "CallbackVocabulary()"


def test_unexportable_inputs_are_named(byte_model, tmp_path):
    model, params = byte_model
    with pytest.raises(
        ExportError, match="no serving signature possible.*CallbackVocabulary.*Python callback"
    ):
        export_saved_model(
            model,
            params,
            tmp_path / "a",
            task_feature_lengths=LENGTHS,
            input_vocabulary=_CallbackVocabulary(),
        )
    with pytest.raises(ExportError, match="no serving signature possible.*got dict"):
        export_saved_model({}, {}, tmp_path / "b", task_feature_lengths=LENGTHS)
    with pytest.raises(
        ExportError, match=r"task_feature_lengths\['targets'\] must be a positive int, got None"
    ):
        export_saved_model(model, params, tmp_path / "c", task_feature_lengths={"inputs": 4})
    with pytest.raises(ExportError, match="mode must be one of"):
        export_saved_model(model, params, tmp_path / "d", task_feature_lengths=LENGTHS, mode="rank")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ExportError, match="exists and is not empty"):
        export_saved_model(model, params, tmp_path / "full", task_feature_lengths=LENGTHS)


def test_sentencepiece_without_tensorflow_text_is_named(spm_vocabulary, monkeypatch):
    import sys

    from t5x.export._text import graph_tokenizer

    monkeypatch.setitem(sys.modules, "tensorflow_text", None)
    with pytest.raises(ExportError, match="SentencePiece.*tensorflow-text"):
        graph_tokenizer(spm_vocabulary, "input")


@pytest.fixture(scope="module")
def prefix_lm():
    """A 1-layer prefix LM over bytes (the prompt attends bidirectionally) and its parameters."""
    from t5x import models
    from t5x.vocabularies import ByteVocabulary

    vocabulary = ByteVocabulary(extra_ids=5)
    model = models.DecoderOnlyModel(
        config=models.DecoderOnlyConfig(
            vocab_size=vocabulary.vocab_size, emb_dim=16, num_heads=2, head_dim=8, num_layers=1, mlp_dim=32
        ),
        vocabulary=vocabulary,
        decode_fn=decoding.temperature_sample,
        inputs_bidirectional_attention=True,
    )
    width = LENGTHS["inputs"] + LENGTHS["targets"]
    shapes = {
        k: (1, width) for k in ("decoder_input_tokens", "decoder_target_tokens", "decoder_causal_attention")
    }
    return model, model.get_initial_variables(jax.random.PRNGKey(2), shapes)["params"]


def _prefix_lm_batch(vocabulary, pairs):
    """The batch t5x's own prefix-LM feature converter makes of (inputs, targets) texts."""
    from t5x.feature_converters import PrefixLMFeatureConverter

    def ids(text):
        return [*vocabulary.encode(text), vocabulary.eos_id]

    examples = [{"inputs": ids(i)[-LENGTHS["inputs"] :], "targets": ids(t)} for i, t in pairs]
    ds = tf.data.Dataset.from_generator(
        lambda: iter(examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in ("inputs", "targets")},
    )
    converted = PrefixLMFeatureConverter(pack=False)(ds, LENGTHS)
    rows = [{k: v.numpy() for k, v in row.items()} for row in converted]
    return {k: np.stack([row[k] for row in rows]) for k in rows[0]}


def test_decoder_only_export_predicts_and_scores_as_the_model_does(prefix_lm, tmp_path):
    model, params = prefix_lm
    prompts = ["sort 3 1 2", "abc", "x"]  # short enough that trimming does not differ
    greedy = {"temperature": 0.0}
    exported = export_saved_model(
        model, params, tmp_path / "lm", task_feature_lengths=LENGTHS, decoder_params=greedy
    )
    served = _serve(exported.path, prompts)
    # Against the model itself, on the batch the training pipeline's converter makes.
    batch = _prefix_lm_batch(model.vocabulary, [(p, "") for p in prompts])
    decodes, aux = model.predict_batch_with_aux(params, batch, decoder_params=greedy)
    expected = [model.vocabulary.decode([int(i) for i in row]) for row in np.asarray(decodes)]
    assert [t.decode() for t in served["output_0"]] == expected
    assert any(expected)
    np.testing.assert_allclose(served["output_1"], np.asarray(aux["scores"]), rtol=1e-5, atol=1e-4)

    pairs = [("3 1 2", "1 2 3"), ("3 1 2", "zz"), ("abc", "cba")]
    scored = export_saved_model(
        model, params, tmp_path / "lm-score", task_feature_lengths=LENGTHS, mode="score"
    )
    served = _serve(scored.path, [f"{i}\t{t}" for i, t in pairs])
    expected_scores = model.score_batch(params, _prefix_lm_batch(model.vocabulary, pairs))
    np.testing.assert_allclose(served["output_0"], np.asarray(expected_scores), rtol=1e-5, atol=1e-4)
    assert len(set(np.round(served["output_0"], 3))) == 3
