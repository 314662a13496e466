"""The job behind ``t5x-launch eval``: inference evaluation of checkpoints."""

from __future__ import annotations

import os
import pathlib
from typing import Any

from t5x.launch._assembly import check_components, feature_converter_for
from t5x.launch._configs import DatasetConfig
from t5x.launch._inference import inference_metrics
from t5x.launch._jobs import JobResult, _default_partitioner, _print_inference, _restore_params, _writers
from t5x.launch._platform import apply_cpu_kernels_override


def evaluate(
    *,
    model: Any,
    dataset_cfg: DatasetConfig,
    checkpoint_path: str,
    output_dir: str,
    steps: str | int = "latest",
    partitioner: Any = None,
    max_examples: int | None = None,
    random_seed: int = 0,
    show_predictions: int = 0,
) -> list[JobResult]:
    """Inference evaluation of one, the latest or all checkpoints under ``checkpoint_path``.

    Args:
      steps: ``"latest"``, ``"all"`` or a step number; ignored when
        ``checkpoint_path`` is a ``checkpoint_<step>`` folder.

    Returns:
      One JobResult per evaluated checkpoint.
    """
    apply_cpu_kernels_override(model, os.environ)
    partitioner = _default_partitioner(partitioner)
    converter = feature_converter_for(model, pack=False)
    check_components(model=model, partitioner=partitioner, feature_converter=converter)
    path = pathlib.Path(checkpoint_path)
    if path.name.startswith("checkpoint_") or steps == "latest":
        wanted: list[int | None] = [None]
    elif steps == "all":
        wanted = sorted(  # type: ignore[assignment]  # list[int] is a fine list[int | None]
            int(p.name.split("_")[1]) for p in path.glob("checkpoint_*") if p.name.split("_")[1].isdigit()
        )
        if not wanted:
            raise FileNotFoundError(f"no checkpoint_<step> folder in {path}")
    else:
        wanted = [int(steps)]
    results = []
    writer = _writers(pathlib.Path(output_dir), None)
    try:
        for step in wanted:
            params, restored_step = _restore_params(
                model, partitioner, converter, dataset_cfg, checkpoint_path, step, random_seed
            )
            reports = inference_metrics(
                model,
                params,
                partitioner,
                dataset_cfg,
                pathlib.Path(output_dir),
                step=restored_step,
                max_examples=max_examples,
                writer=writer,
            )
            _print_inference(reports, show_predictions)
            results.append(JobResult(step=restored_step, inference=reports, model_dir=output_dir))
    finally:
        writer.close()
    return results
