"""Deterministic synthetic data: toy text-to-text problems and a generated text corpus."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "green",
    "quick",
    "silent",
    "bright",
    "window",
    "garden",
    "paper",
    "little",
    "yellow",
    "music",
    "ocean",
    "forest",
    "winter",
    "summer",
    "candle",
    "mirror",
    "rocket",
    "planet",
    "silver",
    "golden",
    "happy",
    "gentle",
    "storm",
    "valley",
    "bridge",
    "castle",
    "dragon",
    "feather",
    "island",
    "jungle",
    "lemon",
    "mountain",
    "orange",
    "pencil",
    "rabbit",
    "shadow",
    "tiger",
    "violet",
    "whale",
    "anchor",
    "basket",
    "copper",
    "desert",
    "engine",
    "falcon",
    "harbor",
]

_SUBJECTS = (
    "the farmer",
    "a child",
    "the old sailor",
    "my neighbour",
    "the teacher",
    "a small robot",
    "the queen",
)
_VERBS = ("found", "painted", "carried", "described", "forgot", "watched", "built", "remembered")
_ADJECTIVES = ("quiet", "bright", "heavy", "strange", "ancient", "tiny", "golden", "broken", "warm")
_PLACES = (
    "near the river",
    "in the garden",
    "at the market",
    "under the bridge",
    "on the hill",
    "by the sea",
)
_CONNECTORS = ("Later,", "Meanwhile,", "After that,", "Suddenly,", "In the evening,", "Every morning,")

SPLIT_SIZES = {"train": 20_000, "validation": 500, "test": 500}
_SPLIT_SEEDS = {"train": 1, "validation": 2, "test": 3}


def split_rng(problem: str, split: str) -> np.random.Generator:
    """A generator that depends only on the problem and the split."""
    digest = sum((i + 1) * ord(c) for i, c in enumerate(problem))
    return np.random.default_rng([digest, _SPLIT_SEEDS.get(split, 9)])


def _words(rng: np.random.Generator, low: int = 3, high: int = 10) -> list[str]:
    return [WORDS[i] for i in rng.integers(0, len(WORDS), size=int(rng.integers(low, high + 1)))]


def copy_example(rng: np.random.Generator) -> tuple[str, str]:
    words = " ".join(_words(rng))
    return f"copy: {words}", words


def reverse_example(rng: np.random.Generator) -> tuple[str, str]:
    words = _words(rng)
    return f"reverse: {' '.join(words)}", " ".join(reversed(words))


def sort_digits_example(rng: np.random.Generator) -> tuple[str, str]:
    digits = [str(d) for d in rng.integers(0, 10, size=int(rng.integers(3, 13)))]
    return f"sort: {' '.join(digits)}", " ".join(sorted(digits))


def add_example(rng: np.random.Generator) -> tuple[str, str]:
    a, b = (int(x) for x in rng.integers(0, 10_000, size=2))
    return f"add: {a} + {b}", str(a + b)


PROBLEMS: dict[str, Callable[[np.random.Generator], tuple[str, str]]] = {
    "copy": copy_example,
    "reverse": reverse_example,
    "sort_digits": sort_digits_example,
    "add": add_example,
}


def make_examples(problem: str, split: str, num_examples: int | None = None) -> list[tuple[str, str]]:
    """The (inputs, targets) pairs of a synthetic problem's split, always the same."""
    rng = split_rng(problem, split)
    count = SPLIT_SIZES[split] if num_examples is None else num_examples
    return [PROBLEMS[problem](rng) for _ in range(count)]


def _sentence(rng: np.random.Generator) -> str:
    def pick(options: Sequence[str]) -> str:
        return options[int(rng.integers(0, len(options)))]

    words = " ".join(_words(rng, 1, 3))
    text = f"{pick(_SUBJECTS)} {pick(_VERBS)} a {pick(_ADJECTIVES)} {words} {pick(_PLACES)}."
    if rng.random() < 0.3:
        text = f"{pick(_CONNECTORS)} {text}"
    return text[0].upper() + text[1:]


def generate_corpus(
    num_documents: int, seed: int = 0, min_sentences: int = 2, max_sentences: int = 30
) -> list[str]:
    """Documents of simple English-like sentences, reproducible from ``seed``.

    Args:
      num_documents: how many documents.
      seed: the generator seed.
      min_sentences / max_sentences: sentences per document (uniform).

    Returns:
      ``num_documents`` strings, each one line (no newlines).
    """
    rng = np.random.default_rng([seed, 77])
    docs = []
    for _ in range(num_documents):
        n = int(rng.integers(min_sentences, max_sentences + 1))
        docs.append(" ".join(_sentence(rng) for _ in range(n)))
    return docs
