"""The job behind ``t5x-launch infer``: predictions or scores for every example of a split.

Each task of the mixture (or the task, or an ad-hoc task read from the user's
files) gets its own JSON Lines file in input order,
``<output_dir>/<task>-<mode>.jsonl-<shard>-of-<shards>`` (upstream t5x's names),
one line per example::

    {"index": 0, "inputs": {"inputs_pretokenized": "...", "targets_pretokenized": "..."},
     "target": "...", "prediction": "...", "aux": {"scores": -1.3}}

(``"score"`` instead of ``"prediction"`` and ``"aux"`` in mode ``"score"``).
``prediction`` and ``target`` are postprocessed by the task's ``postprocess_fn``;
``inputs`` holds the example's fields chosen by ``input_fields_to_include``.
Work is written in resumable chunks (``t5x.training.infer``): a job run again
after a kill goes on from its last chunk, and a finished file is not redone.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from t5x.launch._assembly import (
    check_components,
    check_prompts,
    check_vocabularies,
    feature_converter_for,
    get_provider,
)
from t5x.launch._configs import DatasetConfig
from t5x.launch._errors import ConfigurationError
from t5x.launch._inference import DecodeProgress
from t5x.launch._jobs import _default_partitioner, _restore_params
from t5x.launch._platform import apply_cpu_kernels_override
from t5x.tasks import EXAMPLE_FIELD

MODES = ("predict", "score", "predict_with_aux")


def output_file_name(task_name: str, mode: str, shard_index: int, num_shards: int) -> str:
    """``<task>-<mode>.jsonl-SSSSS-of-NNNNN`` (a ``/`` of the task name becomes ``_``)."""
    return f"{task_name.replace('/', '_')}-{mode}.jsonl-{shard_index:05d}-of-{num_shards:05d}"


def _json_compat(value: Any) -> Any:
    """Numpy values, bytes and nested containers as JSON values (text decoded as UTF-8)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        return _json_compat(value.item()) if value.ndim == 0 else [_json_compat(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _json_compat(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_compat(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def input_field_filter(
    input_fields_to_include: Sequence[str] | None, include_all_inputs: bool
) -> Callable[[str], bool]:
    """Which fields of an example go into a line's ``inputs`` (upstream's rule).

    None: the ``*_pretokenized`` text fields only; a list: the fields named and
    the ``_pretokenized`` text of each; ``include_all_inputs``: every field.
    """
    if include_all_inputs and input_fields_to_include is not None:
        raise ConfigurationError(
            "infer: set include_all_inputs or input_fields_to_include, not both "
            f"(got include_all_inputs=True and input_fields_to_include={list(input_fields_to_include)!r})"
        )
    if include_all_inputs:
        return lambda name: True
    if input_fields_to_include is None:
        return lambda name: name.endswith("_pretokenized")
    if isinstance(input_fields_to_include, str):
        raise ConfigurationError(
            f"infer: input_fields_to_include must be a list of field names, got the string {input_fields_to_include!r}"
        )
    wanted = set(input_fields_to_include)
    return lambda name: (
        name in wanted or (name.endswith("_pretokenized") and name[: -len("_pretokenized")] in wanted)
    )


def _target_text(example: Mapping[str, Any], vocabulary: Any) -> str | None:
    if "targets_pretokenized" in example:
        text = _json_compat(example["targets_pretokenized"])
        return text if isinstance(text, str) else None
    if "targets" in example and vocabulary is not None:
        return str(vocabulary.decode([int(t) for t in np.asarray(example["targets"]).reshape(-1)]))
    return None


def line_builder(
    task: Any, mode: str, vocabulary: Any, keep: Callable[[str], bool]
) -> Callable[[int, Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]:
    """``record_fn`` for ``t5x.training.infer``: one JSON line of ``task``'s example and outputs."""

    def postprocess(text: str, example: Mapping[str, Any], is_target: bool) -> Any:
        try:
            return task.postprocess_fn(text, example=example, is_target=is_target)
        except Exception as error:
            error.add_note(f"raised by the postprocess_fn of task {task.name!r} on {text!r}")
            raise

    def record(index: int, fields: Mapping[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
        example = fields[EXAMPLE_FIELD]  # the task's example, as t5x.tasks.ExampleBatches gives it
        line: dict[str, Any] = {
            "index": index,
            "inputs": {k: _json_compat(v) for k, v in example.items() if keep(k)},
        }
        target = _target_text(example, vocabulary)
        if target:
            line["target"] = _json_compat(postprocess(target, example, True))
        if mode == "score":
            line["score"] = _json_compat(outputs["score"])
            return line
        ids = [int(t) for t in np.asarray(outputs["prediction"]).reshape(-1)]
        line["prediction"] = _json_compat(postprocess(vocabulary.decode(ids), example, False))
        line["aux"] = _json_compat(outputs.get("aux", {"scores": outputs["score"]}))
        return line

    return record


def _provider(
    model: Any,
    dataset_cfg: DatasetConfig,
    input_files: str | Sequence[str] | None,
    input_file_format: str | None,
    inputs_key: str,
    targets_key: str | None,
) -> tuple[Any, str]:
    """The task or mixture to infer on, and its split."""
    if input_files:
        import t5x.tasks

        vocabulary = getattr(model, "input_vocabulary", None) or getattr(model, "vocabulary", None)
        try:
            task = t5x.tasks.adhoc_task(
                input_files,
                vocabulary=vocabulary,
                output_vocabulary=getattr(model, "output_vocabulary", None),
                file_format=input_file_format,
                inputs_key=inputs_key,
                targets_key=targets_key,
            )
        except ValueError as error:
            raise ConfigurationError(f"INFER_INPUT_FILES: {error}") from None
        return task, t5x.tasks.ADHOC_SPLIT
    if not dataset_cfg.mixture_or_task_name:
        raise ConfigurationError(
            "infer needs data: set MIXTURE_OR_TASK_NAME (a registered task or mixture) "
            "or INFER_INPUT_FILES (your own TFRecord / JSON Lines / text files)"
        )
    provider = get_provider(dataset_cfg)
    check_vocabularies(model, provider)
    return provider, dataset_cfg.split


def _check_shards(shard_id: Any, num_shards: Any) -> None:
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise ConfigurationError(f"infer.num_shards must be an int >= 1, got {num_shards!r}")
    if not isinstance(shard_id, int) or isinstance(shard_id, bool) or not 0 <= shard_id < num_shards:
        raise ConfigurationError(
            f"infer.shard_id must be an int in [0, {num_shards - 1}] (num_shards={num_shards}), got {shard_id!r}"
        )


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
    shard_id: int = 0,
    num_shards: int = 1,
    checkpoint_period: int = 100,
    input_fields_to_include: Sequence[str] | None = None,
    include_all_inputs: bool = False,
    input_files: str | Sequence[str] | None = None,
    input_file_format: str | None = None,
    inputs_key: str = "inputs",
    targets_key: str | None = None,
) -> list[str]:
    """Predicts or scores every example of a split, one JSON Lines file per task.

    Args:
      model: the Model.
      dataset_cfg: the task or mixture, split, lengths and batch size (its
        ``mixture_or_task_name`` and ``split`` are unused with ``input_files``).
      checkpoint_path: a ``checkpoint_<step>`` folder, or a model folder (latest).
      output_dir: where the files go.
      mode: ``"predict"`` (decoded, postprocessed predictions with their aux
        values), ``"predict_with_aux"`` (the same) or ``"score"`` (the log
        likelihood of each example's targets).
      partitioner: default ``PjitPartitioner(num_partitions=1)``.
      random_seed: sampling seed.
      decode_kwargs: passed to the model's ``predict_batch_with_aux``.
      shard_id: which shard of the split this job infers ...
      num_shards: ... out of this many jobs; each writes its own files.
      checkpoint_period: batches per resumable chunk.
      input_fields_to_include: the example fields written under ``inputs``
        (None: the ``*_pretokenized`` text; names also bring their
        ``_pretokenized`` text).
      include_all_inputs: write every field of the example (tokens too).
      input_files: infer on these files instead of a registered task: TFRecord
        of ``tf.train.Example``, JSON Lines or text lines (see
        ``t5x.tasks.adhoc_task``), tokenized with the model's vocabulary.
      input_file_format: ``"tfrecord"``, ``"jsonl"`` or ``"text"`` (None: by suffix).
      inputs_key: the feature / JSON field of the input text in ``input_files``.
      targets_key: the feature / JSON field of the target text, if any.

    Returns:
      The files written, one per task (``<task>-<mode>.jsonl-SSSSS-of-NNNNN``).

    Raises:
      ConfigurationError: an unknown mode, bad shard numbers, no data named, or
        unusable input files.
    """
    import t5x.tasks
    import t5x.training
    from t5x.interfaces import ShardInfo

    if mode not in MODES:
        raise ConfigurationError(f"infer mode (INFER_MODE) must be one of {', '.join(MODES)}, got {mode!r}")
    _check_shards(shard_id, num_shards)
    if not isinstance(checkpoint_period, int) or checkpoint_period < 1:
        raise ConfigurationError(f"infer.checkpoint_period must be an int >= 1, got {checkpoint_period!r}")
    keep = input_field_filter(input_fields_to_include, include_all_inputs)
    apply_cpu_kernels_override(model, os.environ)
    partitioner = _default_partitioner(partitioner)
    provider, split = _provider(model, dataset_cfg, input_files, input_file_format, inputs_key, targets_key)
    if mode != "score":
        check_prompts(model, provider, f"infer mode {mode!r}")
    converter = feature_converter_for(model, pack=False)
    check_components(model=model, partitioner=partitioner, feature_converter=converter)
    params, _ = _restore_params(
        model, partitioner, converter, dataset_cfg, checkpoint_path, None, random_seed
    )
    layout = partitioner.get_data_layout(dataset_cfg.batch_size)
    # Jobs split the split; within a job each data-parallel host reads its part of the job's shard.
    shard = ShardInfo(
        index=shard_id * layout.num_shards + layout.shard_id, num_shards=num_shards * layout.num_shards
    )
    directory = pathlib.Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    tasks = [t for t in provider.tasks if split in t.splits]
    if not tasks:
        raise ConfigurationError(f"{provider.name!r}: no task has a split {split!r}")
    compiled: dict[Any, Any] = {}  # one compilation per batch shape for all the tasks
    written = []
    for task in tasks:
        feature = task.output_features.get("targets")
        vocabulary = feature.vocabulary if feature is not None else getattr(model, "output_vocabulary", None)
        batches = t5x.tasks.ExampleBatches(
            task,
            converter,
            dataset_cfg.task_feature_lengths,
            split=split,
            rows=layout.per_shard_batch_size,
            shard_info=shard,
            use_cached=dataset_cfg.use_cached,
            seed=dataset_cfg.seed,
        )
        total = task.num_input_examples(split) if shard.num_shards == 1 else None
        output = directory / output_file_name(task.name, mode, shard.index, shard.num_shards)
        written.append(
            t5x.training.infer(
                model,
                params,
                partitioner,
                DecodeProgress(
                    batches, task.name, total=total, verb="scored" if mode == "score" else "decoded"
                ),
                str(output),
                batch_size=dataset_cfg.batch_size,
                mode="score" if mode == "score" else "predict",
                chunk_batches=checkpoint_period,
                seed=random_seed,
                decode_kwargs=decode_kwargs,
                record_fn=line_builder(task, mode, vocabulary, keep),
                name_data_shards=False,
                compiled_steps=compiled,
            )
        )
    return written
