"""The ``transformers`` side of ``convert``, run in a child process.

PyTorch (and the Triton of CUDA builds) can crash when loaded into a process
that already holds TensorFlow, which gin configs import through ``t5x.tasks``;
a child process keeps the two apart. Usage::

    python -m t5x.launch._hf_worker logits FOLDER BATCH.npz OUT.npy
    python -m t5x.launch._hf_worker tokenizer FOLDER
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def _logits(folder: str, batch_path: str, out_path: str) -> None:
    import numpy as np
    import torch
    import transformers

    batch = np.load(batch_path)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    encoder = torch.from_numpy(batch["encoder_input_tokens"]).long()
    with torch.no_grad():
        out = model(
            input_ids=encoder,
            attention_mask=(encoder > 0).long(),
            decoder_input_ids=torch.from_numpy(batch["decoder_input_tokens"]).long(),
        )
    np.save(out_path, out.logits.float().numpy())


def _tokenizer(folder: str) -> None:
    import transformers

    # transformers derives tokenizer.json from spiece.model exactly.
    transformers.T5Tokenizer.from_pretrained(folder).save_pretrained(folder)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one ``transformers`` task; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["logits"] and len(args) == 4:
        _logits(*args[1:])
    elif args[:1] == ["tokenizer"] and len(args) == 2:
        _tokenizer(args[1])
    else:
        print(f"usage: logits FOLDER BATCH OUT | tokenizer FOLDER; got {args}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
