"""Fixtures for the t5x.seqio tests."""

from __future__ import annotations

import pytest
import sentencepiece

import t5x.tasks as core


@pytest.fixture
def clean_registry():
    """Removes what a test registered (through seqio or the core: they share the registries)."""
    before_tasks, before_mixtures = set(core.TaskRegistry.names()), set(core.MixtureRegistry.names())
    yield
    for name in set(core.MixtureRegistry.names()) - before_mixtures:
        core.MixtureRegistry.remove(name)
    for name in set(core.TaskRegistry.names()) - before_tasks:
        core.TaskRegistry.remove(name)


@pytest.fixture(scope="session")
def sp_model_file(tmp_path_factory):
    """A tiny SentencePiece model (pad 0, EOS 1, UNK 2) trained on a few lines."""
    folder = tmp_path_factory.mktemp("spm")
    corpus = folder / "corpus.txt"
    words = ["hello", "world", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
    corpus.write_text("\n".join(" ".join(words[(i + j) % len(words)] for j in range(5)) for i in range(200)))
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(folder / "tiny"),
        vocab_size=40,
        model_type="unigram",
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return str(folder / "tiny.model")
