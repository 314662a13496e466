"""An lm-evaluation-harness model over t5x models and checkpoints (needs the ``lm-eval`` extra).

``lm_eval`` finds it under the name ``t5x`` once ``t5x.launch`` is imported
(see ``_lm_eval_registration``). Requests are scored with the same path as
:func:`t5x.launch.evaluate_zero_shot`: the context becomes the task's
``inputs`` and the continuation its ``targets``, the model's feature converter
makes the model features, and ``Model.score_batch`` gives the log-likelihood.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from lm_eval.api.model import LM

from t5x.launch._assembly import feature_converter_for
from t5x.launch._zero_shot import load_checkpoint_params, model_from_gin


def _vocabularies(model: Any) -> tuple[Any, Any]:
    inputs = getattr(model, "input_vocabulary", None) or getattr(model, "vocabulary", None)
    outputs = getattr(model, "output_vocabulary", None) or inputs
    if inputs is None or outputs is None:
        raise ValueError(
            f"T5xLM: model {type(model).__name__} has no vocabulary; build it with one "
            "(input_vocabulary/output_vocabulary or vocabulary) so that text can be encoded"
        )
    return inputs, outputs


def _round_up(n: int, multiple: int = 16) -> int:
    return max(multiple, -(-n // multiple) * multiple)


class T5xLM(LM):
    """lm-eval's ``LM`` over a t5x encoder-decoder or decoder-only model.

    Either pass a built ``model`` and its ``params``, or ``gin_file`` (a model
    gin file, or the ``config.gin`` a training run wrote) and ``checkpoint``;
    the latter is what ``lm_eval --model t5x --model_args
    gin_file=...,checkpoint=...`` uses.

    Args:
      model: a ``t5x.models`` model with a vocabulary.
      params: its parameters.
      gin_file: model gin file(s), used when ``model`` is None.
      checkpoint: a model folder (latest step) or ``checkpoint_<step>`` folder.
      gin_bindings: extra gin bindings (``"NAME = VALUE"``).
      batch_size: rows per model call.
      max_length: the most tokens one row holds (context is cut from the left
        to fit; longer documents are scored in windows); None: no limit.
      max_gen_toks: default number of generated tokens for ``generate_until``.

    Raises:
      ValueError: neither a model nor a gin file and checkpoint, or bad sizes.
    """

    def __init__(
        self,
        model: Any = None,
        params: Any = None,
        *,
        gin_file: str | Sequence[str] | None = None,
        checkpoint: str | None = None,
        gin_bindings: Sequence[str] = (),
        batch_size: int | str = 8,
        max_length: int | None = None,
        max_gen_toks: int = 64,
        **unused: Any,
    ) -> None:
        super().__init__()
        if model is None:
            if gin_file is None or checkpoint is None:
                raise ValueError(
                    "T5xLM: pass model and params, or gin_file=<model gin> and checkpoint=<folder> "
                    f"(got gin_file={gin_file!r}, checkpoint={checkpoint!r})"
                )
            files = [gin_file] if isinstance(gin_file, str) else list(gin_file)
            model = model_from_gin(files, gin_bindings)
            params = load_checkpoint_params(model, str(checkpoint))
        elif params is None:
            raise ValueError("T5xLM: params are required with a model")
        # lm-eval passes batch_size="auto" or strings from its command line.
        size = 8 if str(batch_size).startswith("auto") else int(batch_size)
        if size < 1:
            raise ValueError(f"T5xLM: batch_size must be a positive int, got {batch_size!r}")
        if max_length is not None and int(max_length) < 2:
            raise ValueError(f"T5xLM: max_length must be at least 2 tokens, got {max_length!r}")
        self.model, self.params = model, params
        self.batch_size = size
        self.max_length = None if max_length is None else int(max_length)
        self.max_gen_toks = int(max_gen_toks)
        self.input_vocabulary, self.output_vocabulary = _vocabularies(model)
        self.encoder_decoder = "encoder_input_tokens" in feature_converter_for(
            model, pack=False
        ).get_model_feature_lengths({"inputs": 1, "targets": 1})
        score = model.score_batch
        logits = model.compute_logits

        def score_and_greedy(p: Any, batch: Mapping[str, Any]) -> tuple[jax.Array, jax.Array]:
            scores = score(p, batch)
            predicted = jnp.argmax(logits(p, batch), axis=-1)
            weights = jnp.asarray(batch["decoder_loss_weights"]) > 0
            hit = (predicted == batch["decoder_target_tokens"]) | ~weights
            return scores, jnp.all(hit, axis=-1)

        self._score_and_greedy = jax.jit(score_and_greedy)

    # -- encoding -----------------------------------------------------------

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        # A space ending the context belongs to the continuation (lm-eval's convention).
        trailing = len(context) - len(context.rstrip())
        if trailing:
            context, continuation = context[:-trailing], context[-trailing:] + continuation
        if self.encoder_decoder:
            return self._encoder_ids(context), list(self.output_vocabulary.encode(continuation))
        whole = list(self.input_vocabulary.encode(context + continuation))
        ctx = list(self.input_vocabulary.encode(context))
        if whole[: len(ctx)] == ctx:
            return ctx, whole[len(ctx) :]
        return ctx, list(self.input_vocabulary.encode(continuation))

    def _encoder_ids(self, text: str) -> list[int]:
        # An all-padding encoder input would mask every key; EOS stands for "no context".
        return list(self.input_vocabulary.encode(text)) or [int(self.input_vocabulary.eos_id)]

    def _fit(self, inputs: list[int], targets: list[int]) -> tuple[list[int], list[int]]:
        if self.max_length is None:
            return inputs, targets
        targets = targets[-self.max_length :]
        room = self.max_length if self.encoder_decoder else self.max_length - len(targets)
        return inputs[len(inputs) - room :] if room < len(inputs) else inputs, targets

    # -- batching -----------------------------------------------------------

    def _rows(
        self, pairs: Sequence[tuple[list[int], list[int]]], targets_length: int | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """Model-feature batches of ``batch_size`` rows made by the model's feature converter."""
        import tensorflow as tf

        lengths = {
            "inputs": _round_up(max(len(i) for i, _ in pairs)),
            "targets": targets_length or _round_up(max(max(len(t) for _, t in pairs), 1)),
        }
        converter = feature_converter_for(self.model, pack=False)
        ds = tf.data.Dataset.from_generator(
            lambda: (
                {"inputs": np.asarray(i, np.int32), "targets": np.asarray(t, np.int32)} for i, t in pairs
            ),
            output_signature={
                "inputs": tf.TensorSpec([None], tf.int32),
                "targets": tf.TensorSpec([None], tf.int32),
            },
        )
        rows = list(converter(ds, lengths).as_numpy_iterator())
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            # Pad the last batch with copies of its first row so every call has one shape.
            chunk = chunk + [chunk[0]] * (self.batch_size - len(chunk))
            yield {k: np.stack([r[k] for r in chunk]) for k in chunk[0]}

    def _score_pairs(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        out: list[tuple[float, bool]] = []
        for batch in self._rows(pairs):
            scores, greedy = self._score_and_greedy(self.params, batch)
            out.extend(zip(np.asarray(scores).tolist(), np.asarray(greedy).tolist(), strict=True))
        return [(float(s), bool(g)) for s, g in out[: len(pairs)]]

    # -- the LM API ---------------------------------------------------------

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        """Log-likelihood of each continuation given its context, and whether greedy decoding gives it.

        Args:
          requests: lm-eval Instances whose ``args`` are ``(context, continuation)``.

        Returns:
          ``(log-likelihood, is_greedy)`` per request.
        """
        if not requests:
            return []
        pairs = [self._fit(*self._encode_pair(*req.args)) for req in requests]
        results = self._score_pairs(pairs)
        for req, result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, result)
        return results

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        """Log-likelihood of each whole string (scored in ``max_length`` windows when that is set).

        Args:
          requests: lm-eval Instances whose ``args`` are ``(text,)``.

        Returns:
          the summed log-likelihood per request.
        """
        pairs: list[tuple[list[int], list[int]]] = []
        owners: list[int] = []
        for n, req in enumerate(requests):
            tokens = list(self.output_vocabulary.encode(req.args[0]))
            window = self.max_length or max(len(tokens), 1)
            for start in range(0, max(len(tokens), 1), window):
                # Each window is scored after the tokens before it (as much as fits), never twice.
                chunk = tokens[start : start + window]
                context = self._encoder_ids("") if self.encoder_decoder else tokens[:start]
                pairs.append(self._fit(context, chunk))
                owners.append(n)
        totals = [0.0] * len(requests)
        for owner, (score, _) in zip(owners, self._score_pairs(pairs) if pairs else [], strict=True):
            totals[owner] += score
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests: list[Any]) -> list[str]:
        """Greedy continuation of each context, cut at the first stop string.

        Args:
          requests: lm-eval Instances whose ``args`` are ``(context, gen_kwargs)``
            with optional ``until`` (a string or list) and ``max_gen_toks``.

        Returns:
          the generated text per request.
        """
        results: list[str] = []
        greedy = "temperature" in inspect.signature(self.model.decode_fn).parameters
        for req in requests:
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            steps = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            ids = (
                self._encoder_ids(context)
                if self.encoder_decoder
                else list(self.input_vocabulary.encode(context))
            )
            if self.max_length is not None and not self.encoder_decoder:
                ids = ids[-max(self.max_length - steps, 1) :]
            batch = next(self._rows([(ids, [])], targets_length=steps))
            decodes, _ = self.model.predict_batch_with_aux(
                self.params, batch, decoder_params={"temperature": 0.0} if greedy else None
            )
            tokens = [int(t) for t in np.asarray(decodes)[0]][:steps]
            eos = int(self.output_vocabulary.eos_id)
            if eos in tokens:
                tokens = tokens[: tokens.index(eos)]
            text = self.output_vocabulary.decode([t for t in tokens if t > 0])
            for stop in until:
                if stop and stop in text:
                    text = text[: text.index(stop)]
            self.cache_hook.add_partial("generate_until", req.args, text)
            results.append(text)
        return results


def run_lm_eval(
    lm: LM,
    tasks: Sequence[str],
    *,
    include_path: Sequence[str] = (),
    include_defaults: bool | None = None,
    num_fewshot: int | None = None,
    limit: float | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Runs lm-eval's own evaluator (``lm_eval.simple_evaluate``) with ``lm``.

    Args:
      lm: the model, e.g. a :class:`T5xLM`.
      tasks: lm-eval task or group names.
      include_path: folders of extra task YAML files (local tasks).
      include_defaults: also index lm-eval's own tasks. None: only when some
        task is not found under ``include_path`` (indexing lm-eval's thousands
        of tasks takes seconds).
      num_fewshot: few-shot examples per prompt (None: each task's default).
      limit: examples per task (a fraction when below 1).
      **kwargs: more ``simple_evaluate`` arguments.

    Returns:
      lm-eval's results dict (``results["results"][task]["acc,none"]``, ...).

    Raises:
      ValueError: no task names.
    """
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    if not tasks:
        raise ValueError("run_lm_eval: give at least one lm-eval task name")
    manager = None
    if include_path and include_defaults is not True:
        manager = TaskManager(include_path=list(include_path), include_defaults=False)
        if include_defaults is None and not set(tasks) <= set(manager.all_tasks):
            manager = None
    if manager is None:
        manager = TaskManager(include_path=list(include_path) or None)
    results = simple_evaluate(
        model=lm, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit, task_manager=manager, **kwargs
    )
    assert results is not None  # None only on non-zero ranks of a distributed run
    return dict(results)
