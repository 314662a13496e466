"""SentencePiece, byte, pass-through and Hugging Face vocabularies with seqio-compatible ids.

Importing this package imports neither JAX nor TensorFlow; TensorFlow is
imported the first time a ``*_tf`` method runs.
"""

from t5x.vocabularies._base import PAD_ID
from t5x.vocabularies._byte import ByteVocabulary
from t5x.vocabularies._hooks import Vocabulary
from t5x.vocabularies._huggingface import HuggingFaceVocabulary
from t5x.vocabularies._passthrough import PassThroughVocabulary
from t5x.vocabularies._sentencepiece import SentencePieceVocabulary

__all__ = [
    "PAD_ID",
    "ByteVocabulary",
    "HuggingFaceVocabulary",
    "PassThroughVocabulary",
    "SentencePieceVocabulary",
    "Vocabulary",
]
