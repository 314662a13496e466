"""The job behind ``t5x-launch infer``: predictions or scores for every example of a split."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

from t5x.launch._assembly import check_components
from t5x.launch._configs import DatasetConfig
from t5x.launch._inference import DecodeProgress
from t5x.launch._jobs import _default_partitioner, _iterator, _restore_params
from t5x.launch._platform import apply_cpu_kernels_override


def infer(
    *,
    model: Any,
    dataset_cfg: DatasetConfig,
    checkpoint_path: str,
    output_dir: str,
    mode: str = "predict",
    partitioner: Any = None,
    random_seed: int = 0,
    decode_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Predicts or scores every example of a split, writing JSON Lines in input order.

    Returns:
      The path of the JSON Lines file (``<output_dir>/<task>-<split>-<mode>.jsonl``).
    """
    import t5x.training

    apply_cpu_kernels_override(model, os.environ)
    partitioner = _default_partitioner(partitioner)
    provider, converter, batches = _iterator(model, dataset_cfg, partitioner, random_seed, train=False)
    check_components(model=model, partitioner=partitioner, feature_converter=converter, iterator=batches)
    params, _ = _restore_params(
        model, partitioner, converter, dataset_cfg, checkpoint_path, None, random_seed
    )
    directory = pathlib.Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    vocabulary = getattr(model, "output_vocabulary", None)
    output = directory / f"{provider.name}-{dataset_cfg.split}-{mode}.jsonl"
    return t5x.training.infer(
        model,
        params,
        partitioner,
        DecodeProgress(batches, provider.name, verb="decoded" if mode == "predict" else "scored"),
        str(output),
        batch_size=dataset_cfg.batch_size,
        mode=mode,
        decode_fn=(lambda ids: vocabulary.decode([int(i) for i in ids]))
        if vocabulary is not None and mode == "predict"
        else None,
        seed=random_seed,
        decode_kwargs=decode_kwargs,
    )
