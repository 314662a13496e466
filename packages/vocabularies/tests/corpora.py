"""Generated training text and model training for the tests (nothing is downloaded)."""

from __future__ import annotations

import random
from pathlib import Path

import sentencepiece

# Every character the models know: T5's own models cover far more, but a small
# alphabet keeps training fast while still exercising multi-byte UTF-8.
ALPHABET = (
    "abcdefghijklmnopqrstuvwxyz"
    + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    + "0123456789"
    + ".,;:!?'\"()-+=/%&#@*"
    + "äöüßéèêñçøåæ"
    + "ÄÖÜ"
    + "世界日本語中文字"
    + "αβγδεζηθλμπσω"
    + "кирлцаят"
    + "€£¥"
)


def generate_lines(seed: int, n_lines: int, *, alphabet: str = ALPHABET, max_words: int = 16) -> list[str]:
    """Deterministic text: words drawn (Zipf-like) from a random lexicon over ``alphabet``."""
    rng = random.Random(seed)
    lexicon = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(1500)]
    # Every character appears on its own too, so no character of the alphabet is unknown.
    lexicon += list(alphabet)
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    rng.shuffle(weights)
    return [" ".join(rng.choices(lexicon, weights, k=rng.randint(1, max_words))) for _ in range(n_lines)]


def train_sentencepiece(directory: Path, name: str, *, vocab_size: int, lines: list[str], **options) -> Path:
    corpus = directory / f"{name}.txt"
    corpus.write_text("\n".join(lines), encoding="utf-8")
    settings = dict(
        input=str(corpus),
        model_prefix=str(directory / name),
        vocab_size=vocab_size,
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
    settings.update(options)
    sentencepiece.SentencePieceTrainer.train(**settings)
    return directory / f"{name}.model"
