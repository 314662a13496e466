"""The ``t5x-launch`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from t5x.launch._errors import UserError, is_user_error, user_error_message
from t5x.launch._files_written import print_files_written, print_infer_files
from t5x.launch._gin_config import (
    GinArgs,
    GinBinding,
    GinConfigError,
    check_required_macros,
    configured_job,
    explain_gin_error,
    macro_value,
    parse_gin,
    split_gin_flags,
    write_config_gin,
)
from t5x.launch._malloc import restart_with_malloc_defaults
from t5x.launch._platform import job_runs_on_cpu
from t5x.launch._xla_flags import add_gin_flags, add_xla_defaults

DEMO_GIN = "runs/demo.gin"
# Commands whose process runs XLA programs step after step (the CPU defaults are for them;
# `local` and `tpu` start such processes, which decide for themselves).
_XLA_JOBS = frozenset(
    {"train", "precompile", "eval", "infer", "export", "zero-shot", "lm-eval", "arch-objective-study"}
)
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


# Macros each command reads itself besides MODEL (its output folder, and XLA_FLAGS: a config's
# own XLA flags, see t5x.launch._xla_flags).
_READ_MACROS = {
    "train": ("MODEL_DIR", "XLA_FLAGS", "COMPILATION_CACHE_DIR"),
    "precompile": ("MODEL_DIR", "XLA_FLAGS", "COMPILATION_CACHE_DIR"),
    "eval": ("EVAL_OUTPUT_DIR", "XLA_FLAGS"),
    "infer": ("INFER_OUTPUT_DIR", "XLA_FLAGS"),
}


def _flagged(bindings: Sequence[str]) -> list[str]:
    """``--gin_bindings`` values, remembering their flag for error messages."""
    return [GinBinding(b, f"--gin_bindings={b!r}") for b in bindings]


def _gin_args(args: argparse.Namespace, extra_bindings: Sequence[str]) -> GinArgs:
    paths = [p for entry in args.gin_search_paths for p in entry.split(",") if p]
    return GinArgs(
        tuple(args.gin_file),
        (*_flagged(args.gin_bindings), *extra_bindings),
        tuple(paths),
        _READ_MACROS.get(getattr(args, "command", ""), ()),
    )


def _call_configured(job: Callable[..., Any]) -> Any:
    """Calls ``job`` with its gin bindings; a gin mistake it surfaces is explained as one."""
    import gin

    try:
        return gin.get_configurable(job)()
    except (ValueError, TypeError) as error:
        if not is_user_error(error) and ("gin" in str(error) or "macro" in str(error)):
            raise explain_gin_error(error) from None
        raise


def _run_configured(job: Callable[..., Any], output_macro: str) -> Any:
    """Calls the gin-configured ``job`` and writes config.gin into its output folder."""
    import gin

    check_required_macros()
    if macro_value(output_macro) is gin.REQUIRED:
        raise GinConfigError(
            f"the macro {output_macro} is required: set it with --gin.{output_macro}=/path/to/folder"
        )
    add_gin_flags(os.environ)  # the config's own numerics (the demo's); JAX's backend starts in the job
    result = _call_configured(job)
    import jax

    if jax.process_index() == 0:
        write_config_gin(pathlib.Path(str(macro_value(output_macro))))
    return result


def _cmd_train(args: argparse.Namespace, bindings: list[str]) -> int:
    from t5x.launch._preemption import run_stoppable

    # SIGTERM / SIGINT: the step ends, a checkpoint is saved, exit 143 / 130 (packages/launch/README.md).
    return run_stoppable(lambda: _train(args, bindings))


def _train(args: argparse.Namespace, bindings: list[str]) -> int:
    from t5x.launch._distributed import maybe_initialize_distributed
    from t5x.launch._preemption import Preempted

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
    _use_compilation_cache()
    try:
        # An upstream t5x run file binds its own train (t5x-upstream's, through `__main__`).
        result = _run_configured(configured_job("train", t5x.launch.train), "MODEL_DIR")
    except Preempted as stopped:
        import jax

        if stopped.step is not None and jax.process_index() == 0:
            write_config_gin(pathlib.Path(str(macro_value("MODEL_DIR"))))
        raise
    print(f"[t5x-launch] finished at step {result.step}; model folder: {result.model_dir}", flush=True)
    print_files_written(result.model_dir)
    return 0


def _compilation_cache_dir() -> pathlib.Path | None:
    """COMPILATION_CACHE_DIR when set, else MODEL_DIR/compilation_cache when precompile made it."""
    import gin

    from t5x.launch._precompile import default_cache_dir

    configured = macro_value("COMPILATION_CACHE_DIR")
    if configured is not gin.REQUIRED and configured is not None:
        return pathlib.Path(str(configured))
    model_dir = macro_value("MODEL_DIR")
    if model_dir is gin.REQUIRED or model_dir is None:
        return None
    return default_cache_dir(str(model_dir))


def _use_compilation_cache() -> None:
    """Lets train load the programs precompile compiled (JAX's persistent compilation cache)."""
    import gin

    from t5x.launch._precompile import enable_compilation_cache

    directory = _compilation_cache_dir()
    configured = macro_value("COMPILATION_CACHE_DIR") not in (None, gin.REQUIRED)
    if directory is not None and (configured or directory.is_dir()):
        enable_compilation_cache(directory)


def _cmd_precompile(args: argparse.Namespace, bindings: list[str]) -> int:
    """Compiles train's programs into the persistent compilation cache (see t5x.launch._precompile)."""
    import gin

    import t5x.launch
    from t5x.launch._precompile import precompile

    parse_gin(_gin_args(args, bindings))
    check_required_macros()
    extension_job = configured_job("precompile", _no_job)
    if extension_job is not _no_job:
        # An upstream run file (runs/precompile.gin) binds its own precompile.
        result = _run_configured(extension_job, "MODEL_DIR")
        _print_precompiled(result)
        return 0
    job = configured_job("train", t5x.launch.train)
    if job is not t5x.launch.train:
        raise GinConfigError(
            "precompile reads t5x-launch's train config (launch.train); this config binds another train"
        )
    directory = _compilation_cache_dir()
    if directory is None:
        raise GinConfigError(
            "precompile needs a cache folder: set --gin.COMPILATION_CACHE_DIR=DIR or --gin.MODEL_DIR=DIR "
            "(then MODEL_DIR/compilation_cache)"
        )
    add_gin_flags(os.environ)  # the config's own XLA flags: they are part of the programs' cache key
    _print_precompiled(precompile(**{**gin.get_bindings(job), "cache_dir": str(directory)}))
    return 0


def _no_job() -> None:
    """Stands for "no job bound" in `configured_job` lookups."""


def _print_precompiled(result: Any) -> None:
    from t5x.launch._precompile import TRAIN_PROGRAMS, cache_entries

    for name in TRAIN_PROGRAMS:
        entries = cache_entries(result.cache_dir, name)
        print(
            f"[t5x-launch] precompiled {name} in {result.programs[name]:.1f}s for {result.num_devices} "
            f"device(s): {', '.join(entries) or 'no cache entry (see JAX warnings)'}",
            flush=True,
        )
    print(
        f"[t5x-launch] {len(result.new_entries)} new entries in {result.cache_dir}; a train with the same "
        "config and cache folder loads them",
        flush=True,
    )


def _reusing_gin_args(
    args: argparse.Namespace, bindings: list[str], run_file: str, output_macro: str, subdir: str
) -> GinArgs:
    """The gin flags of ``eval`` / ``infer``; with no model gin file, the model folder's config.gin first."""
    from t5x.launch._reuse_config import reuse_training_config

    given = _gin_args(args, bindings)
    reused = reuse_training_config(
        args.command, run_file, given.files, given.bindings, output_macro=output_macro, output_subdir=subdir
    )
    if reused is None:
        return given
    import jax

    if jax.process_index() == 0:
        print(reused.summary(args.command), flush=True)
    return dataclasses.replace(given, files=reused.files, bindings=reused.bindings)


def _cmd_eval(args: argparse.Namespace, bindings: list[str]) -> int:
    import t5x.launch
    from t5x.launch._preemption import run_stoppable

    def run() -> int:
        parse_gin(_reusing_gin_args(args, bindings, "runs/eval.gin", "EVAL_OUTPUT_DIR", "eval"))
        results = _run_configured(configured_job("eval", t5x.launch.evaluate), "EVAL_OUTPUT_DIR")
        for result in results:
            for report in result.inference:
                print(f"step {result.step} {report.task}: {report.metrics}")
        print_files_written(str(macro_value("EVAL_OUTPUT_DIR")))
        return 0

    # A signal stops the whole evaluation (every checkpoint's), with exit code 143 / 130.
    return run_stoppable(run, hint="run the same command to evaluate again")


def _cmd_infer(args: argparse.Namespace, bindings: list[str]) -> int:
    import t5x.launch
    from t5x.launch._preemption import run_stoppable

    def run() -> int:
        parse_gin(_reusing_gin_args(args, bindings, "runs/infer.gin", "INFER_OUTPUT_DIR", "infer"))
        paths = _run_configured(configured_job("infer", t5x.launch.infer), "INFER_OUTPUT_DIR")
        print_infer_files(paths if isinstance(paths, list) else [paths], str(macro_value("INFER_OUTPUT_DIR")))
        return 0

    return run_stoppable(run, hint="run the same command to resume (written chunks are kept)")


def _cmd_inspect_task(args: argparse.Namespace, _: list[str]) -> int:
    from t5x.tasks.cli import main as tasks_main

    modules = [flag for module in args.module_import for flag in ("--module_import", module)]
    return tasks_main(["inspect", args.task, "--split", args.split, "--n", str(args.n), *modules])


def _cmd_cache_tasks(args: argparse.Namespace, _: list[str]) -> int:
    from t5x.tasks.cli import cache_main

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


def _cmd_convert(args: argparse.Namespace, bindings: list[str]) -> int:
    from t5x.launch._convert import ConvertError, ConvertOptions, convert, parse_endpoint

    try:
        source = parse_endpoint(args.source, "--from")
        target = parse_endpoint(args.target, "--to")
        options = ConvertOptions(
            layout=args.layout,
            dtype=args.dtype,
            vocabulary=args.vocabulary,
            extra_ids=args.extra_ids,
            gin_files=tuple(args.gin_file),
            gin_bindings=(*_flagged(args.gin_bindings), *bindings),
            verify=args.verify,
            tolerance=args.tolerance,
        )
        converted, written = convert(source, target, options)
    except (ConvertError, FileNotFoundError, ImportError, KeyError, RuntimeError, ValueError) as error:
        # Every failure to read, map or write a checkpoint is the user's to fix (exit code 2).
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise UserError(f"error: {message}") from error
    for note in converted.notes:
        print(f"[t5x-launch] note: {note}")
    for path in written:
        print(f"[t5x-launch] wrote {path}")
    if converted.max_logit_difference is not None:
        diff = converted.max_logit_difference
        verdict = "ok" if diff <= args.tolerance else f"FAILED (tolerance {args.tolerance:g})"
        print(f"[t5x-launch] verify: largest absolute logit difference {diff:.3g}: {verdict}")
        if diff > args.tolerance:
            return 1
    return 0


def _cmd_verify(args: argparse.Namespace, _: list[str]) -> int:
    """Checks checkpoints against their checksums: 0 when sound, 1 on damage."""
    from t5x.checkpointing import Checkpointer, CheckpointIntegrityError, verify_checkpoint

    steps = Checkpointer(args.path, async_save=False).all_steps() if args.all_steps else [args.step]
    if args.all_steps and not steps:
        raise FileNotFoundError(f"no complete checkpoint in {args.path}")
    damaged = unverified = 0
    for step in steps:
        try:
            report = verify_checkpoint(args.path, step)
        except CheckpointIntegrityError as error:
            print(f"DAMAGED: {error}", flush=True)
            damaged += 1
            continue
        print(report, flush=True)
        unverified += not report.fully_verified
    if unverified and args.require_checksums:
        print(f"{unverified} checkpoint(s) without checksums (--require_checksums)", file=sys.stderr)
    return 1 if damaged or (unverified and args.require_checksums) else 0


def _cmd_local(args: argparse.Namespace, _: list[str]) -> int:
    from t5x.launch._local import run_local

    return run_local(args.job, args.num_processes, port=args.port, log_dir=args.log_dir)


def _cmd_tpu(args: argparse.Namespace, _: list[str]) -> int:
    from t5x.launch._tpu import run_tpu

    return run_tpu(
        args.job, tpu=args.tpu, zone=args.zone, project=args.project, source=args.source, dry_run=args.dry_run
    )


def _cmd_arch_objective_study(args: argparse.Namespace, bindings: list[str]) -> int:
    from t5x.launch._preemption import run_stoppable
    from t5x.launch._study import run_study

    model_dir = args.model_dir or str(
        pathlib.Path.cwd() / f"t5x-study-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    )

    def run() -> int:
        result = run_study(
            model_dir,
            steps=args.steps,
            architectures=args.architectures.split(","),
            objectives=args.objectives.split(","),
            zero_shot=not args.no_zero_shot,
            zero_shot_tasks=args.zero_shot_tasks.split(",") if args.zero_shot_tasks else None,
            plot=not args.no_plot,
            bindings=bindings,
            log=lambda line: print(line, flush=True),
        )
        print(result.format_table())
        if result.plot_path:
            print(f"[t5x-launch] loss curves: {result.plot_path}")
        print(f"[t5x-launch] study folder: {model_dir}", flush=True)
        return 0

    # A signal stops the whole study (no further combination starts), with exit code 143 / 130;
    # finished combinations are not trained again when it is resumed in the same folder.
    resume = "run the same command" + ("" if args.model_dir else f" with --model_dir={model_dir}")
    return run_stoppable(run, hint=f"{resume} to resume")


def _model_and_params(args: argparse.Namespace, bindings: list[str]) -> tuple[Any, Any]:
    """The gin-configured MODEL (or the one in the run's config.gin) and its checkpoint's parameters."""
    from t5x.launch._zero_shot import load_checkpoint_params, model_from_gin

    files = list(args.gin_file)
    if not files:
        checkpoint = pathlib.Path(args.checkpoint)
        candidates = [checkpoint / "config.gin", checkpoint.parent / "config.gin"]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise GinConfigError(
                f"no --gin_file given and no config.gin in {checkpoint} or its parent: pass the model's "
                "gin file, e.g. --gin_file=models/demo/tiny.gin"
            )
        files = [str(found)]
    paths = [p for entry in args.gin_search_paths for p in entry.split(",") if p]
    model = model_from_gin(files, [*_flagged(args.gin_bindings), *bindings], paths)
    return model, load_checkpoint_params(model, args.checkpoint, step=args.step)


def _cmd_zero_shot(args: argparse.Namespace, bindings: list[str]) -> int:
    import json

    from t5x.launch._zero_shot import evaluate_zero_shot

    model, params = _model_and_params(args, bindings)
    tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
    report = evaluate_zero_shot(
        model, params, tasks, batch_size=args.batch_size, split=args.split, num_examples=args.num_examples
    )
    print(report.format_table(), flush=True)
    if args.json:
        payload = {"per_prompt": report.per_prompt, "median": report.median, "medians": report.medians}
        pathlib.Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


def _cmd_lm_eval(args: argparse.Namespace, bindings: list[str]) -> int:
    import importlib.util
    import json

    if importlib.util.find_spec("lm_eval") is None:
        print(
            "t5x-launch lm-eval: lm-eval is not installed; pip install --find-links dist 't5x-launch[lm-eval]' (in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md)",
            file=sys.stderr,
        )
        return 2
    from t5x.launch._lm_eval import T5xLM, run_lm_eval

    model, params = _model_and_params(args, bindings)
    lm = T5xLM(model, params, batch_size=args.batch_size, max_length=args.max_length)
    results = run_lm_eval(
        lm,
        [t for t in args.tasks.split(",") if t],
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        limit=args.limit,
    )
    from lm_eval.utils import make_table

    print(make_table(results), flush=True)
    if args.output_path:
        pathlib.Path(args.output_path).write_text(
            json.dumps(results["results"], indent=2, default=str) + "\n"
        )
    return 0


def _cmd_export(args: argparse.Namespace, bindings: list[str]) -> int:
    """A SavedModel of the checkpoint for serving (see t5x.launch._export_command)."""
    from t5x.launch._export_command import run_export

    return run_export(args, bindings)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``t5x-launch`` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="t5x-launch",
        description="Train, evaluate and serve T5-style models. `t5x-launch train` with no gin file runs the built-in demo.",
        epilog=_GIN_HELP,
    )
    verbose_help = "on an expected error (bad flag, config, path or data) also print the traceback"
    parser.add_argument("--verbose", action="store_true", help=verbose_help)
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
        # Also accepted after the command (a launcher's job, after --, takes its own).
        sub.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
        return sub

    command("train", _cmd_train, "pretrain or fine-tune (no gin file: the built-in demo)")
    command(
        "precompile",
        _cmd_precompile,
        "compile train's programs ahead of time into JAX's persistent compilation cache (train's gin files)",
    )
    command("eval", _cmd_eval, "inference evaluation of one, the latest or all checkpoints")
    command("infer", _cmd_infer, "predict or score a split to JSON Lines")
    info = command("model-info", _cmd_model_info, "print the parameters of the gin-configured MODEL")
    info.add_argument("--inputs_length", type=int, default=16, help="inputs length to trace the model with")
    info.add_argument("--targets_length", type=int, default=16, help="targets length to trace the model with")
    command("export", _cmd_export, "a TensorFlow SavedModel for serving: text in, decoded text out")

    inspect = command(
        "inspect-task", _cmd_inspect_task, "print examples of a task (t5x-tasks inspect)", gin_flags=False
    )
    inspect.add_argument("task", help="a registered task or mixture")
    inspect.add_argument("--split", default="train")
    inspect.add_argument("--n", type=int, default=3, help="number of examples")
    inspect.add_argument(
        "--module_import", action="append", default=[], help="a module that registers tasks; repeatable"
    )

    cache = command(
        "cache-tasks",
        _cmd_cache_tasks,
        "cache tasks offline with Apache Beam (t5x-tasks cache; needs t5x-tasks[beam])",
        gin_flags=False,
    )
    cache.add_argument(
        "cache_args", nargs=argparse.REMAINDER, help="-- then t5x-tasks cache flags and Beam options"
    )

    convert = command(
        "convert",
        _cmd_convert,
        "convert checkpoints: T5X (layout, dtype), Hugging Face T5-family folders, Mesh TensorFlow",
    )
    convert.add_argument(
        "--from",
        dest="source",
        required=True,
        help="FORMAT:PATH with FORMAT hf, t5x or mtf (a bare path is t5x: a checkpoint_<step> or model folder)",
    )
    convert.add_argument(
        "--to",
        dest="target",
        required=True,
        help="FORMAT:PATH with FORMAT hf (a folder) or t5x (the model folder to write checkpoint_<step> and model.gin into)",
    )
    convert.add_argument("--layout", choices=("scanned", "unscanned", "same"), default="same")
    convert.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    convert.add_argument(
        "--vocabulary",
        default=None,
        help="a SentencePiece .model for the target (default: the source's: spiece.model of a Hugging Face "
        "folder, or the vocabulary of the model gin file)",
    )
    convert.add_argument(
        "--extra_ids",
        type=int,
        default=None,
        help="sentinel count of the vocabulary (default: the source's, or 100)",
    )
    convert.add_argument(
        "--verify", action="store_true", help="run both sides on a random batch and compare their logits"
    )
    convert.add_argument(
        "--tolerance",
        type=float,
        default=1e-3,
        help="largest logit difference --verify accepts (exit code 1 above)",
    )

    verify = command(
        "verify",
        _cmd_verify,
        "check a checkpoint's files against their checksums without loading a model (exit 1 if damaged)",
        gin_flags=False,
    )
    verify.add_argument(
        "path", help="a model folder (its latest step), a checkpoint_<step> folder or its index"
    )
    verify.add_argument("--step", type=int, default=None, help="the step of a model folder to check")
    verify.add_argument(
        "--all_steps", action="store_true", help="check every complete step of a model folder"
    )
    verify.add_argument(
        "--require_checksums",
        action="store_true",
        help="exit 1 for a checkpoint without checksums (upstream's, or ours before checksums)",
    )

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
    study = command(
        "arch-objective-study",
        _cmd_arch_objective_study,
        "pretrain the 3 architectures x 3 objectives at CPU size, zero-shot evaluate, table and loss plot",
        gin_flags=False,
    )
    study.add_argument("--model_dir", default=None, help="study folder (default: ./t5x-study-<time>)")
    study.add_argument("--steps", type=int, default=100, help="training steps per combination")
    study.add_argument(
        "--architectures", default="causal_decoder,non_causal_decoder,encoder_decoder", help="comma-separated"
    )
    study.add_argument("--objectives", default="full_lm,prefix_lm,span_corruption", help="comma-separated")
    study.add_argument("--zero_shot_tasks", default=None, help="comma-separated (default: built-in prompts)")
    study.add_argument("--no_zero_shot", action="store_true", help="skip zero-shot evaluation")
    study.add_argument("--no_plot", action="store_true", help="skip the PNG (no matplotlib needed)")

    zero_shot = command(
        "zero-shot",
        _cmd_zero_shot,
        "zero-shot rank classification on prompted multiple-choice tasks: accuracy per prompt and median",
    )
    zero_shot.add_argument(
        "--checkpoint", required=True, help="a model folder (latest step) or a checkpoint_<step> folder"
    )
    zero_shot.add_argument("--step", type=int, default=None, help="the step to load from a model folder")
    zero_shot.add_argument(
        "--tasks", default=None, help="comma-separated tasks or mixtures (default: the builtin_mc_* tasks)"
    )
    zero_shot.add_argument("--split", default="validation")
    zero_shot.add_argument("--num_examples", type=int, default=None, help="examples per task (default: all)")
    zero_shot.add_argument("--batch_size", type=int, default=8, help="rows per scoring call")
    zero_shot.add_argument("--json", default=None, help="also write the report as JSON to this file")

    lm_eval = command(
        "lm-eval", _cmd_lm_eval, "run lm-evaluation-harness tasks on a checkpoint (needs t5x-launch[lm-eval])"
    )
    lm_eval.add_argument(
        "--checkpoint", required=True, help="a model folder (latest step) or a checkpoint_<step> folder"
    )
    lm_eval.add_argument("--step", type=int, default=None, help="the step to load from a model folder")
    lm_eval.add_argument("--tasks", required=True, help="comma-separated lm-eval task or group names")
    lm_eval.add_argument(
        "--include_path", action="append", default=[], help="a folder of extra task YAML files (repeatable)"
    )
    lm_eval.add_argument("--num_fewshot", type=int, default=None)
    lm_eval.add_argument("--limit", type=float, default=None, help="examples per task (a fraction if < 1)")
    lm_eval.add_argument("--batch_size", type=int, default=8)
    lm_eval.add_argument("--max_length", type=int, default=None, help="most tokens per scored row")
    lm_eval.add_argument("--output_path", default=None, help="write the results as JSON to this file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``t5x-launch``; returns the exit code.

    A job that runs XLA programs on the CPU backend (:func:`t5x.launch._platform.job_runs_on_cpu`;
    never a TPU or GPU host's) gets the XLA:CPU defaults (:mod:`t5x.launch._xla_flags`) and,
    started as a program (``argv`` None), re-executes itself first with glibc's malloc settings
    (:mod:`t5x.launch._malloc`) where they are new to the environment.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    command_at = next((i for i, arg in enumerate(words) if not arg.startswith("-")), len(words))
    if command_at < len(words) and words[command_at] in _XLA_JOBS and job_runs_on_cpu(os.environ):
        if argv is None:
            restart_with_malloc_defaults()
        add_xla_defaults(os.environ)
        if argv is None:  # this program's own stderr (not an in-process caller's): see t5x.launch._quiet
            from t5x.launch._quiet import add_quiet_defaults, filter_startup_noise

            add_quiet_defaults(os.environ)
            filter_startup_noise()
    argv = words
    launcher = command_at < len(argv) and argv[command_at] in ("local", "tpu", "cache-tasks")
    rest, bindings = (argv, []) if launcher else split_gin_flags(argv)
    parser = build_parser()
    args = parser.parse_args(rest)
    for name in ("job", "cache_args"):
        rest_args = getattr(args, name, None)
        if rest_args and rest_args[0] == "--":
            setattr(args, name, rest_args[1:])
    try:
        return args.handler(args, bindings)
    except Exception as error:
        # Expected mistakes (see t5x.launch.UserError) get one message and exit code 2; bugs keep
        # their traceback (exit code 1).
        if not is_user_error(error):
            raise
        if args.verbose:
            traceback.print_exc()
        print(f"t5x-launch {args.command}: {user_error_message(error)}", file=sys.stderr, flush=True)
        return 2
