"""The ``t5x-launch`` command line."""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from t5x.launch._gin_config import (
    GinArgs,
    GinConfigError,
    check_required_macros,
    explain_gin_error,
    macro_value,
    parse_gin,
    split_gin_flags,
    write_config_gin,
)

DEMO_GIN = "runs/demo.gin"
_GIN_HELP = (
    "gin flags: --gin_file=FILE (repeatable; shipped configs such as models/t5_1_1/small.gin are found "
    "by relative path), --gin.NAME=VALUE (e.g. --gin.MODEL_DIR=/tmp/run), --gin_bindings='NAME = VALUE' "
    "(repeatable), --gin_search_paths=DIR (repeatable)"
)


def _add_gin_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gin_file", action="append", default=[], help="a gin file to parse (repeatable)")
    parser.add_argument(
        "--gin_bindings", action="append", default=[], help="a gin binding 'NAME = VALUE' (repeatable)"
    )
    parser.add_argument(
        "--gin_search_paths",
        action="append",
        default=[],
        help="a folder to look for gin files in (repeatable)",
    )


def _gin_args(args: argparse.Namespace, extra_bindings: Sequence[str]) -> GinArgs:
    paths = [p for entry in args.gin_search_paths for p in entry.split(",") if p]
    return GinArgs(tuple(args.gin_file), (*args.gin_bindings, *extra_bindings), tuple(paths))


def _run_configured(job: Callable[..., Any], output_macro: str) -> Any:
    """Calls the gin-configured ``job`` and writes config.gin into its output folder."""
    import gin

    check_required_macros()
    if macro_value(output_macro) is gin.REQUIRED:
        raise GinConfigError(
            f"the macro {output_macro} is required: set it with --gin.{output_macro}=/path/to/folder"
        )
    configured = gin.get_configurable(job)
    try:
        result = configured()
    except (ValueError, TypeError) as error:
        if "gin" in str(error) or "macro" in str(error):
            raise explain_gin_error(error) from None
        raise
    import jax

    if jax.process_index() == 0:
        write_config_gin(pathlib.Path(str(macro_value(output_macro))))
    return result


def _cmd_train(args: argparse.Namespace, bindings: list[str]) -> int:
    from t5x.launch._distributed import maybe_initialize_distributed

    maybe_initialize_distributed()
    import t5x.launch

    demo = not args.gin_file
    parse_gin(_gin_args(args, bindings), default_files=[DEMO_GIN])
    if demo:
        import gin

        if macro_value("MODEL_DIR") is gin.REQUIRED:
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            gin.bind_parameter("MODEL_DIR/macro.value", str(pathlib.Path.cwd() / f"t5x-demo-{stamp}"))
        print(
            f"[t5x-launch] demo: training a tiny model on a built-in task into {macro_value('MODEL_DIR')}",
            flush=True,
        )
    result = _run_configured(t5x.launch.train, "MODEL_DIR")
    print(f"[t5x-launch] finished at step {result.step}; model folder: {result.model_dir}", flush=True)
    return 0


def _cmd_eval(args: argparse.Namespace, bindings: list[str]) -> int:
    import t5x.launch

    parse_gin(_gin_args(args, bindings))
    results = _run_configured(t5x.launch.evaluate, "EVAL_OUTPUT_DIR")
    for result in results:
        for report in result.inference:
            print(f"step {result.step} {report.task}: {report.metrics}")
    return 0


def _cmd_infer(args: argparse.Namespace, bindings: list[str]) -> int:
    import t5x.launch

    parse_gin(_gin_args(args, bindings))
    path = _run_configured(t5x.launch.infer, "INFER_OUTPUT_DIR")
    print(f"[t5x-launch] wrote {path}")
    return 0


def _cmd_inspect_task(args: argparse.Namespace, _: list[str]) -> int:
    from t5x.tasks._cli import main as tasks_main

    return tasks_main(["inspect", args.task, "--split", args.split, "--n", str(args.n)])


def _cmd_cache_tasks(args: argparse.Namespace, _: list[str]) -> int:
    from t5x.tasks._cache_cli import main as cache_main

    return cache_main(args.cache_args)


def _cmd_model_info(args: argparse.Namespace, bindings: list[str]) -> int:
    import gin
    import jax

    from t5x.checkpointing import model_info

    parse_gin(_gin_args(args, bindings))
    check_required_macros()
    model: Any = macro_value("MODEL")
    if model is gin.REQUIRED:
        raise GinConfigError(
            "the macro MODEL is not set: pass a model gin file, e.g. --gin_file=models/t5_1_1/small.gin"
        )
    lengths = {"inputs": args.inputs_length, "targets": args.targets_length}
    converter = model.feature_converter_cls.resolve()(pack=False)
    shapes = {k: (1, v) for k, v in converter.get_model_feature_lengths(lengths).items()}
    variables = jax.eval_shape(lambda rng: model.get_initial_variables(rng, shapes), jax.random.PRNGKey(0))
    print(model_info(variables["params"], variables.get("params_axes")), end="")
    return 0


def _cmd_convert(args: argparse.Namespace, _: list[str]) -> int:
    from t5x.checkpointing import load_t5x_checkpoint, save_t5x_checkpoint, scan_layers, unscan_layers

    state = load_t5x_checkpoint(args.source, restore_dtype=args.dtype)
    if args.layout == "scanned":
        state = dict(state, target=scan_layers(state["target"]))
    elif args.layout == "unscanned":
        state = dict(state, target=unscan_layers(state["target"]))
    step = int(state["state"]["step"])
    path = save_t5x_checkpoint(args.target, step, state)
    print(f"[t5x-launch] wrote {path}")
    return 0


def _cmd_local(args: argparse.Namespace, _: list[str]) -> int:
    from t5x.launch._local import run_local

    return run_local(args.job, args.num_processes, port=args.port, log_dir=args.log_dir)


def _cmd_tpu(args: argparse.Namespace, _: list[str]) -> int:
    from t5x.launch._tpu import run_tpu

    return run_tpu(
        args.job, tpu=args.tpu, zone=args.zone, project=args.project, source=args.source, dry_run=args.dry_run
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``t5x-launch`` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="t5x-launch",
        description="Train, evaluate and serve T5-style models. `t5x-launch train` with no gin file runs the built-in demo.",
        epilog=_GIN_HELP,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Callable[..., int], help_text: str, gin_flags: bool = True
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=help_text, description=help_text, epilog=_GIN_HELP if gin_flags else None
        )
        sub.set_defaults(handler=handler)
        if gin_flags:
            _add_gin_flags(sub)
        return sub

    command("train", _cmd_train, "pretrain or fine-tune (no gin file: the built-in demo)")
    command("eval", _cmd_eval, "inference evaluation of one, the latest or all checkpoints")
    command("infer", _cmd_infer, "predict or score a split to JSON Lines")
    info = command("model-info", _cmd_model_info, "print the parameters of the gin-configured MODEL")
    info.add_argument("--inputs_length", type=int, default=16, help="inputs length to trace the model with")
    info.add_argument("--targets_length", type=int, default=16, help="targets length to trace the model with")

    inspect = command(
        "inspect-task", _cmd_inspect_task, "print examples of a task (t5x-tasks inspect)", gin_flags=False
    )
    inspect.add_argument("task", help="a registered task or mixture")
    inspect.add_argument("--split", default="train")
    inspect.add_argument("--n", type=int, default=3, help="number of examples")

    cache = command(
        "cache-tasks",
        _cmd_cache_tasks,
        "cache tasks offline with Apache Beam (t5x-tasks cache; needs t5x-tasks[beam])",
        gin_flags=False,
    )
    cache.add_argument(
        "cache_args", nargs=argparse.REMAINDER, help="-- then t5x-tasks cache flags and Beam options"
    )

    convert = command("convert", _cmd_convert, "convert a T5X checkpoint (layout, dtype)", gin_flags=False)
    convert.add_argument(
        "--from",
        dest="source",
        required=True,
        help="a checkpoint_<step> folder or a model folder (latest step)",
    )
    convert.add_argument(
        "--to", dest="target", required=True, help="the model folder to write checkpoint_<step> into"
    )
    convert.add_argument("--layout", choices=("scanned", "unscanned", "same"), default="same")
    convert.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)

    local = command(
        "local", _cmd_local, "run a job as N processes on this machine under jax.distributed", gin_flags=False
    )
    local.add_argument("--num_processes", type=int, required=True)
    local.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    local.add_argument(
        "--log_dir", default=None, help="where processes 1..N-1 log (default: a temporary folder)"
    )
    local.add_argument("job", nargs=argparse.REMAINDER, help="-- then the job, e.g. -- train --gin_file=...")

    tpu = command(
        "tpu", _cmd_tpu, "copy, install and run a job on every worker of a TPU VM pod", gin_flags=False
    )
    tpu.add_argument("--tpu", required=True, help="the TPU VM name")
    tpu.add_argument("--zone", required=True)
    tpu.add_argument("--project", default=None)
    tpu.add_argument(
        "--source", default=None, help="the t5x checkout to copy (default: the one installed from)"
    )
    tpu.add_argument("--dry_run", action="store_true", help="print the commands instead of running them")
    tpu.add_argument("job", nargs=argparse.REMAINDER, help="-- then the job, e.g. -- train --gin_file=...")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``t5x-launch``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher = bool(argv) and argv[0] in ("local", "tpu", "cache-tasks")
    rest, bindings = (argv, []) if launcher else split_gin_flags(argv)
    parser = build_parser()
    args = parser.parse_args(rest)
    for name in ("job", "cache_args"):
        rest_args = getattr(args, name, None)
        if rest_args and rest_args[0] == "--":
            setattr(args, name, rest_args[1:])
    try:
        return args.handler(args, bindings)
    except GinConfigError as error:
        print(f"t5x-launch {args.command}: gin configuration error:\n{error}", file=sys.stderr)
        return 2
