"""``t5x-tasks cache``: run the offline cache job as an Apache Beam pipeline."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from t5x.tasks._cli import warn_renamed_flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="t5x-tasks cache",
        description="Cache tasks up to their CacheDatasetPlaceholder with Apache Beam. Arguments not listed "
        "here are Beam pipeline options (e.g. --runner=DataflowRunner --project=... --region=...).",
    )
    parser.add_argument(
        "--module_import",
        action="append",
        default=[],
        help="module that registers the tasks (the current folder is searched); repeatable",
    )
    parser.add_argument("--module", dest="module_import", action="append", help=argparse.SUPPRESS)
    parser.add_argument(
        "--tasks", action="append", required=True, help="task or mixture names, comma-separated; repeatable"
    )
    parser.add_argument(
        "--excluded_tasks",
        default="",
        help="comma-separated tasks to leave out, also when a mixture in --tasks includes them",
    )
    parser.add_argument(
        "--output_cache_dir", required=True, help="cache root (local path or gs://, hdfs://, ...)"
    )
    parser.add_argument("--splits", default="", help="comma-separated splits (default: every split)")
    parser.add_argument(
        "--num_input_shards", type=int, default=None, help="pieces to read non-file sources in"
    )
    parser.add_argument("--num_shards", type=int, default=None, help="output files per split")
    parser.add_argument("--seed", type=int, default=0, help="shuffle and pre-cache preprocessing seed")
    parser.add_argument("--overwrite", action="store_true", help="rebuild caches that are already complete")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parses ``argv`` (our flags + Beam pipeline options), builds and runs the pipeline; returns an exit code."""
    args, beam_args = build_parser().parse_known_args(argv)
    warn_renamed_flags(sys.argv[1:] if argv is None else argv, prog="t5x-tasks cache")
    try:
        import apache_beam  # noqa: F401
    except ImportError:
        print(
            "t5x-tasks cache: needs Apache Beam; install it with `pip install --find-links dist 't5x-tasks[beam]'` (in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md)",
            file=sys.stderr,
        )
        return 2
    before = _cache_entries(args.output_cache_dir)
    try:
        code = _run(args, beam_args)
    except BaseException:
        remove_empty_cache_dirs(args.output_cache_dir, before)
        raise
    if code != 0:
        remove_empty_cache_dirs(args.output_cache_dir, before)
    return code


def _cache_entries(root: str) -> set[str] | None:
    """The names in the cache root, or None when it does not exist yet."""
    import tensorflow as tf

    if not tf.io.gfile.isdir(root):
        return None
    return {name.rstrip("/") for name in tf.io.gfile.listdir(root)}


def remove_empty_cache_dirs(root: str, before: set[str] | None) -> None:
    """After a failed attempt: removes the task folders it left empty, and the root if it made it.

    Args:
      root: the cache root (``--output_cache_dir``).
      before: the root's entries before the attempt (None: the root did not exist).
    """
    import tensorflow as tf

    if not tf.io.gfile.isdir(root):
        return
    for name in _cache_entries(root) or set():
        path = f"{root.rstrip('/')}/{name}"
        if before is not None and name in before:
            continue  # there before: not this attempt's
        if tf.io.gfile.isdir(path) and not tf.io.gfile.listdir(path):
            tf.io.gfile.rmtree(path)
    if before is None and not tf.io.gfile.listdir(root):
        tf.io.gfile.rmtree(root)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from t5x.tasks._beam_cache import add_cache_pipeline
    from t5x.tasks._task_modules import import_task_modules

    names = [t for item in args.tasks for t in item.split(",") if t]
    excluded = [t for t in args.excluded_tasks.split(",") if t]  # removed after mixtures expand
    splits = [s for s in args.splits.split(",") if s] or None
    options = PipelineOptions(beam_args)
    try:
        import_task_modules(args.module_import)
        with beam.Pipeline(options=options) as pipeline:
            scheduled = add_cache_pipeline(
                pipeline,
                names,
                args.output_cache_dir,
                modules=args.module_import,
                excluded_tasks=excluded,
                splits=splits,
                num_input_shards=args.num_input_shards,
                num_output_shards=args.num_shards,
                seed=args.seed,
                overwrite=args.overwrite,
            )
            print(
                f"t5x-tasks cache: caching {', '.join(scheduled) or 'nothing (all complete)'}",
                file=sys.stderr,
            )
    except (KeyError, ValueError) as e:
        print(
            f"t5x-tasks cache: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
