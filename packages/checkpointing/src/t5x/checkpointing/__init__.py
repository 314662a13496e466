"""The T5X checkpoint format (msgpack + TensorStore zarr) read and written: async, atomic, multi-host."""

from t5x.checkpointing._api import load_t5x_checkpoint, save_t5x_checkpoint
from t5x.checkpointing._checkpointer import Checkpointer, pin_checkpoint, unpin_checkpoint
from t5x.checkpointing._codec import CorruptIndexError
from t5x.checkpointing._errors import CheckpointIntegrityError
from t5x.checkpointing._host_local import HostChunk, save_host_local
from t5x.checkpointing._huggingface import (
    HfFolderError,
    HfTokenizerInfo,
    read_hf_folder,
    read_hf_tokenizer_info,
    write_hf_folder,
    write_hf_tokenizer,
)
from t5x.checkpointing._layouts import model_info, scan_layers, unscan_layers, write_model_info
from t5x.checkpointing._mtf import mtf_checkpoint_prefix, read_mtf_checkpoint
from t5x.checkpointing._reader import LazyArray
from t5x.checkpointing._specs import UnsafeSpecError, choose_chunk_shape
from t5x.checkpointing._verify import VerificationReport, verify_checkpoint

__all__ = [
    "HostChunk",
    "choose_chunk_shape",
    "save_host_local",
    "HfFolderError",
    "HfTokenizerInfo",
    "read_hf_folder",
    "read_hf_tokenizer_info",
    "write_hf_tokenizer",
    "read_mtf_checkpoint",
    "mtf_checkpoint_prefix",
    "write_hf_folder",
    "Checkpointer",
    "CheckpointIntegrityError",
    "CorruptIndexError",
    "LazyArray",
    "UnsafeSpecError",
    "VerificationReport",
    "load_t5x_checkpoint",
    "model_info",
    "pin_checkpoint",
    "save_t5x_checkpoint",
    "scan_layers",
    "unpin_checkpoint",
    "unscan_layers",
    "verify_checkpoint",
    "write_model_info",
]
