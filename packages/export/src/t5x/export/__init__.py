"""TensorFlow SavedModels of T5X encoder-decoders for serving: raw text in, decoded text and scores out.

Importing this package imports JAX and TensorFlow. The SavedModels it writes need
TensorFlow only (plus ``tensorflow_text`` for SentencePiece vocabularies).
"""

from t5x.export._errors import ExportError
from t5x.export._export import (
    INPUT_NAME,
    METADATA_FILE,
    REFERENCE_FILE,
    SIGNATURE,
    ExportedModel,
    export_saved_model,
    reference_outputs,
)
from t5x.export._stablehlo import target_version as stablehlo_target_version
from t5x.export._warmup import WARMUP_FILE, write_warmup_requests

__all__ = [
    "INPUT_NAME",
    "METADATA_FILE",
    "REFERENCE_FILE",
    "SIGNATURE",
    "WARMUP_FILE",
    "ExportError",
    "ExportedModel",
    "export_saved_model",
    "reference_outputs",
    "stablehlo_target_version",
    "write_warmup_requests",
]
