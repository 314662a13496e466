"""``t5x-launch export``: a SavedModel for serving, from launch's runs/export.gin or an extension's export job."""

from __future__ import annotations

import argparse
import os
import pathlib
from typing import Any

from t5x.launch._cli import _call_configured, _flagged
from t5x.launch._errors import UserError
from t5x.launch._files_written import print_files_written
from t5x.launch._gin_config import (
    GinArgs,
    GinConfigError,
    check_required_macros,
    configured_job,
    macro_value,
    parse_gin,
    write_config_gin,
)
from t5x.launch._xla_flags import add_gin_flags

EXPORT_GIN = "runs/export.gin"
# Macros `export` reads itself (besides MODEL): runs/export.gin defines them, no config refers to them.
_EXPORT_MACROS = ("CHECKPOINT_PATH", "EXPORT_OUTPUT_DIR", "EXPORT_MODE", "EXPORT_BATCH_SIZE", "XLA_FLAGS")


def export_gin_files(args: argparse.Namespace, bindings: list[str]) -> list[str]:
    """The model's gin files (the run's config.gin next to CHECKPOINT_PATH when none is given), then export.gin."""
    if args.gin_file:
        return [*args.gin_file, EXPORT_GIN]
    # Only CHECKPOINT_PATH is needed to find config.gin; other bindings may name the model's modules.
    path_bindings = [
        b for b in (*_flagged(args.gin_bindings), *bindings) if b.split("=")[0].strip() == "CHECKPOINT_PATH"
    ]
    parse_gin(GinArgs((EXPORT_GIN,), tuple(path_bindings), read_macros=_EXPORT_MACROS))
    import gin

    if macro_value("CHECKPOINT_PATH") is gin.REQUIRED:
        raise GinConfigError("the macro CHECKPOINT_PATH is required: set it with --gin.CHECKPOINT_PATH=DIR")
    checkpoint = pathlib.Path(str(macro_value("CHECKPOINT_PATH")))
    found = next(
        (c for c in (checkpoint / "config.gin", checkpoint.parent / "config.gin") if c.is_file()), None
    )
    if found is None:
        raise GinConfigError(
            f"no --gin_file given and no config.gin in {checkpoint} or its parent: pass the model's gin file "
            "and lengths, e.g. --gin_file=models/demo/tiny.gin --gin.TASK_FEATURE_LENGTHS=\"{'inputs': 32, 'targets': 32}\""
        )
    return [str(found), EXPORT_GIN]


def run_export(args: argparse.Namespace, bindings: list[str]) -> int:
    """A SavedModel of the checkpoint for serving (t5x.export.export_saved_model, configured by gin).

    When the given gin files bind an extension's export job (upstream t5x's run file
    ``t5x/configs/runs/export.gin`` binds t5x-upstream's ``export_lib.save``), that job
    runs with its own macros, and runs/export.gin's are not read.
    """
    import gin

    import t5x.export
    from t5x.launch._zero_shot import load_checkpoint_params

    paths = tuple(p for entry in args.gin_search_paths for p in entry.split(",") if p)
    given = (*_flagged(args.gin_bindings), *bindings)
    if args.gin_file:
        try:
            parse_gin(GinArgs(tuple(args.gin_file), given, paths, _EXPORT_MACROS))
        except GinConfigError:
            job: Any = None  # not complete without runs/export.gin: parsed with it below, errors and all
        else:
            job = configured_job("export", t5x.export.export_saved_model)
        if job is not None and job is not t5x.export.export_saved_model:
            check_required_macros()
            add_gin_flags(os.environ)
            try:
                exported: Any = _call_configured(job)
            except t5x.export.ExportError as error:
                raise UserError(f"cannot export: {error}") from error
            _report_export(exported)
            return 0

    files = export_gin_files(args, bindings)
    parse_gin(GinArgs(tuple(files), given, paths, _EXPORT_MACROS))
    check_required_macros()
    # A run's config.gin binds the model's parameters in the scope of its macro (MODEL/...).
    with gin.config_scope("MODEL"):
        model: Any = macro_value("MODEL")
    if model is gin.REQUIRED:
        raise GinConfigError(
            f"the macro MODEL is not set by {files}: pass a model gin file, e.g. --gin_file=models/demo/tiny.gin"
        )
    if macro_value("TASK_FEATURE_LENGTHS") is gin.REQUIRED:
        raise GinConfigError(
            f"the macro TASK_FEATURE_LENGTHS is not set by {files}: set it, e.g. "
            "--gin.TASK_FEATURE_LENGTHS=\"{'inputs': 32, 'targets': 32}\""
        )
    add_gin_flags(os.environ)
    checkpoint, output_dir = str(macro_value("CHECKPOINT_PATH")), str(macro_value("EXPORT_OUTPUT_DIR"))
    try:
        params = load_checkpoint_params(model, checkpoint)
        exported = gin.get_configurable(t5x.export.export_saved_model)(model, params, output_dir)
    except t5x.export.ExportError as error:
        raise UserError(f"cannot export {checkpoint}: {error}") from error
    except ValueError as error:
        raise UserError(f"the checkpoint {checkpoint} does not fit the configured model: {error}") from error
    _report_export(exported)
    return 0


def _report_export(exported: Any) -> None:
    """Writes config.gin into the SavedModel's folder and says what was written."""
    write_config_gin(pathlib.Path(exported.path))
    imports = f"; import {', '.join(exported.load_imports)} before loading" if exported.load_imports else ""
    print(f"[t5x-launch] exported a {exported.mode} SavedModel (serving_default){imports}", flush=True)
    print_files_written(exported.path)
