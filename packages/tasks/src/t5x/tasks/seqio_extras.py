"""What ``t5x.seqio`` builds seqio's API from, beyond the core ``t5x.tasks`` names.

seqio's helpers that the core API does not offer under these names: seqio's
cache layout (read side), tf.Example codecs, trimming/padding and mixing-rate
helpers, and the seeds random preprocessors draw from. Importing this module
imports TensorFlow.
"""

from t5x.tasks._offline_cache import read_cached_split
from t5x.tasks._seqio_cache import (
    COMPLETED,
    get_cached_info_path,
    get_cached_stats_path,
    get_cached_tfrecord_prefix,
    get_task_dir_from_name,
    is_seqio_cache,
    read_seqio_cache,
    read_stats,
    shard_files_of,
)
from t5x.tasks._seqio_compat import (
    ContinuousFeature,
    ProtoDataSource,
    apply_feature_converter,
    get_dataset,
    list_files,
    mixing_rate_num_characters,
    mixing_rate_num_examples,
    preprocess_tensorflow_examples,
    trim_and_pad_dataset,
    trim_dataset,
    truncate_inputs_left,
)
from t5x.tasks._tfexample import (
    dict_to_tfexample,
    flatten_dict,
    tfexample_ragged_length_key,
    tfexample_sparse_indices_key,
    tfexample_to_dict,
    unflatten_dict,
)
from t5x.tasks._utils import _SEED_SCOPES, as_seed_tensor, fold_seed, preprocessor_seed_scope


def in_preprocessor_seed_scope() -> bool:
    """Whether a ``preprocessor_seed_scope`` is active (a core pipeline is seeding preprocessors)."""
    return bool(_SEED_SCOPES)


__all__ = [
    "COMPLETED",
    "ContinuousFeature",
    "ProtoDataSource",
    "apply_feature_converter",
    "as_seed_tensor",
    "dict_to_tfexample",
    "flatten_dict",
    "fold_seed",
    "get_cached_info_path",
    "get_cached_stats_path",
    "get_cached_tfrecord_prefix",
    "get_dataset",
    "get_task_dir_from_name",
    "in_preprocessor_seed_scope",
    "is_seqio_cache",
    "list_files",
    "mixing_rate_num_characters",
    "mixing_rate_num_examples",
    "preprocess_tensorflow_examples",
    "preprocessor_seed_scope",
    "read_cached_split",
    "read_seqio_cache",
    "read_stats",
    "shard_files_of",
    "tfexample_ragged_length_key",
    "tfexample_sparse_indices_key",
    "tfexample_to_dict",
    "trim_and_pad_dataset",
    "trim_dataset",
    "truncate_inputs_left",
    "unflatten_dict",
]
