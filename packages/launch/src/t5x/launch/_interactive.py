"""A model with its parameters and train state in one Python object, for notebooks.

``InteractiveModel`` takes examples as plain dicts of text (``{"inputs": ...,
"targets": ...}``), tokenizes them with the model's vocabularies, converts
them with the model's feature converter and runs the same programs the jobs
run: decoding, scoring, and ``t5x.training.Trainer``'s train step.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from t5x.launch._assembly import feature_converter_for

Example = Mapping[str, str]
MetricFn = Callable[[list[str], list[str]], Mapping[str, float]]


def exact_match(targets: list[str], predictions: list[str]) -> dict[str, float]:
    """Percentage of predictions equal to their target (the default ``evaluate`` metric)."""
    same = sum(t == p for t, p in zip(targets, predictions, strict=True))
    return {"exact_match": 100.0 * same / max(1, len(targets))}


def _gin_bindings_of(fn: Any) -> dict[str, Any]:
    """The parameters gin binds for ``fn`` ({} for a function gin does not configure)."""
    import gin

    if fn is None:
        return {}
    try:
        return dict(gin.get_bindings(fn))
    except (ValueError, TypeError, KeyError):
        return {}


def _trim(ids: Sequence[int], eos_id: int | None) -> list[int]:
    """Token ids up to (not including) the first EOS, padding dropped."""
    out = []
    for token in ids:
        if eos_id is not None and token == eos_id:
            break
        if token != 0:
            out.append(int(token))
    return out


class InteractiveModel:
    """Predict, score, train and evaluate on in-memory examples.

    Build it with :meth:`from_model_dir` (a training run's folder: its
    ``config.gin`` and latest checkpoint), :meth:`from_gin` (gin files and
    optionally a checkpoint) or directly from a Model and its parameters.

    Every call pads its examples to ``batch_size`` rows and each feature to
    ``task_feature_lengths`` (longer texts are truncated), so each program is
    compiled once. ``train_step`` updates this object's train state; ``save``
    writes it as a T5X checkpoint that ``t5x-launch`` commands read.

    Args:
      model: a Model (e.g. ``t5x.models.EncoderDecoderModel``).
      params: its parameter tree; None initialises fresh ones from ``seed``.
      task_feature_lengths: e.g. ``{"inputs": 64, "targets": 32}``; a
        decoder-only model without inputs takes ``{"targets": N}``.
      batch_size: rows per program call.
      optimizer: for ``train_step`` (default T5X Adafactor).
      learning_rate_fn: step -> learning rate (None: the optimizer's own).
      partitioner: default ``PjitPartitioner(num_partitions=1)``.
      seed: initialisation, dropout and sampling seed.
      step: the train state's step to start from (a checkpoint's).
      add_eos: end every text with the vocabulary's EOS, as T5 tasks do.
      decoder_params: extra keyword arguments of the model's decoding
        function (e.g. ``{"temperature": 0.0}``).
    """

    def __init__(
        self,
        model: Any,
        params: Any = None,
        *,
        task_feature_lengths: Mapping[str, int],
        batch_size: int = 8,
        optimizer: Any = None,
        learning_rate_fn: Callable[[Any], Any] | None = None,
        partitioner: Any = None,
        seed: int = 0,
        step: int = 0,
        add_eos: bool = True,
        decoder_params: Mapping[str, Any] | None = None,
    ):
        import jax

        import t5x.training
        from t5x.launch._jobs import _default_optimizer, _default_partitioner

        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model = model
        self.task_feature_lengths = dict(task_feature_lengths)
        self.batch_size = batch_size
        self.add_eos = add_eos
        self.decoder_params = dict(decoder_params) if decoder_params else None
        self.partitioner = _default_partitioner(partitioner)
        self._converter = feature_converter_for(model, pack=False)
        lengths = self._converter.get_model_feature_lengths(self.task_feature_lengths)
        shapes = {name: (batch_size, length) for name, length in lengths.items()}
        initialized = t5x.training.init_train_state(
            model, _default_optimizer(optimizer), self.partitioner, shapes, seed=seed
        )
        self._trainer = t5x.training.Trainer(
            model,
            self.partitioner,
            initialized.state,
            initialized.shardings,
            learning_rate_fn=learning_rate_fn,
            seed=seed,
        )
        if params is not None:
            self._set_params(params)
        if step:
            like = self._trainer.state.step
            value = jax.device_put(jax.numpy.asarray(step, like.dtype), initialized.shardings.step)
            self._trainer.state = dataclasses.replace(self._trainer.state, step=value)
        self._rng = jax.random.PRNGKey(seed)
        self._programs: dict[str, Any] = {}

    # ---- building -----------------------------------------------------------------

    @classmethod
    def from_gin(
        cls,
        gin_files: Sequence[str],
        checkpoint_path: str | os.PathLike[str] | None = None,
        *,
        gin_bindings: Sequence[str] = (),
        step: int | None = None,
        task_feature_lengths: Mapping[str, int] | None = None,
        **kwargs: Any,
    ) -> InteractiveModel:
        """The gin-configured ``MODEL`` with a checkpoint's parameters (fresh ones without).

        Args:
          gin_files: e.g. ``["models/demo/tiny.gin"]`` or a run's ``config.gin``.
          checkpoint_path: a model folder (latest step, or ``step``) or a
            ``checkpoint_<step>`` folder.
          gin_bindings: extra ``"NAME = VALUE"`` bindings.
          step: the step to load from a model folder.
          task_feature_lengths: default: the config's ``TASK_FEATURE_LENGTHS`` macro.
          **kwargs: the constructor's other arguments.

        Raises:
          GinConfigError: a gin error, no ``MODEL``, or no lengths anywhere.
          FileNotFoundError, ValueError: no checkpoint there, or one that does
            not fit the model (names the parameter).
        """
        import gin

        from t5x.launch._gin_config import (
            GinArgs,
            GinConfigError,
            check_required_macros,
            macro_value,
            parse_gin,
        )
        from t5x.launch._zero_shot import load_checkpoint_params

        files = [str(f) for f in gin_files]
        parse_gin(GinArgs(tuple(files), tuple(gin_bindings)))
        check_required_macros()
        # A run's config.gin binds the model's parameters in its macro's scope (MODEL/...).
        with gin.config_scope("MODEL"):
            model = macro_value("MODEL")
            bound = _gin_bindings_of(getattr(model, "decode_fn", None))
        if model is gin.REQUIRED or model is None:
            raise GinConfigError(
                f"the macro MODEL is not set by {files}: pass a model gin file, e.g. models/demo/tiny.gin"
            )
        if task_feature_lengths is None:
            configured = macro_value("TASK_FEATURE_LENGTHS")
            if configured is gin.REQUIRED or not isinstance(configured, Mapping):
                raise GinConfigError(
                    f"no task_feature_lengths given and the macro TASK_FEATURE_LENGTHS is not set by {files}: "
                    "pass task_feature_lengths={'inputs': ..., 'targets': ...}"
                )
            task_feature_lengths = dict(configured)
        params, start = None, 0
        if checkpoint_path is not None:
            from t5x.checkpointing import load_t5x_checkpoint

            params = load_checkpoint_params(model, str(checkpoint_path), step=step)
            start = int(load_t5x_checkpoint(str(checkpoint_path), step=step)["state"]["step"])
        # The decoding function's gin bindings (e.g. the demo's temperature 0) are read when it is
        # traced, which may be after this config is gone: they become decoder_params.
        kwargs["decoder_params"] = {**bound, **(kwargs.get("decoder_params") or {})} or None
        return cls(model, params, task_feature_lengths=task_feature_lengths, step=start, **kwargs)

    @classmethod
    def from_model_dir(
        cls, model_dir: str | os.PathLike[str], *, step: int | None = None, **kwargs: Any
    ) -> InteractiveModel:
        """A training run's model from its folder: ``config.gin`` and the latest checkpoint (or ``step``).

        Raises:
          FileNotFoundError: the folder has no ``config.gin``.
        """
        config = pathlib.Path(model_dir) / "config.gin"
        if not config.is_file():
            raise FileNotFoundError(
                f"{config} not found: from_model_dir needs a training run's folder "
                "(or use InteractiveModel.from_gin with the model's gin files)"
            )
        return cls.from_gin([str(config)], model_dir, step=step, **kwargs)

    # ---- state ----------------------------------------------------------------------

    @property
    def params(self) -> Any:
        """The current parameters (on the devices)."""
        return self._trainer.state.params

    @property
    def step(self) -> int:
        """The train state's step."""
        return int(self._trainer.state.step)

    def _set_params(self, params: Any) -> None:
        import jax

        trainer = self._trainer
        expected = trainer.state.params
        want = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(expected)}
        got = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(params)}
        if want.keys() != got.keys():
            missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
            raise ValueError(
                f"params do not fit {type(self.model).__name__}: missing {missing[:5]}, unexpected {extra[:5]}"
            )
        for key, like in want.items():
            if tuple(np.shape(got[key])) != tuple(like.shape):
                raise ValueError(
                    f"params: {key} has shape {tuple(np.shape(got[key]))}, the model expects {tuple(like.shape)}"
                )
        placed = jax.tree.map(
            lambda value, like, sharding: jax.device_put(np.asarray(value).astype(like.dtype), sharding),
            params,
            expected,
            trainer.state_shardings.params,
        )
        trainer.state = trainer.state.replace_params(placed)

    # ---- examples to batches ----------------------------------------------------------

    def _vocabulary(self, feature: str) -> Any:
        if feature == "inputs":
            found = getattr(self.model, "input_vocabulary", None)
            if found is not None:
                return found
        vocabulary = getattr(self.model, "output_vocabulary", None) or getattr(self.model, "vocabulary", None)
        if vocabulary is None:
            raise ValueError(f"{type(self.model).__name__} has no vocabulary to tokenize {feature!r} with")
        return vocabulary

    def _tokenize(self, examples: Sequence[Example], *, need_targets: bool) -> list[dict[str, np.ndarray]]:
        rows = []
        for index, example in enumerate(examples):
            if not isinstance(example, Mapping):
                raise TypeError(f"example {index} is a {type(example).__name__}, expected a dict of text")
            row = {}
            for feature, length in self.task_feature_lengths.items():
                text = example.get(feature)
                if text is None and feature == "targets" and not need_targets:
                    text = ""  # decoding needs no target
                if not isinstance(text, str):
                    wanted = "needs" if text is None else "has a non-text"
                    raise ValueError(
                        f"example {index} {wanted} {feature!r} (got {text!r}); examples are dicts of text "
                        f"with the features {sorted(self.task_feature_lengths)}"
                    )
                vocabulary = self._vocabulary(feature)
                ids = [int(t) for t in vocabulary.encode(text)]
                if self.add_eos:
                    ids = [*ids[: length - 1], int(vocabulary.eos_id)]
                row[feature] = np.asarray(ids[:length], np.int32)
            rows.append(row)
        return rows

    def _batches(
        self, examples: Sequence[Example], *, need_targets: bool
    ) -> Iterator[tuple[dict[str, np.ndarray], int]]:
        """Model-feature batches of ``batch_size`` rows and how many of their rows are real."""
        import tensorflow as tf

        rows = self._tokenize(examples, need_targets=need_targets)
        signature = {f: tf.TensorSpec([None], tf.int32) for f in self.task_feature_lengths}
        dataset = tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=signature)
        converted = self._converter(dataset, self.task_feature_lengths)
        for batch in converted.batch(self.batch_size).as_numpy_iterator():
            real = len(next(iter(batch.values())))
            padded = {
                k: np.pad(v, [(0, self.batch_size - real)] + [(0, 0)] * (v.ndim - 1))
                for k, v in batch.items()
            }
            yield padded, real

    # ---- programs -------------------------------------------------------------------

    def _program(self, name: str, fn: Callable[..., Any], batch: Mapping[str, np.ndarray]) -> Any:
        if name not in self._programs:
            from t5x.training import batch_shardings, sharding_for

            replicated = sharding_for(self.partitioner, ())
            self._programs[name] = self.partitioner.partition(
                fn,
                in_shardings=(
                    self._trainer.state_shardings.params,
                    batch_shardings(self.partitioner, batch),
                    replicated,
                ),
                out_shardings=replicated,
            )
        return self._programs[name]

    def _next_rng(self) -> Any:
        import jax

        self._rng, rng = jax.random.split(self._rng)
        return rng

    # ---- the methods ----------------------------------------------------------------

    def predict_with_aux(self, examples: Sequence[Example]) -> tuple[list[str], dict[str, list[Any]]]:
        """Decoded text of each example, and the decoder's aux outputs (e.g. ``scores``) per example."""
        decoder_params = self.decoder_params

        def decode(params: Any, batch: Mapping[str, Any], rng: Any) -> Any:
            return self.model.predict_batch_with_aux(params, batch, rng, decoder_params)

        vocabulary = self._vocabulary("targets")
        eos = getattr(vocabulary, "eos_id", None)
        texts: list[str] = []
        aux: dict[str, list[Any]] = {}
        for batch, real in self._batches(examples, need_targets=False):
            global_batch = self._trainer.to_global(batch)
            tokens, extra = self._program("predict", decode, batch)(
                self.params, global_batch, self._next_rng()
            )
            tokens = np.asarray(tokens)
            texts.extend(vocabulary.decode(_trim(row, eos)) for row in tokens[:real])
            for key, value in extra.items():
                aux.setdefault(key, []).extend(np.asarray(value)[:real].tolist())
        return texts, aux

    def predict(self, examples: Sequence[Example]) -> list[str]:
        """Decoded text of each example (its ``targets``, if any, are ignored)."""
        return self.predict_with_aux(examples)[0]

    def score(self, examples: Sequence[Example]) -> list[float]:
        """Log-likelihood of each example's ``targets`` given its ``inputs`` (summed over tokens)."""

        def score(params: Any, batch: Mapping[str, Any], _: Any) -> Any:
            return self.model.score_batch(params, batch)

        scores: list[float] = []
        for batch, real in self._batches(examples, need_targets=True):
            global_batch = self._trainer.to_global(batch)
            values = self._program("score", score, batch)(self.params, global_batch, self._next_rng())
            scores.extend(float(v) for v in np.asarray(values)[:real])
        return scores

    def train_step(self, examples: Sequence[Example]) -> dict[str, float]:
        """Trains on ``examples``: one step per ``batch_size`` of them; the last step's metrics."""
        if not examples:
            raise ValueError("train_step needs at least one example")
        metrics: dict[str, Any] = {}
        for batch, _ in self._batches(examples, need_targets=True):
            metrics = self._trainer.train_step(batch)
        return {k: float(v) for k, v in metrics.items()}

    def evaluate(
        self,
        examples: Sequence[Example],
        metric_fns: Sequence[MetricFn] = (exact_match,),
        score_metric_fns: Sequence[Callable[[list[str], list[float]], Mapping[str, float]]] = (),
    ) -> dict[str, float]:
        """Metrics of the predictions (and scores) against the examples' ``targets``.

        Args:
          examples: dicts of text with ``targets``.
          metric_fns: ``fn(targets, predictions) -> {name: value}`` (seqio's
            predict-metric convention); default exact match.
          score_metric_fns: ``fn(targets, scores) -> {name: value}``.
        """
        missing = [i for i, e in enumerate(examples) if not isinstance(e.get("targets"), str)]
        if missing:
            raise ValueError(
                f"evaluate needs 'targets' text in every example; examples {missing[:5]} have none"
            )
        targets = [e["targets"] for e in examples]
        results: dict[str, float] = {}
        if metric_fns:
            predictions = self.predict(examples)
            for fn in metric_fns:
                results.update({k: float(v) for k, v in fn(targets, predictions).items()})
        if score_metric_fns:
            scores = self.score(examples)
            for score_fn in score_metric_fns:
                results.update({k: float(v) for k, v in score_fn(targets, scores).items()})
        return results

    def save(self, checkpoint_dir: str | os.PathLike[str]) -> str:
        """Writes the train state as ``checkpoint_dir/checkpoint_<step>``; returns that folder."""
        from t5x.checkpointing import Checkpointer

        checkpointer = Checkpointer(checkpoint_dir, async_save=False)
        try:
            checkpointer.save(self.step, self._trainer.state.state_dict())
            checkpointer.wait_until_finished()
        finally:
            checkpointer.close()
        return checkpointer.step_dir(self.step)
