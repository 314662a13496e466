"""Plain TensorFlow (no JAX installed) serves t5x-export's SavedModels with the JAX model's outputs.

Run by the nox session ``export-tf``, which writes the SavedModels first (write_exports.py, in an
environment with JAX) and points T5X_EXPORT_DIR at them.
"""

import importlib
import importlib.util
import json
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

EXPORTS = pathlib.Path(os.environ.get("T5X_EXPORT_DIR", "missing-T5X_EXPORT_DIR"))


def test_environment_has_no_jax():
    for name in ("jax", "jaxlib", "flax", "t5x"):
        assert importlib.util.find_spec(name) is None, (
            f"{name} is installed; this test needs an env without it"
        )


@pytest.mark.parametrize("name", ["byte", "sentencepiece"])
def test_serving_signature_equals_the_jax_model(name):
    folder = EXPORTS / name
    metadata = json.loads((folder / "t5x_export.json").read_text())
    for module in metadata["load_imports"]:
        importlib.import_module(module)  # tensorflow_text registers the SentencePiece op
    reference = json.loads((folder / "reference_predictions.json").read_text())
    serve = tf.saved_model.load(str(folder)).signatures[metadata["signature"]]
    outputs = serve(**{metadata["input"]: tf.constant(reference["inputs"])})
    assert sorted(outputs) == metadata["outputs"] == ["output_0", "output_1"]
    assert [t.decode() for t in outputs["output_0"].numpy()] == reference["output_0"]
    np.testing.assert_allclose(outputs["output_1"].numpy(), reference["output_1"], rtol=1e-5, atol=1e-4)
    # Any batch size: the last text alone gives the same (greedy / beam) decode as in the batch.
    alone = serve(**{metadata["input"]: tf.constant(reference["inputs"][-1:])})
    assert [t.decode() for t in alone["output_0"].numpy()] == reference["output_0"][-1:]
