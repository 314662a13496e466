"""t5x-launch precompile fills JAX's persistent compilation cache, and train then loads from it."""

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

from t5x.launch._cli import main
from t5x.launch._precompile import TRAIN_PROGRAMS, cache_entries

TINY_TRAIN = [
    "--gin_file=models/demo/tiny.gin",
    "--gin_file=runs/pretrain.gin",
    "--gin.models.T5Config.emb_dim=32",
    "--gin.models.T5Config.mlp_dim=64",
    "--gin.models.T5Config.num_heads=2",
    "--gin.models.T5Config.head_dim=16",
    "--gin.models.T5Config.num_encoder_layers=1",
    "--gin.models.T5Config.num_decoder_layers=1",
    "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
    "--gin.BATCH_SIZE=8",
    "--gin.TRAIN_STEPS=1",
]


@pytest.fixture
def restore_jax_cache():
    """The cache settings are process-wide: put back JAX's (no persistent cache) after the test."""
    before = (
        jax.config.jax_compilation_cache_dir,
        jax.config.jax_persistent_cache_min_compile_time_secs,
        jax.config.jax_persistent_cache_min_entry_size_bytes,
    )
    yield
    compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", before[2])


def _count_events(name):
    events = []

    def listener(event, **_):
        if event == name:
            events.append(event)

    jax.monitoring.register_event_listener(listener)
    return events, listener


def test_precompile_fills_the_cache_and_train_loads_its_programs(tmp_path, capsys, restore_jax_cache):
    model_dir = tmp_path / "run"
    cache = model_dir / "compilation_cache"
    assert main(["precompile", *TINY_TRAIN, f"--gin.MODEL_DIR={model_dir}"]) == 0
    out = capsys.readouterr().out
    precompiled = {name: cache_entries(cache, name) for name in TRAIN_PROGRAMS}
    assert all(len(entries) == 1 for entries in precompiled.values()), (precompiled, cache_entries(cache))
    assert "precompiled train_step" in out and "precompiled init_fn" in out, out
    assert not (model_dir / "checkpoint_0").exists() and not (model_dir / "metrics.jsonl").exists()

    # A fresh start as far as JAX's in-memory caches go: only the persistent cache can serve.
    jax.clear_caches()
    hits, listener = _count_events("/jax/compilation_cache/cache_hits")
    try:
        assert main(["train", *TINY_TRAIN, f"--gin.MODEL_DIR={model_dir}"]) == 0
    finally:
        jax.monitoring.unregister_event_listener(listener)
    # train compiled neither program again (a different program would add an entry of its name)...
    assert {name: cache_entries(cache, name) for name in TRAIN_PROGRAMS} == precompiled
    # ...it loaded them (and the small programs precompile also left there).
    assert len(hits) >= len(TRAIN_PROGRAMS), hits
    assert (model_dir / "checkpoint_1").is_dir()


def test_precompile_with_its_own_cache_folder(tmp_path, capsys, restore_jax_cache):
    cache = tmp_path / "shared-cache"
    flags = [
        *TINY_TRAIN,
        "--gin_file=runs/precompile.gin",
        f"--gin.COMPILATION_CACHE_DIR={cache}",
        f"--gin.MODEL_DIR={tmp_path / 'run'}",
    ]
    assert main(["precompile", *flags]) == 0
    assert all(cache_entries(cache, name) for name in TRAIN_PROGRAMS), cache_entries(cache)
    assert not (tmp_path / "run" / "compilation_cache").exists()
    assert f"new entries in {cache}" in capsys.readouterr().out
