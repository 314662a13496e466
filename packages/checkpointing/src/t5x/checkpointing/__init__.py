"""The T5X checkpoint format (msgpack + TensorStore zarr) read and written: async, atomic, multi-host."""

from t5x.checkpointing._api import load_t5x_checkpoint, save_t5x_checkpoint
from t5x.checkpointing._checkpointer import Checkpointer, pin_checkpoint, unpin_checkpoint
from t5x.checkpointing._codec import CorruptIndexError
from t5x.checkpointing._huggingface import read_hf_folder, write_hf_folder
from t5x.checkpointing._layouts import model_info, scan_layers, unscan_layers, write_model_info
from t5x.checkpointing._reader import LazyArray
from t5x.checkpointing._specs import UnsafeSpecError

__all__ = [
    "read_hf_folder",
    "write_hf_folder",
    "Checkpointer",
    "CorruptIndexError",
    "LazyArray",
    "UnsafeSpecError",
    "load_t5x_checkpoint",
    "model_info",
    "pin_checkpoint",
    "save_t5x_checkpoint",
    "scan_layers",
    "unpin_checkpoint",
    "unscan_layers",
    "write_model_info",
]
