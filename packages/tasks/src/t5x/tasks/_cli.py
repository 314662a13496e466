"""The ``t5x-tasks`` command: list registered tasks and print examples."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np


def _parse_lengths(items: Sequence[str]) -> dict[str, int] | None:
    if not items:
        return None
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise SystemExit(f"t5x-tasks: --sequence-length takes FEATURE=INT, got {item!r}")
        out[key] = int(value)
    return out


def _describe(provider: Any) -> str:
    features = ", ".join(provider.output_features)
    return f"splits: {', '.join(provider.splits)}; features: {features}"


def _cmd_list(args: argparse.Namespace) -> int:
    from t5x.tasks._registry import MixtureRegistry, TaskRegistry

    print("Tasks:")
    for name in TaskRegistry.names():
        print(f"  {name}  ({_describe(TaskRegistry.get(name))})")
    print("Mixtures:")
    for name in MixtureRegistry.names():
        mixture = MixtureRegistry.get(name)
        print(f"  {name}  (tasks: {', '.join(t.name for t in mixture.tasks)})")
    return 0


def _format_value(value: Any, vocabulary: Any | None) -> list[str]:
    if isinstance(value, bytes):
        return [repr(value.decode("utf-8", errors="replace"))]
    array = np.asarray(value)
    lines = [f"ids ({array.shape[0] if array.ndim else 1}): {array.tolist()}"]
    if vocabulary is not None and array.ndim == 1 and np.issubdtype(array.dtype, np.integer):
        lines.append(f"text: {vocabulary.decode([int(i) for i in array])!r}")
    return lines


def _cmd_inspect(args: argparse.Namespace) -> int:
    import tensorflow as tf

    from t5x.tasks._registry import get_mixture_or_task
    from t5x.tasks._sources import data_source_error

    provider = get_mixture_or_task(args.task)
    ds = provider.get_dataset(
        sequence_length=_parse_lengths(args.sequence_length),
        split=args.split,
        shuffle=False,
        seed=args.seed,
        num_epochs=1,
    )
    features = provider.output_features
    failure = None
    try:
        examples = list(ds.take(args.n).as_numpy_iterator())
    except tf.errors.OpError as error:
        failure = data_source_error(error, [(t.name, t.source, args.split) for t in provider.tasks])
        if failure is None:
            raise
    if failure is not None:
        raise failure  # outside the handler: TensorFlow's error holds the broken iterator
    for index, example in enumerate(examples):
        print(f"--- example {index} ---")
        for key in sorted(example):
            feature = features.get(key)
            lines = _format_value(example[key], feature.vocabulary if feature else None)
            print(f"{key}: {lines[0]}")
            for line in lines[1:]:
                print(f"  {line}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t5x-tasks", description="Inspect t5x tasks and mixtures.")
    parser.add_argument(
        "--module",
        action="append",
        default=[],
        help="import this module first (it registers tasks); repeatable",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list registered tasks and mixtures")
    sub.add_parser("cache", help="cache tasks offline with Apache Beam (see `t5x-tasks cache --help`)")
    inspect = sub.add_parser("inspect", help="print preprocessed examples as ids and text")
    inspect.add_argument("task", help="a registered task or mixture name")
    inspect.add_argument("--split", default="train")
    inspect.add_argument("--n", type=int, default=3, help="how many examples")
    inspect.add_argument("--seed", type=int, default=0)
    inspect.add_argument(
        "--sequence-length", nargs="*", default=[], metavar="FEATURE=INT", help="e.g. inputs=512 targets=114"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``t5x-tasks`` with ``argv`` (default: the process arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["cache"]:
        # Everything after `cache` belongs to the cache job, whose unknown flags are Beam options.
        from t5x.tasks._cache_cli import main as cache_main

        return cache_main(argv[1:])
    args = build_parser().parse_args(argv)
    for module in args.module:
        importlib.import_module(module)
    try:
        if args.command == "list":
            return _cmd_list(args)
        return _cmd_inspect(args)
    except (KeyError, ValueError, FileNotFoundError) as e:
        print(f"t5x-tasks: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
