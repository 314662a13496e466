"""A vocabulary over a Hugging Face ``tokenizer.json`` (optional ``hf`` extra)."""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import numpy as np

from t5x.vocabularies._base import PAD_ID, VocabularyBase, check_int, type_error

_EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>")
_SENTINEL = re.compile(r"<extra_id_(\d+)>")


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as e:
        raise ImportError(
            "HuggingFaceVocabulary needs the 'tokenizers' package: "
            "pip install --find-links dist 't5x-vocabularies[hf]' "
            "(run in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md)"
        ) from e
    return tokenizers


def _existing_sentinels(tokenizer: Any) -> int:
    """How many ``<extra_id_k>`` tokens sit at ``size - 1 - k``, counting k = 0, 1, ... ."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    k = 0
    while k < size and tokenizer.id_to_token(size - 1 - k) == f"<extra_id_{k}>":
        k += 1
    return k


class HuggingFaceVocabulary(VocabularyBase):
    """A Hugging Face ``tokenizers`` tokenizer, read from its ``tokenizer.json``.

    Needs the ``hf`` extra (``pip install --find-links dist 't5x-vocabularies[hf]'``, see
    docs/installing.md). Texts are encoded without the
    tokenizer's post-processor (no BOS/EOS added), so ``encode`` follows the
    Vocabulary contract.

    Id 0 must be a special token (the padding token): every t5x vocabulary pads
    with 0, and a tokenizer whose id 0 is an ordinary token would have it
    mistaken for padding.

    Sentinels: if the tokenizer already ends with ``<extra_id_0>`` at the top id,
    ``<extra_id_1>`` below it, ... (as T5's tokenizers do), ``extra_ids`` may be
    up to that count. If it has none, ``extra_ids`` special tokens
    ``<extra_id_k>`` are added so that ``<extra_id_k>`` is ``vocab_size - 1 - k``.

    Decoding rules (Python and tf paths alike): ids are cut at the first EOS,
    padding is dropped, other special tokens (sentinels included) decode to their
    text, and **ids outside ``[0, vocab_size)`` decode as ``unk_id``** (or are
    dropped when there is no UNK token).

    Args:
      tokenizer_file: path of the ``tokenizer.json``.
      extra_ids: number of sentinel ids (see above).
      eos_token: the EOS token's text; None picks the first of ``</s>``,
        ``<|endoftext|>``, ``<eos>`` that exists (or no EOS).
      unk_token: the UNK token's text; None takes the model's own UNK token,
        else ``<unk>`` if it exists (or no UNK).

    Raises:
      ImportError: ``tokenizers`` is not installed.
      FileNotFoundError: the file does not exist (the message names it).
      ValueError: the file is not a tokenizer, id 0 is not special, a named token
        is missing, or existing sentinels do not fit ``extra_ids``.
      TypeError: an argument has the wrong type (the message names it).
    """

    def __init__(
        self,
        tokenizer_file: str | os.PathLike[str],
        extra_ids: int = 0,
        *,
        eos_token: str | None = None,
        unk_token: str | None = None,
    ):
        if not isinstance(tokenizer_file, str | os.PathLike):
            raise type_error("tokenizer_file", "a path (str or os.PathLike)", tokenizer_file)
        for name, value in (("eos_token", eos_token), ("unk_token", unk_token)):
            if value is not None and not isinstance(value, str):
                raise type_error(name, "a str or None", value)
        extra_ids = check_int("extra_ids", extra_ids or 0, minimum=0)
        path = os.fspath(tokenizer_file)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError as e:
            raise FileNotFoundError(f"tokenizer file {path!r} does not exist") from e
        except (UnicodeDecodeError, IsADirectoryError) as e:
            raise ValueError(f"tokenizer file {path!r} is not a tokenizer.json: {e}") from e
        self._path = path
        self._setup(text, extra_ids, eos_token, unk_token)

    def _setup(self, text: str, extra_ids: int, eos_token: str | None, unk_token: str | None) -> None:
        where = f"tokenizer file {self._path!r}"
        tokenizer_class = _tokenizers().Tokenizer
        try:
            tokenizer = tokenizer_class.from_str(text)
        except Exception as e:  # the Rust side raises plain Exception on malformed JSON
            raise ValueError(f"{where} is not a valid tokenizer.json: {e}") from e
        added = tokenizer.get_added_tokens_decoder()
        if PAD_ID not in added or not added[PAD_ID].special:
            raise ValueError(
                f"{where} gives id {PAD_ID} to {tokenizer.id_to_token(PAD_ID)!r}, expected a special (padding) "
                f"token: every t5x vocabulary pads with {PAD_ID}"
            )
        existing = _existing_sentinels(tokenizer)
        if extra_ids and not existing:
            tokens = _tokenizers().AddedToken
            tokenizer.add_special_tokens(
                [
                    tokens(f"<extra_id_{k}>", special=True, normalized=False)
                    for k in reversed(range(extra_ids))
                ]
            )
            existing = _existing_sentinels(tokenizer)
        if extra_ids > existing:
            raise ValueError(
                f"{where} has {existing} sentinel tokens <extra_id_k> at the top ids, expected at least "
                f"extra_ids={extra_ids} (or none, so that they can be added)"
            )
        self._tokenizer = tokenizer
        self._json = text
        self._extra_ids = extra_ids
        self._eos_id = self._find("eos_token", eos_token, () if eos_token else _EOS_CANDIDATES)
        model_unk = getattr(tokenizer.model, "unk_token", None)
        if model_unk is None and getattr(tokenizer.model, "unk_id", None) is not None:
            model_unk = tokenizer.id_to_token(tokenizer.model.unk_id)
        unk_candidates = tuple(c for c in (model_unk, "<unk>") if c)
        self._unk_id = self._find("unk_token", unk_token, () if unk_token else unk_candidates)
        self._digest = hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()

    def _find(self, name: str, token: str | None, candidates: tuple[str, ...]) -> int | None:
        if token is not None:
            found = self._tokenizer.token_to_id(token)
            if found is None:
                raise ValueError(f"{name}={token!r} is not a token of tokenizer file {self._path!r}")
            return found
        for candidate in candidates:
            found = self._tokenizer.token_to_id(candidate)
            if found is not None:
                return found
        return None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self._path,
            "json": self._json,
            "extra_ids": self._extra_ids,
            "eos": None if self._eos_id is None else self._tokenizer.id_to_token(self._eos_id),
            "unk": None if self._unk_id is None else self._tokenizer.id_to_token(self._unk_id),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._path = state["path"]
        self._setup(state["json"], state["extra_ids"], state["eos"], state["unk"])
        if state["eos"] is None:
            self._eos_id = None
        if state["unk"] is None:
            self._unk_id = None

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def unk_id(self) -> int | None:
        return self._unk_id

    @property
    def extra_ids(self) -> int:
        return self._extra_ids

    @property
    def tokenizer(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tokenizer

    def _encode_one(self, s: str | bytes) -> list[int]:
        text = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def _encode_many(self, texts: list[str | bytes]) -> list[list[int]]:
        texts = [t.decode("utf-8", "replace") if isinstance(t, bytes) else t for t in texts]
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def _clean(self, ids: np.ndarray) -> np.ndarray:
        ids = super()._clean(ids)
        outside = (ids < 0) | (ids >= self.vocab_size)
        if outside.any():
            ids = ids[~outside] if self._unk_id is None else np.where(outside, self._unk_id, ids)
        return ids

    def _decode_clean(self, ids: np.ndarray) -> str:
        return self._tokenizer.decode(ids.tolist(), skip_special_tokens=False)

    def _decode_many(self, rows: list[np.ndarray]) -> list[str]:
        return self._tokenizer.decode_batch([row.tolist() for row in rows], skip_special_tokens=False)

    def _identity(self) -> tuple[Any, ...]:
        return (self._digest, self._extra_ids, self._eos_id, self._unk_id)

    def __repr__(self) -> str:
        return (
            f"HuggingFaceVocabulary(tokenizer_file={self._path!r}, extra_ids={self._extra_ids}, "
            f"vocab_size={self.vocab_size}, sha256={self._digest[:12]})"
        )
