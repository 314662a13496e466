"""Argument parsing, help, and the launchers' command construction."""

import pathlib
import shlex
import subprocess
import sys

import pytest

from t5x.launch import split_gin_flags, tpu_commands
from t5x.launch._cli import build_parser, main

SUBCOMMANDS = (
    "train",
    "eval",
    "infer",
    "model-info",
    "inspect-task",
    "cache-tasks",
    "convert",
    "local",
    "tpu",
    "arch-objective-study",
    "zero-shot",
    "lm-eval",
)


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in text


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_help_lists_its_flags(capsys, name):
    with pytest.raises(SystemExit):
        main([name, "--help"])
    text = capsys.readouterr().out
    if name in ("train", "eval", "infer", "model-info"):
        for flag in ("--gin_file", "--gin_bindings", "--gin_search_paths", "--gin.NAME=VALUE"):
            assert flag in text
    if name == "local":
        assert "--num_processes" in text
    if name == "tpu":
        for flag in ("--tpu", "--zone", "--project", "--dry_run"):
            assert flag in text


def test_gin_dot_flags_become_bindings_and_bare_paths_are_quoted():
    rest, bindings = split_gin_flags(
        [
            "train",
            "--gin_file=a.gin",
            "--gin.MODEL_DIR=/tmp/run",
            "--gin.TRAIN_STEPS=7",
            "--gin.MODEL=@models.M()",
            '--gin.NAME="x"',
        ]
    )
    assert rest == ["train", "--gin_file=a.gin"]
    assert bindings == ["MODEL_DIR = '/tmp/run'", "TRAIN_STEPS = 7", "MODEL = @models.M()", 'NAME = "x"']


def test_parser_collects_repeated_gin_flags():
    args = build_parser().parse_args(
        ["train", "--gin_file", "a.gin", "--gin_file", "b.gin", "--gin_bindings", "X = 1"]
    )
    assert args.gin_file == ["a.gin", "b.gin"]
    assert args.gin_bindings == ["X = 1"]


def test_local_and_tpu_take_the_job_after_a_double_dash():
    args = build_parser().parse_args(["local", "--num_processes=2", "--", "train", "--gin.MODEL_DIR=/x"])
    assert args.num_processes == 2
    assert args.job == ["--", "train", "--gin.MODEL_DIR=/x"]


def test_tpu_dry_run_prints_the_exact_commands(tmp_path):
    checkout = pathlib.Path(__file__).resolve().parents[3]
    result = subprocess.run(
        [sys.executable, "-m", "t5x.launch", "tpu", "--tpu=my-pod", "--zone=us-central2-b", "--project=proj",
         f"--source={checkout}", "--dry_run", "--", "train", "--gin_file=runs/pretrain.gin", "--gin.MODEL_DIR=gs://b/run"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3
    tar, scp, ssh = (shlex.split(line) for line in lines)
    assert tar[:2] == ["tar", "-czf"] and tar[-1] == "packages" and str(checkout) in tar
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert scp[-4:] == ["my-pod:t5x-job.tgz", "--zone=us-central2-b", "--project=proj", "--worker=all"]
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-pod"]
    assert "--worker=all" in ssh
    remote = ssh[-1].removeprefix("--command=")
    assert "tar -xzf t5x-job.tgz -C t5x-job" in remote
    assert "pip install -q 'jax[tpu]' t5x-job/packages/*" in remote
    assert remote.endswith(
        "env T5X_AUTO_DISTRIBUTED=1 python3 -m t5x.launch train --gin_file=runs/pretrain.gin --gin.MODEL_DIR=gs://b/run"
    )


def test_tpu_commands_without_a_project_omit_the_flag(tmp_path):
    commands = tpu_commands(["train"], tpu="t", zone="z", source=tmp_path, archive=tmp_path / "a.tgz")
    assert not any(arg.startswith("--project") for command in commands for arg in command)


def test_tpu_refuses_a_missing_job_and_a_missing_checkout(tmp_path):
    with pytest.raises(ValueError, match="no job given"):
        tpu_commands([], tpu="t", zone="z", source=tmp_path, archive=tmp_path / "a.tgz")
    from t5x.launch._tpu import source_root

    with pytest.raises(FileNotFoundError, match="--source"):
        source_root(str(tmp_path))


def test_local_stops_every_process_when_one_fails(tmp_path):
    from t5x.launch._local import run_local

    # `model-info` without gin files fails fast in every process (no MODEL macro).
    code = run_local(["model-info"], 2, log_dir=str(tmp_path))
    assert code == 2
    assert (tmp_path / "process_1.log").exists()


def test_local_rejects_bad_arguments():
    from t5x.launch._local import run_local

    with pytest.raises(ValueError, match="--num_processes must be >= 1, got 0"):
        run_local(["train"], 0)
    with pytest.raises(ValueError, match="no job given"):
        run_local([], 2)


def test_cache_tasks_delegates_to_the_tasks_cache_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["cache-tasks", "--", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--module_import" in out and "--output_cache_dir" in out


def test_inspect_task_imports_a_task_module_from_the_current_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "inspect_me_tasks.py").write_text(
        "import t5x.tasks as tt\n"
        "from t5x.vocabularies import ByteVocabulary\n"
        "tt.TaskRegistry.add('inspect_me', tt.InMemoryDataSource({'train': [{'targets': 'hi'}]}),\n"
        "                    {'targets': tt.Feature(ByteVocabulary())}, preprocessors=[tt.tokenize])\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "inspect_me_tasks", raising=False)
    try:
        assert main(["inspect-task", "inspect_me", "--module_import", "inspect_me_tasks", "--n", "1"]) == 0
    finally:
        import t5x.tasks

        t5x.tasks.TaskRegistry.remove("inspect_me")
    assert "text: 'hi'" in capsys.readouterr().out
