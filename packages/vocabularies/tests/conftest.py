"""Fixtures: a tiny T5-style SentencePiece model and a tiny Hugging Face tokenizer, trained here."""

from __future__ import annotations

from pathlib import Path

import pytest

from .corpora import generate_lines, train_sentencepiece


@pytest.fixture(scope="session")
def sp_model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A T5-like unigram model: pad 0, EOS 1, UNK 2, no BOS, NFKC + whitespace collapsing."""
    directory = tmp_path_factory.mktemp("spm")
    return train_sentencepiece(directory, "t5like", vocab_size=600, lines=generate_lines(0, 3000))


@pytest.fixture(scope="session")
def hf_tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer.json with <pad>=0, </s>=1, <unk>=2 (round-trips any text)."""
    tokenizers = pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<pad>", "</s>", "<unk>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(generate_lines(1, 2000), trainer=trainer)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tokenizer.save(str(path))
    return path
