import pathlib
import sys

import pytest

# The tests import their shared helpers (_upstream_fixtures); pytest's importlib mode adds no path.
sys.path.insert(0, str(pathlib.Path(__file__).parent))


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
