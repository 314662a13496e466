import pathlib

import pytest


@pytest.fixture(scope="session")
def spm_path(tmp_path_factory) -> str:
    """A tiny SentencePiece model (T5 layout: pad 0, eos 1, unk 2), trained here."""
    import sentencepiece as spm

    folder = tmp_path_factory.mktemp("spm")
    corpus = folder / "corpus.txt"
    words = (
        "the quick brown fox jumps over a lazy dog while seven small birds sing near the river bank".split()
    )
    corpus.write_text(
        "\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(9)) for i in range(300))
    )
    prefix = folder / "tiny"
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), vocab_size=40, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
    )  # fmt: skip
    return str(pathlib.Path(f"{prefix}.model"))


@pytest.fixture(scope="session", autouse=True)
def shared_compilation_cache(tmp_path_factory):
    """A JAX persistent compilation cache for the session's in-process jobs.

    Every `main([...])` job builds new jitted functions, so the same tiny programs
    would compile again and again; the first job compiles and stores each, the
    rest load it. Session-local: nothing is read from another run.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if jax.config.jax_compilation_cache_dir:  # the caller chose one
        yield
        return
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax-compilation-cache")))
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", None)


# The tiny encoder-decoder most job tests train (the demo's model, shrunk), on
# lengths that are not eval.gin's defaults.
_TRAINED_ARGS = (
    "train",
    "--gin_file=models/demo/tiny.gin",
    "--gin.models.T5Config.emb_dim=32",
    "--gin.models.T5Config.mlp_dim=64",
    "--gin.models.T5Config.num_heads=2",
    "--gin.models.T5Config.head_dim=16",
    "--gin.models.T5Config.num_encoder_layers=1",
    "--gin.models.T5Config.num_decoder_layers=1",
    "--gin_file=runs/pretrain.gin",
    "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 20}",
    "--gin.BATCH_SIZE=8",
    "--gin.TRAIN_STEPS=4",
    "--gin.CHECKPOINT_PERIOD=2",
)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> tuple[pathlib.Path, list[str]]:
    """(model folder, the `train` arguments less MODEL_DIR) of one run trained for the session.

    The tiny encoder-decoder on synthetic_copy with lengths 24 / 20, 4 steps, a
    checkpoint at steps 2 and 4. Several modules share it: read the folder as it
    is, or copy it (`shutil.copytree`) before anything that writes into it.
    """
    from t5x.launch._cli import main

    folder = tmp_path_factory.mktemp("trained") / "run"
    assert main([*_TRAINED_ARGS, f"--gin.MODEL_DIR={folder}"]) == 0
    return folder, list(_TRAINED_ARGS)
