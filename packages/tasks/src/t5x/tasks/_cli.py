"""The ``t5x-tasks`` command: list registered tasks and print examples."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

# Old spellings still accepted (with a note on stderr): the flags now follow
# t5x-launch's and seqio's underscores.
RENAMED_FLAGS = {"--module": "--module_import", "--sequence-length": "--sequence_length"}


def _parse_lengths(items: Sequence[str]) -> dict[str, int] | None:
    if not items:
        return None
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise SystemExit(f"t5x-tasks: --sequence_length takes FEATURE=INT, got {item!r}")
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
    import numpy as np

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


def _add_module_flag(parser: argparse.ArgumentParser, dest: str) -> None:
    parser.add_argument(
        "--module_import",
        dest=dest,
        action="append",
        default=[],
        help="import this module first (it registers tasks; the current folder is searched); repeatable",
    )
    parser.add_argument("--module", dest=dest, action="append", help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="t5x-tasks",
        description="Inspect t5x tasks and mixtures (the built-in ones and those your modules register).",
    )
    _add_module_flag(parser, "modules")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="list registered tasks and mixtures")
    _add_module_flag(listing, "sub_modules")
    # Only reached when `cache` is not the first argument (main hands `cache ...` to the cache job).
    sub.add_parser("cache", help="cache tasks offline with Apache Beam (see `t5x-tasks cache --help`)")
    inspect = sub.add_parser("inspect", help="print preprocessed examples as ids and text")
    _add_module_flag(inspect, "sub_modules")
    inspect.add_argument("task", help="a registered task or mixture name")
    inspect.add_argument("--split", default="train")
    inspect.add_argument("--n", type=int, default=3, help="how many examples")
    inspect.add_argument("--seed", type=int, default=0)
    inspect.add_argument(
        "--sequence_length", nargs="*", default=[], metavar="FEATURE=INT", help="e.g. inputs=512 targets=114"
    )
    inspect.add_argument("--sequence-length", dest="sequence_length", nargs="*", help=argparse.SUPPRESS)
    return parser


def warn_renamed_flags(argv: Sequence[str], prog: str = "t5x-tasks") -> None:
    """Prints a note for each old flag spelling in ``argv``."""
    for arg in argv:
        old = arg.split("=", 1)[0]
        if old in RENAMED_FLAGS:
            print(f"{prog}: {old} is deprecated; use {RENAMED_FLAGS[old]}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``t5x-tasks`` with ``argv`` (default: the process arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["cache"]:
        # Everything after `cache` belongs to the cache job, whose unknown flags are Beam options.
        from t5x.tasks._cache_cli import main as cache_main

        return cache_main(argv[1:])
    args = build_parser().parse_args(argv)
    warn_renamed_flags(argv)
    from t5x.tasks._task_modules import import_task_modules
    from t5x.tasks.builtin import register_builtin_tasks

    if args.command == "cache":
        print(
            "t5x-tasks: error: write `cache` first: t5x-tasks cache --module_import=M --tasks=T",
            file=sys.stderr,
        )
        return 2
    try:
        register_builtin_tasks()  # first, so a user module may build mixtures of them
        import_task_modules([*args.modules, *getattr(args, "sub_modules", [])])
        if args.command == "list":
            return _cmd_list(args)
        return _cmd_inspect(args)
    except (KeyError, ValueError, FileNotFoundError) as e:
        print(f"t5x-tasks: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
