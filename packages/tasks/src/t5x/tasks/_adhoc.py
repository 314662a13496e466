"""A Task built on the fly from a user's own files, for inference without registering anything.

The files hold one example per record: TFRecord files of ``tf.train.Example``,
JSON Lines, or plain text (one input per line). The chosen fields become the
``inputs`` (and optionally ``targets``) text features, tokenized with the given
vocabulary, with EOS appended after trimming to the feature lengths; the text
stays in ``inputs_pretokenized`` / ``targets_pretokenized``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import PurePath
from typing import Any

from t5x.tasks._feature import Feature
from t5x.tasks._lazy_tf import tf
from t5x.tasks._preprocessors import append_eos_after_trim, rekey, tokenize
from t5x.tasks._sources import JsonLinesDataSource, TextLineDataSource, TFExampleDataSource
from t5x.tasks._task import Task

ADHOC_SPLIT = "infer"
FILE_FORMATS = ("tfrecord", "jsonl", "text")
_SUFFIX_FORMATS = {
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfrec": "tfrecord",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".txt": "text",
    ".text": "text",
}


def _format_of(path: str) -> str | None:
    # Sharded names such as ``data.tfrecord-00000-of-00004`` count by the suffix before the shard.
    name = re.sub(r"-\d+-of-\d+$", "", PurePath(path).name)
    return _SUFFIX_FORMATS.get(PurePath(name).suffix.lower())


def _default_name(paths: Sequence[str]) -> str:
    stem = re.sub(r"-\d+-of-\d+$", "", PurePath(paths[0]).name).split(".")[0]
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", stem).strip("_") or "files"
    return f"infer_{stem}"


def adhoc_task(
    files: str | Sequence[str],
    *,
    vocabulary: Any,
    output_vocabulary: Any = None,
    file_format: str | None = None,
    inputs_key: str = "inputs",
    targets_key: str | None = None,
    name: str | None = None,
    add_eos: bool = True,
    postprocess_fn: Any = None,
) -> Task:
    """A Task (not registered) whose split ``"infer"`` reads ``files``.

    Args:
      files: a path, a glob pattern, or a list of them (a comma-separated string
        is split, as a command-line flag gives it).
      vocabulary: the vocabulary of ``inputs`` (and of ``targets`` unless
        ``output_vocabulary`` is given); usually the model's.
      output_vocabulary: the vocabulary of ``targets``.
      file_format: ``"tfrecord"``, ``"jsonl"`` or ``"text"``; None: from the file
        suffix (``.tfrecord``/``.tfrec``, ``.jsonl``/``.json``, ``.txt``).
      inputs_key: the TFExample feature or JSON field holding the input text
        (for text files, every line is the input).
      targets_key: the feature or field holding the target text, if any; without
        it ``targets`` is empty (scoring needs it).
      name: the task's name (it names the output files); default
        ``infer_<stem of the first file>``.
      add_eos: append EOS to both features.
      postprocess_fn: applied to decoded predictions, as a registered task's.

    Returns:
      The Task.

    Raises:
      ValueError: no files, an unknown or undeterminable format, or a target
        field for text files.
    """
    paths = [p.strip() for p in files.split(",")] if isinstance(files, str) else [str(p) for p in files]
    paths = [p for p in paths if p]
    if not paths:
        raise ValueError("adhoc_task: no input files given (INFER_INPUT_FILES)")
    if file_format is None:
        formats = {_format_of(p) for p in paths}
        if None in formats or len(formats) != 1:
            raise ValueError(
                f"adhoc_task: cannot tell the format of {paths} from their suffixes; "
                f"set file_format to one of {', '.join(FILE_FORMATS)}"
            )
        file_format = formats.pop()
    if file_format not in FILE_FORMATS:
        raise ValueError(
            f"adhoc_task: file_format must be one of {', '.join(FILE_FORMATS)}, got {file_format!r}"
        )
    fields = [inputs_key] + ([targets_key] if targets_key else [])
    patterns = {ADHOC_SPLIT: paths}
    if file_format == "tfrecord":
        description = {k: tf.io.FixedLenFeature([], tf.string) for k in fields}
        source: Any = TFExampleDataSource(patterns, feature_description=description)
    elif file_format == "jsonl":
        specs = {k: tf.TensorSpec([], tf.string) for k in fields}
        source = JsonLinesDataSource(patterns, fields=specs)
    else:
        if targets_key:
            raise ValueError(
                f"adhoc_task: text files hold one input per line and no targets; got targets_key={targets_key!r}"
            )
        source = TextLineDataSource(patterns, text_key=inputs_key)
    features = {
        "inputs": Feature(vocabulary, add_eos=add_eos),
        "targets": Feature(
            output_vocabulary if output_vocabulary is not None else vocabulary, add_eos=add_eos
        ),
    }
    key_map = {"inputs": inputs_key, "targets": targets_key}
    return Task(
        name or _default_name(paths),
        source,
        output_features=features,
        preprocessors=[functools.partial(rekey, key_map=key_map), tokenize, append_eos_after_trim],
        postprocess_fn=postprocess_fn,
    )
