"""Upstream train / eval / infer keywords mapped onto t5x-launch's configuration, or refused by name."""

import pytest

from t5x import checkpoints, launch, trainer, utils
from t5x.upstream import UnsupportedUpstreamOption
from t5x.upstream import _scripts as scripts


def _dataset(**overrides):
    fields = dict(
        mixture_or_task_name="task",
        task_feature_lengths={"inputs": 8, "targets": 4},
        split="validation",
        batch_size=4,
        shuffle=False,
        seed=42,
        pack=True,
        module="my.tasks",
    )
    return utils.DatasetConfig(**{**fields, **overrides})


def test_dataset_config_carries_every_field_over():
    cfg = scripts.dataset_config(_dataset(), who="train_dataset_cfg", measure=False)
    assert cfg == launch.DatasetConfig(
        mixture_or_task_name="task",
        task_feature_lengths={"inputs": 8, "targets": 4},
        split="validation",
        batch_size=4,
        shuffle=False,
        seed=42,
        use_cached=False,
        pack=True,
        module="my.tasks",
    )


def test_dataset_config_refuses_what_would_change_the_data():
    with pytest.raises(UnsupportedUpstreamOption, match="train_dataset_cfg.trim_output_features"):
        scripts.dataset_config(_dataset(trim_output_features=False), who="train_dataset_cfg", measure=False)
    with pytest.raises(UnsupportedUpstreamOption, match="train_dataset_cfg.task_feature_lengths=None"):
        scripts.dataset_config(_dataset(task_feature_lengths=None), who="train_dataset_cfg", measure=False)


def test_checkpoint_config_maps_save_and_restore():
    cfg = utils.CheckpointConfig(
        save=utils.SaveCheckpointConfig(period=5, keep=2, dtype="bfloat16"),
        restore=utils.RestoreCheckpointConfig(path="/ckpt/checkpoint_100", mode="specific"),
    )
    got = scripts.checkpoint_config(cfg, total_steps=50)
    assert got.save == launch.SaveCheckpointConfig(dtype="bfloat16", period=5, keep=2)
    # The whole train state (optimizer slots and step too), as upstream restores it.
    assert got.restore == launch.RestoreCheckpointConfig(path="/ckpt/checkpoint_100", mode="specific")
    scratch = scripts.checkpoint_config(
        utils.CheckpointConfig(
            save=utils.SaveCheckpointConfig(), restore=utils.RestoreCheckpointConfig(path=[])
        ),
        total_steps=50,
    )
    assert scratch.restore is None and scratch.save.period == 50  # upstream's None period: at the end


def test_checkpoint_config_maps_restore_rules_and_the_best_checkpointer():
    import gin

    restore = utils.RestoreCheckpointConfig(
        path=["/a", "/b"],
        assignment_map=[(r"target/decoder/(.*)", r"target/dec/\1"), ("state/.*", None)],
        strict=False,
        fallback_to_scratch=True,
        dtype="bfloat16",
    )
    gin.clear_config()
    best = gin.external_configurable(checkpoints.SaveBestCheckpointer, name="BestForTest")
    gin.bind_parameter("BestForTest.metric_name_to_monitor", "training_eval/my_task/loss")
    gin.bind_parameter("BestForTest.metric_mode", "min")
    try:
        save = utils.SaveCheckpointConfig(keep=2, checkpointer_cls=best, checkpoint_steps=[3, 7])
        got = scripts.checkpoint_config(utils.CheckpointConfig(save=save, restore=restore), total_steps=10)
    finally:
        gin.clear_config()
    assert got.restore == launch.RestoreCheckpointConfig(
        path=["/a", "/b"],
        assignment_map=[(r"target/decoder/(.*)", r"target/dec/\1"), ("state/.*", None)],
        strict=False,
        fallback_to_scratch=True,
        dtype="bfloat16",
    )
    # training_eval/<task>/<metric> is what t5x-launch writes as <task>/<metric>.
    assert got.save.metric_name_to_monitor == "my_task/loss"
    assert (got.save.metric_mode, got.save.keep) == ("min", 2)
    assert got.save.keep_checkpoints_without_metrics and list(got.save.checkpoint_steps) == [3, 7]


@pytest.mark.parametrize(
    ("cfg", "named"),
    [
        (
            utils.CheckpointConfig(
                restore=utils.RestoreCheckpointConfig(
                    path="p", checkpointer_cls=checkpoints.SaveBestCheckpointer
                )
            ),
            "SaveBestCheckpointer",
        ),
        (utils.CheckpointConfig(restore=utils.RestoreCheckpointConfig(path="p", mode="all")), "mode='all'"),
        (
            utils.CheckpointConfig(restore=utils.RestoreCheckpointConfig(path="p", restore_dataset=True)),
            "restore_dataset",
        ),
    ],
)
def test_checkpoint_config_refuses_by_name(cfg, named):
    with pytest.raises(UnsupportedUpstreamOption, match="not supported by t5x-launch") as error:
        scripts.checkpoint_config(cfg, total_steps=10)
    assert named in str(error.value)


def test_train_refuses_semantic_options_before_doing_anything(tmp_path):
    common = dict(model=None, train_dataset_cfg=_dataset(), model_dir=str(tmp_path / "m"), total_steps=2)
    with pytest.raises(launch.ConfigurationError, match=r"actions\['TRAIN'\]: object has no run method"):
        scripts.train(**common, actions={"TRAIN": [object()]})
    with pytest.raises(UnsupportedUpstreamOption, match="get_dataset_fn"):
        scripts.train(**common, get_dataset_fn=lambda *a: None)
    with pytest.raises(UnsupportedUpstreamOption, match="trainer_cls"):
        scripts.train(**common, trainer_cls=object)
    assert not (tmp_path / "m").exists()


def test_trainer_settings_come_from_the_class_gin_binds():
    import gin

    gin.clear_config()
    configurable = gin.external_configurable(trainer.Trainer, name="UpstreamTrainerForTest")
    gin.bind_parameter("UpstreamTrainerForTest.num_microbatches", 4)
    try:
        assert scripts._trainer_settings(configurable).num_microbatches == 4
    finally:
        gin.clear_config()


def test_infer_and_evaluate_refuse_sharded_or_custom_writers(tmp_path):
    restore = utils.RestoreCheckpointConfig(path=str(tmp_path), mode="specific")
    common = dict(
        model=None, dataset_cfg=_dataset(), restore_checkpoint_cfg=restore, output_dir=str(tmp_path)
    )
    with pytest.raises(UnsupportedUpstreamOption, match="merge_chunked_results"):
        scripts.infer(mode="predict", merge_chunked_results=False, **common)
    with pytest.raises(UnsupportedUpstreamOption, match="write_fn"):
        scripts.infer(mode="predict", write_fn=print, **common)
    with pytest.raises(launch.ConfigurationError, match="infer mode"):
        scripts.infer(mode="decode", **common)
    empty = utils.RestoreCheckpointConfig(path=[])
    with pytest.raises(launch.ConfigurationError, match="CHECKPOINT_PATH"):
        scripts.evaluate(
            model=None, dataset_cfg=_dataset(), restore_checkpoint_cfg=empty, output_dir=str(tmp_path)
        )


def test_infer_maps_shards_chunks_and_mode_onto_launch(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(scripts.launch, "infer", lambda **kwargs: calls.append(kwargs) or ["written"])
    restore = utils.RestoreCheckpointConfig(path=str(tmp_path), mode="specific")
    written = scripts.infer(
        mode="predict_with_aux",
        model=None,
        dataset_cfg=_dataset(),
        restore_checkpoint_cfg=restore,
        output_dir=str(tmp_path),
        shard_id=1,
        num_shards=3,
        checkpoint_period=7,
    )
    assert written == ["written"]
    (kwargs,) = calls
    assert (kwargs["shard_id"], kwargs["num_shards"], kwargs["checkpoint_period"]) == (1, 3, 7)
    assert kwargs["mode"] == "predict_with_aux" and kwargs["checkpoint_path"] == str(tmp_path)


def test_inference_examples_come_from_the_bound_evaluator():
    import gin

    class Evaluator:
        def __init__(self, num_examples=None):
            self.num_examples = num_examples

    gin.clear_config()
    decorated = gin.external_configurable(Evaluator, name="UpstreamEvaluatorForTest")
    gin.parse_config("N = 4\nUpstreamEvaluatorForTest.num_examples = %N")
    try:
        assert scripts._evaluator_examples(decorated) == 4  # through a macro, as finetune.gin binds it
        assert scripts._evaluator_examples(None) is None
    finally:
        gin.clear_config()


@pytest.mark.parametrize(
    ("mode", "path", "expected"),
    [
        ("latest", "/run", [("/run", "latest")]),
        ("all", "/run", [("/run", "all")]),
        ("specific", "/run/checkpoint_4", [("/run/checkpoint_4", "latest")]),
        (
            "specific",
            ["/run/checkpoint_2", "/run/checkpoint_4"],
            [("/run/checkpoint_2", "latest"), ("/run/checkpoint_4", "latest")],
        ),
    ],
)
def test_evaluate_maps_restore_modes_onto_launch_steps(mode, path, expected, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        scripts.launch, "evaluate", lambda **kwargs: calls.append(kwargs) or [kwargs["steps"]]
    )
    restore = utils.RestoreCheckpointConfig(path=path, mode=mode)
    results = scripts.evaluate(
        model=None, dataset_cfg=_dataset(), restore_checkpoint_cfg=restore, output_dir=str(tmp_path)
    )
    assert [(c["checkpoint_path"], c["steps"]) for c in calls] == expected
    assert {c["output_dir"] for c in calls} == {str(tmp_path / "inference_eval")}  # upstream's folder
    assert results == [steps for _, steps in expected]


def test_upstream_actions_run_in_the_train_loop(monkeypatch):
    from t5x.training._actions import ActionMode, normalize_actions, run_actions

    class StopWhenBiasMoved(trainer.BaseAction):
        """A user's own action, upstream-style: run(train_state, metrics_by_task)."""

        def run(self, train_state, metrics_by_task):
            self.seen = (train_state, dict(metrics_by_task))
            return train_state == "the state"

    calls = []
    monkeypatch.setattr(scripts.launch, "train", lambda **kwargs: calls.append(kwargs))
    own = StopWhenBiasMoved()
    early = trainer.EarlyStoppingAction(metric=("task", "loss"), mode="min", patience=1)
    nan = trainer.TerminateOnNanAction(task="task")
    scripts.train(
        model=None,
        train_dataset_cfg=_dataset(),
        model_dir="unused",
        total_steps=2,
        random_seed=0,
        actions={trainer.ActionMode.TRAIN_EVAL: [early, nan], "INFER_EVAL": [own]},
        run_eval_before_training=True,
        gc_period=5,
    )
    (kwargs,) = calls
    assert kwargs["run_eval_before_training"] is True and kwargs["gc_period"] == 5
    actions = normalize_actions(kwargs["actions"])
    state = lambda: "the state"  # noqa: E731
    assert run_actions(actions, ActionMode.INFER_EVAL, 4, {"task": {"acc": 1.0}}, state) is own
    assert own.seen == ("the state", {"task": {"acc": 1.0}})
    assert run_actions(actions, ActionMode.TRAIN_EVAL, 2, {"task": {"loss": 1.0}}, state) is None
    assert run_actions(actions, ActionMode.TRAIN_EVAL, 4, {"task": {"loss": 1.5}}, state) is early
    assert run_actions(actions, ActionMode.TRAIN_EVAL, 6, {"task": {"loss": float("nan")}}, state) is early
    assert nan.run(None, {"task": {"loss": float("nan")}}) and not nan.run(None, {"task": {"loss": 1.0}})
