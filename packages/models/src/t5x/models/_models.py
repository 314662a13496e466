"""Model classes: losses, scoring and decoding around the Flax networks."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from t5x import decoding
from t5x.models._base import BaseModel
from t5x.models._chunked_loss import chunked_cross_entropy
from t5x.models._config import DecoderOnlyConfig, T5Config
from t5x.models._cpu_kernels import PACKED, pack_decode_kernels
from t5x.models._flops import decoder_only_flops_per_token, encoder_decoder_flops_per_token
from t5x.models._joined import JOINED, join_decode_kernels
from t5x.models._losses import (
    get_loss_normalizing_factor_and_weights,
    metrics_from_sums,
    token_cross_entropy,
)
from t5x.models._network import project_hidden
from t5x.models._reference import LazyReference
from t5x.models._step_kernels import CpuKernels, check_config, step_kernels
from t5x.models._transformer import DecoderOnlyTransformer, EncoderDecoderTransformer

PyTree = Any


def _check_batch(batch: Mapping[str, Any], required: tuple[str, ...], who: str) -> None:
    shapes = {k: tuple(np.shape(v)) for k, v in batch.items()}
    for name in required:
        if name not in batch:
            raise ValueError(f"{who}: batch is missing feature {name!r}; it has {shapes}")
    for name, shape in shapes.items():
        if len(shape) != 2:
            raise ValueError(f"{who}: feature {name!r} must be [batch, length], got shape {shape}")
    batch_sizes = {shape[0] for shape in shapes.values()}
    if len(batch_sizes) > 1:
        raise ValueError(f"{who}: features disagree on the batch size: {shapes}")


def _network_of(config: Any, module: Any, network_cls: type, config_cls: type, who: str) -> Any:
    """The network a model is built from: given as ``module=`` (upstream) or made from ``config``."""
    if isinstance(config, network_cls):  # upstream passes the network first, positionally
        config, module = (None, config) if module is None else (config, module)
    if module is not None:
        if not isinstance(module, network_cls):
            raise TypeError(f"{who}: module must be a {network_cls.__name__}, got {type(module).__name__}")
        if config is not None and config != getattr(module, "config", None):
            raise ValueError(f"{who}: config and module= disagree; give one of them")
        return module
    if not isinstance(config, config_cls):
        raise TypeError(f"{who} needs a {config_cls.__name__} (or module=), got {type(config).__name__}")
    return network_cls(config)


def _zeros_like_shapes(tree: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), tree)


def _init_rngs(module: Any, key: jax.Array) -> Any:
    """The rng streams ``module.init`` gets from the model's key.

    Ours split the key into a ``params`` and a ``dropout`` stream. A network that
    sets ``params_from_whole_key`` (t5x-upstream's example networks) gets the key
    itself as its ``params`` stream, as upstream's models pass it, so the same key
    draws upstream's initial parameters.
    """
    if getattr(module, "params_from_whole_key", False):
        return key
    params_rng, dropout_rng = jax.random.split(key)
    return {"params": params_rng, "dropout": dropout_rng}


def _run_init(init: Callable[[jax.Array], PyTree], rng: jax.Array) -> dict[str, PyTree]:
    """Runs ``init`` as one compiled program, cheaply compiled on CPU.

    Op-by-op initialisation compiles a program per parameter shape, and XLA:CPU's
    optimising passes triple the compile time of the random-number code while
    saving nothing on a function that runs once.
    """
    if isinstance(rng, jax.core.Tracer):  # under eval_shape / jit (sharded init): trace through
        return flax.core.unfreeze(init(rng))
    lowered = jax.jit(init).lower(rng)
    options = {}
    if jax.default_backend() == "cpu":
        options = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
    return flax.core.unfreeze(lowered.compile(compiler_options=options)(rng))


class _TransformerModel(BaseModel):
    """Loss, metrics and scoring shared by both model classes."""

    module: Any
    config: Any
    _required: tuple[str, ...] = ()

    def __init__(
        self,
        z_loss: float,
        label_smoothing: float,
        loss_normalizing_factor: Any,
        decode_fn: Callable[..., Any],
        feature_converter_cls: Any = None,
    ) -> None:
        if feature_converter_cls is not None:
            self.feature_converter_cls = feature_converter_cls
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
        self.z_loss = float(z_loss)
        self.label_smoothing = float(label_smoothing)
        self.loss_normalizing_factor = loss_normalizing_factor
        self.decode_fn = decode_fn
        # Compiled once per batch structure; called eagerly they would dispatch (and
        # compile) every layer op by op. Inside an outer jit they simply inline.
        self._logits_jit = jax.jit(self._logits)
        self._loss_jit = jax.jit(self._loss)
        self._score_jit = jax.jit(self._score, static_argnums=2)

    def _forward(
        self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any, hidden_only: bool = False
    ) -> jax.Array:
        """Teacher-forced logits, or with ``hidden_only`` the hidden states they come from."""
        raise NotImplementedError

    def _head_params(self, params: PyTree) -> PyTree:
        """The parameters ``project_hidden`` turns hidden states into logits with."""
        raise NotImplementedError

    def _logits(self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any) -> jax.Array:
        return self._forward(params, batch, dropout_rng)

    def compute_logits(self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any = None) -> jax.Array:
        """Teacher-forced logits ``[batch, length, vocab]`` (dropout only with ``dropout_rng``).

        Raises:
          ValueError: when the batch lacks a feature the model needs.
        """
        _check_batch(batch, self._required, type(self).__name__)
        return self._logits_jit(params, dict(batch), dropout_rng)

    def loss_fn(
        self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Summed (or normalised) cross entropy with z-loss and label smoothing.

        Args:
          params: parameter tree with upstream names.
          batch: model features ``[batch, length]``.
          dropout_rng: PRNG key, or None for no dropout.

        Returns:
          ``(loss, metrics)``.
        """
        _check_batch(batch, self._required, type(self).__name__)
        return self._loss_jit(params, dict(batch), dropout_rng)

    def _loss(
        self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        hidden = self._forward(params, batch, dropout_rng, hidden_only=True)
        loss, _, metrics = self._loss_of_hidden(params, batch, hidden)
        return loss, metrics

    def _loss_of_hidden(
        self, params: PyTree, batch: Mapping[str, Any], hidden: jax.Array, extra_loss: Any = 0.0
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """The cross entropy of the logits of ``hidden``, its z-loss part, and the metrics.

        The whole logits never exist: they and their gradient are made a slice of
        positions at a time (see ``chunked_cross_entropy``). The metrics' losses are
        of the cross entropy plus ``extra_loss`` (a subclass's auxiliary losses).
        """
        targets = jnp.asarray(batch["decoder_target_tokens"])
        factor, weights = get_loss_normalizing_factor_and_weights(self.loss_normalizing_factor, batch)
        loss_weights = (
            jnp.ones(targets.shape, jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
        )
        if factor is not None:
            loss_weights = loss_weights / factor
        # Metrics count real tokens, not the re-weighted ones of a normalising mode.
        real = batch.get("decoder_loss_weights")
        real = jnp.asarray(targets > 0 if real is None else real, jnp.float32)
        loss, z_loss, correct = chunked_cross_entropy(
            functools.partial(project_hidden, self.config),
            self._head_params(params),
            hidden,
            targets,
            loss_weights,
            real,
            label_smoothing=self.label_smoothing,
            z_loss=self.z_loss,
        )
        return loss, z_loss, metrics_from_sums(correct, targets, real, loss + extra_loss, z_loss)

    def eval_fn(self, params: PyTree, batch: Mapping[str, Any]) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``loss_fn`` without dropout."""
        return self.loss_fn(params, batch, None)

    def score_batch(
        self, params: PyTree, batch: Mapping[str, Any], return_intermediates: bool = False
    ) -> Any:
        """Log-likelihood of each sequence's targets.

        Args:
          params: parameter tree.
          batch: model features; ``decoder_loss_weights`` (when present) selects
            the scored positions.
          return_intermediates: also return ``{"token_scores": [batch, length]}``.

        Returns:
          ``[batch]`` float32 scores, or ``(scores, {"token_scores": ...})``.
        """
        _check_batch(batch, self._required, type(self).__name__)
        return self._score_jit(params, dict(batch), bool(return_intermediates))

    def _score(self, params: PyTree, batch: Mapping[str, Any], return_intermediates: bool) -> Any:
        logits = self._logits(params, batch, None).astype(jnp.float32)
        targets = batch["decoder_target_tokens"]
        token_scores = -token_cross_entropy(logits, targets)[0]
        weights = batch.get("decoder_loss_weights")
        if weights is not None:
            token_scores = token_scores * jnp.asarray(weights, jnp.float32)
        scores = jnp.sum(token_scores, axis=-1)
        if return_intermediates:
            return scores, {"token_scores": token_scores}
        return scores

    def _decode(
        self,
        inputs: jax.Array,
        cache: PyTree,
        tokens_to_logits: Callable[..., Any],
        rng: Any,
        decoder_params: Mapping[str, Any] | None,
        num_decodes: int,
        **extra: Any,
    ) -> tuple[jax.Array, jax.Array]:
        kwargs = dict(decoder_params or {})
        length = inputs.shape[1]
        limit = kwargs.get("max_decode_len")
        if limit is not None and int(limit) > length:
            raise ValueError(
                f"max_decode_len={limit} does not fit the KV cache: decoding length comes from the batch's "
                f"decoder_input_tokens of shape {tuple(inputs.shape)}; pad that feature to at least {limit}"
            )
        if rng is not None:
            kwargs["decode_rng"] = rng
        kwargs.setdefault("num_decodes", num_decodes)
        return self.decode_fn(
            inputs=inputs,
            cache=cache,
            tokens_to_logits=tokens_to_logits,
            eos_id=self.eos_id,
            cache_offset=1 if self.config.scan_layers else 0,
            **extra,
            **kwargs,
        )

    @property
    def cpu_kernels(self) -> CpuKernels:
        """Whether decoding steps run on the CPU kernels (``True``, ``False``, ``"auto"``; see ``CpuKernels``).

        Settable (the launcher sets it from its command line); a bool or ``"auto"`` becomes
        ``CpuKernels(enabled=...)``.
        """
        return self._cpu_kernels

    @cpu_kernels.setter
    def cpu_kernels(self, value: bool | str | CpuKernels) -> None:
        option = CpuKernels.of(value)
        check_config(option, self.config, type(self).__name__)
        self._cpu_kernels = option

    def step_kernels(self, params: PyTree, rows: int) -> str:
        """How a decode call whose steps have ``rows`` rows runs them: ``"packed"`` (the CPU
        kernels), ``"joined"`` (one row, joined kernels) or ``"xla"``.

        Raises:
          RuntimeError: when ``cpu_kernels`` is True and the CPU kernels cannot run here.
        """
        joins = rows == 1 and bool(join_decode_kernels(params["decoder"]))
        return step_kernels(self.cpu_kernels, self.config, rows, joins)

    def _step(self, params: PyTree, rows: int, after: PyTree) -> tuple[Any, dict[str, PyTree]]:
        """The network and variables a decode call's steps of ``rows`` rows run with.

        The decoder's kernels are packed (``"packed"``) or joined (``"joined"``) once per
        decode call, outside its loop; the encoder does not run per step. They are made from
        ``params`` only once ``after`` (the encoder's output, the prompt's cache) is computed:
        otherwise XLA may make them first and hold them through the encoder or prefill pass,
        whose buffers then come on top of theirs in the call's peak memory.
        """
        mode = self.step_kernels(params, rows)
        variables = {"params": params}
        if mode != "xla":
            params = lax.optimization_barrier((after, params))[1]
        if mode == "packed":
            variables[PACKED] = {"decoder": pack_decode_kernels(params["decoder"])}
        elif mode == "joined":
            variables[JOINED] = {"decoder": join_decode_kernels(params["decoder"])}
        return self.module.clone(step_kernels=mode), variables

    @property
    def FEATURE_CONVERTER_CLS(self) -> Any:
        """Upstream's name for ``feature_converter_cls``."""
        return self.feature_converter_cls

    @property
    def eos_id(self) -> int:
        """End-of-sequence id of the output vocabulary (1 when none was given)."""
        vocab = getattr(self, "output_vocabulary", None)
        return 1 if vocab is None else int(vocab.eos_id)


class EncoderDecoderModel(_TransformerModel):
    """A T5 encoder-decoder under the ``Model`` contract.

    Attributes:
      feature_converter_cls: ``t5x.feature_converters.EncDecFeatureConverter``,
        imported lazily.
      config: the network's ``T5Config``.
      module: the Flax ``EncoderDecoderTransformer``.
    """

    feature_converter_cls = LazyReference("t5x.feature_converters.EncDecFeatureConverter")
    _required: tuple[str, ...] = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")

    def __init__(
        self,
        config: T5Config | EncoderDecoderTransformer | None = None,
        input_vocabulary: Any = None,
        output_vocabulary: Any = None,
        *,
        module: EncoderDecoderTransformer | None = None,
        optimizer_def: Any = None,
        z_loss: float = 0.0,
        label_smoothing: float = 0.0,
        loss_normalizing_factor: Any = None,
        decode_fn: Callable[..., Any] = decoding.beam_search,
        cpu_kernels: bool | str | CpuKernels = "auto",
        feature_converter_cls: Any = None,
    ) -> None:
        """Builds the model.

        Args:
          config: network hyper-parameters (or the network itself, as upstream passes it).
          input_vocabulary: the inputs' vocabulary (kept for the launcher).
          output_vocabulary: the targets' vocabulary; its ``eos_id`` ends decoding.
          z_loss: coefficient of ``log(Z)**2``.
          label_smoothing: probability mass spread over the other classes.
          loss_normalizing_factor: None (sum over weighted tokens), a number, or a
            ``SpecialLossNormalizingFactor`` (or its name).
          decode_fn: ``t5x.decoding.beam_search`` or ``temperature_sample``.
          cpu_kernels: whether decoding steps run on the CPU kernels: ``"auto"`` (where
            they can), ``True``, ``False``, or a ``CpuKernels`` (also naming their build
            folder and compiler).
          module: upstream's keyword: an ``EncoderDecoderTransformer`` instead of ``config``.
          optimizer_def: upstream's keyword: the optimizer the launcher trains with
            (kept as ``optimizer_def``; None: the launcher's default).
          feature_converter_cls: upstream's keyword: the feature converter class the
            launcher builds the model's batches with (None: the class attribute).
        """
        network = _network_of(config, module, EncoderDecoderTransformer, T5Config, "EncoderDecoderModel")
        super().__init__(z_loss, label_smoothing, loss_normalizing_factor, decode_fn, feature_converter_cls)
        self.config = network.config
        self.module = network
        self.cpu_kernels = cpu_kernels
        self.optimizer_def = optimizer_def
        self.input_vocabulary = input_vocabulary
        self.output_vocabulary = output_vocabulary
        self._encode_jit = jax.jit(
            lambda params, tokens: self.module.apply(
                {"params": params}, tokens, enable_dropout=False, method="encode"
            )
        )

    def get_initial_variables(
        self,
        rng: Any,
        input_shapes: Mapping[str, tuple[int, ...]],
        input_types: Mapping[str, Any] | None = None,
    ) -> dict[str, PyTree]:
        """Initialises ``params`` and ``params_axes`` for the given feature shapes.

        Raises:
          ValueError: when ``encoder_input_tokens`` or ``decoder_input_tokens`` is missing.
        """
        for name in ("encoder_input_tokens", "decoder_input_tokens"):
            if name not in input_shapes:
                raise ValueError(f"input_shapes is missing {name!r}; got {dict(input_shapes)}")
        types = dict(input_types or {})
        enc_shape = tuple(input_shapes["encoder_input_tokens"])
        dec_shape = tuple(input_shapes["decoder_input_tokens"])
        enc_type = types.get("encoder_input_tokens", jnp.int32)
        dec_type = types.get("decoder_input_tokens", jnp.int32)
        packed = "encoder_segment_ids" in input_shapes

        def init(key: jax.Array) -> PyTree:
            enc, dec = jnp.ones(enc_shape, enc_type), jnp.ones(dec_shape, dec_type)
            segments = {"encoder_segment_ids": enc, "decoder_segment_ids": dec} if packed else {}
            return self.module.init(
                _init_rngs(self.module, key),
                enc,
                dec,
                dec,
                **segments,
                enable_dropout=False,
            )

        return _run_init(init, rng)

    def _forward(
        self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any, hidden_only: bool = False
    ) -> jax.Array:
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply(
            {"params": params},
            batch["encoder_input_tokens"],
            batch["decoder_input_tokens"],
            batch["decoder_target_tokens"],
            batch.get("encoder_segment_ids"),
            batch.get("decoder_segment_ids"),
            batch.get("encoder_positions"),
            batch.get("decoder_positions"),
            enable_dropout=dropout_rng is not None,
            rngs=rngs,
            hidden_only=hidden_only,
        )

    def _head_params(self, params: PyTree) -> PyTree:
        return (
            params["token_embedder"]
            if self.config.logits_via_embedding
            else params["decoder"]["logits_dense"]
        )

    def predict_batch_with_aux(
        self,
        params: PyTree,
        batch: Mapping[str, Any],
        rng: Any = None,
        decoder_params: Mapping[str, Any] | None = None,
        *,
        num_decodes: int = 1,
        return_all_decodes: bool = False,
        prompt_with_targets: bool = False,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Decodes ``[batch, target_length]`` tokens for each example.

        Args:
          params: parameter tree.
          batch: needs ``encoder_input_tokens`` and ``decoder_input_tokens`` (its
            length is the decode length).
          rng: PRNG key for sampling decoders.
          decoder_params: extra keyword arguments of ``decode_fn``.
          num_decodes: beams or samples per example.
          return_all_decodes: return ``[batch, num_decodes, length]``, best last.
          prompt_with_targets: force ``decoder_input_tokens`` as a prompt.

        Returns:
          ``(decodes [batch, length], {"scores": [batch]})`` (or all decodes).

        Raises:
          ValueError: when a feature is missing.
        """
        _check_batch(
            batch,
            ("encoder_input_tokens", "decoder_input_tokens"),
            "EncoderDecoderModel.predict_batch_with_aux",
        )
        enc = jnp.asarray(batch["encoder_input_tokens"])
        dec_in = batch["decoder_input_tokens"]
        length = dec_in.shape[1]
        cache = _zeros_like_shapes(
            jax.eval_shape(
                lambda: self.module.apply(
                    {"params": params},
                    jnp.ones(enc.shape, jnp.int32),
                    jnp.ones(dec_in.shape, jnp.int32),
                    jnp.ones(dec_in.shape, jnp.int32),
                    enable_dropout=False,
                    decode=True,
                    max_decode_length=length,
                    mutable=["cache"],
                )[1]["cache"]
            )
        )
        rows = num_decodes if decoder_params is None else decoder_params.get("num_decodes", num_decodes)
        encoded = self._encode_jit(params, enc)
        step_module, variables = self._step(params, enc.shape[0] * rows, after=encoded)

        def tokens_to_logits(state: Any) -> tuple[jax.Array, PyTree]:
            # The encoder's output is not copied per beam or sample: an example's rows share
            # its cross-attention keys and values (see `EncoderDecoderTransformer.decode`).
            logits, new_vars = step_module.apply(
                {**variables, "cache": state.cache},
                encoded,
                enc,
                state.cur_token,
                state.cur_token,
                enable_dropout=False,
                decode=True,
                max_decode_length=length,
                mutable=["cache"],
                method="decode",
            )
            return logits[:, 0, :], new_vars["cache"]

        if prompt_with_targets:
            prompt = jnp.asarray(dec_in) * (jnp.asarray(dec_in) != self.eos_id)
        else:
            prompt = jnp.zeros_like(jnp.asarray(dec_in))
        decodes, scores = self._decode(prompt, cache, tokens_to_logits, rng, decoder_params, num_decodes)
        if return_all_decodes:
            return decodes, {"scores": scores}
        return decodes[:, -1, :], {"scores": scores[:, -1]}

    def flops_per_token(self, model_feature_lengths: Mapping[str, int]) -> float:
        """Training FLOPs per input-or-target token (see ``encoder_decoder_flops_per_token``)."""
        return encoder_decoder_flops_per_token(self.config, model_feature_lengths)


def prefill_spans(length: int, shortest: int = 128) -> tuple[int, ...]:
    """Prompt-pass lengths a decoder-only model compiles for a cache of ``length`` positions.

    The powers of two from ``shortest`` below ``length``, then ``length``: a prompt pass runs
    over the shortest span that holds every prompt of the batch, at most twice its longest
    prompt, instead of the whole padded length (each span is compiled once).
    """
    spans = []
    span = shortest
    while span < length:
        spans.append(span)
        span *= 2
    return (*spans, length)


class DecoderOnlyModel(_TransformerModel):
    """A causal or prefix-LM decoder under the ``Model`` contract.

    Attributes:
      feature_converter_cls: ``t5x.feature_converters.DecoderFeatureConverter``,
        imported lazily.
      config: the network's ``DecoderOnlyConfig``.
      module: the Flax ``DecoderOnlyTransformer``.
    """

    feature_converter_cls = LazyReference("t5x.feature_converters.DecoderFeatureConverter")
    _required: tuple[str, ...] = ("decoder_input_tokens", "decoder_target_tokens")

    def __init__(
        self,
        config: DecoderOnlyConfig | DecoderOnlyTransformer | None = None,
        vocabulary: Any = None,
        *,
        module: DecoderOnlyTransformer | None = None,
        optimizer_def: Any = None,
        inputs_bidirectional_attention: bool = False,
        z_loss: float = 0.0,
        label_smoothing: float = 0.0,
        loss_normalizing_factor: Any = None,
        decode_fn: Callable[..., Any] = decoding.temperature_sample,
        cpu_kernels: bool | str | CpuKernels = "auto",
        feature_converter_cls: Any = None,
    ) -> None:
        """Builds the model.

        Args:
          config: network hyper-parameters.
          vocabulary: the vocabulary; its ``eos_id`` ends decoding.
          inputs_bidirectional_attention: the prefix marked by
            ``decoder_causal_attention`` attends bidirectionally (prefix LM).
          z_loss: coefficient of ``log(Z)**2``.
          label_smoothing: probability mass spread over the other classes.
          loss_normalizing_factor: as for ``EncoderDecoderModel``.
          decode_fn: ``t5x.decoding.temperature_sample`` or ``beam_search``.
          cpu_kernels: as for ``EncoderDecoderModel``.
          module: upstream's keyword: a ``DecoderOnlyTransformer`` instead of ``config``.
          optimizer_def: as for ``EncoderDecoderModel``.
          feature_converter_cls: as for ``EncoderDecoderModel`` (upstream's pre-packed
            tasks use ``seqio.PassThroughFeatureConverter``).
        """
        network = _network_of(config, module, DecoderOnlyTransformer, DecoderOnlyConfig, "DecoderOnlyModel")
        super().__init__(z_loss, label_smoothing, loss_normalizing_factor, decode_fn, feature_converter_cls)
        self.config = network.config
        self.module = network
        self.cpu_kernels = cpu_kernels
        self.optimizer_def = optimizer_def
        self.vocabulary = vocabulary
        self.input_vocabulary = vocabulary
        self.output_vocabulary = vocabulary
        self.inputs_bidirectional_attention = inputs_bidirectional_attention
        self._prefill_jit = jax.jit(self._prefill)
        if inputs_bidirectional_attention:
            self._required = (*self._required, "decoder_causal_attention")

    def get_initial_variables(
        self,
        rng: Any,
        input_shapes: Mapping[str, tuple[int, ...]],
        input_types: Mapping[str, Any] | None = None,
    ) -> dict[str, PyTree]:
        """Initialises ``params`` and ``params_axes`` for the given feature shapes.

        Raises:
          ValueError: when ``decoder_input_tokens`` is missing.
        """
        if "decoder_input_tokens" not in input_shapes:
            raise ValueError(f"input_shapes is missing 'decoder_input_tokens'; got {dict(input_shapes)}")
        dtype = dict(input_types or {}).get("decoder_input_tokens", jnp.int32)
        shape = tuple(input_shapes["decoder_input_tokens"])

        def init(key: jax.Array) -> PyTree:
            dec = jnp.ones(shape, dtype)
            return self.module.init(_init_rngs(self.module, key), dec, dec, enable_dropout=False)

        return _run_init(init, rng)

    def _causal_attention(self, batch: Mapping[str, Any]) -> Any:
        return batch["decoder_causal_attention"] if self.inputs_bidirectional_attention else None

    def _forward(
        self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any, hidden_only: bool = False
    ) -> jax.Array:
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply(
            {"params": params},
            batch["decoder_input_tokens"],
            batch["decoder_target_tokens"],
            batch.get("decoder_segment_ids"),
            batch.get("decoder_positions"),
            self._causal_attention(batch),
            enable_dropout=dropout_rng is not None,
            rngs=rngs,
            hidden_only=hidden_only,
        )

    def _head_params(self, params: PyTree) -> PyTree:
        name = "token_embedder" if self.config.logits_via_embedding else "logits_dense"
        return params["decoder"][name]

    def prefill_cache(self, params: PyTree, batch: Mapping[str, Any]) -> tuple[PyTree, jax.Array]:
        """Fills a fresh KV cache with each example's prompt in one pass.

        The prompt is the part of ``decoder_input_tokens`` under
        ``decoder_causal_attention`` but its last position, which decoding feeds
        first. The pass runs over the shortest of ``prefill_spans`` that holds
        every prompt, not the whole padded length.

        Returns:
          ``(cache, initial_index [batch])``.

        Raises:
          ValueError: when a feature is missing.
        """
        _check_batch(
            batch, ("decoder_input_tokens", "decoder_causal_attention"), "DecoderOnlyModel.prefill_cache"
        )
        features = {k: batch[k] for k in ("decoder_input_tokens", "decoder_causal_attention")}
        return self._prefill_jit(params, features)

    def _prefill(self, params: PyTree, batch: Mapping[str, Any]) -> tuple[PyTree, jax.Array]:
        dca = jnp.asarray(batch["decoder_causal_attention"], jnp.int32)
        inputs = jnp.asarray(batch["decoder_input_tokens"], jnp.int32) * dca
        lengths = jnp.maximum(jnp.sum(dca, axis=1) - 1, 0).astype(jnp.int32)
        cache = _zeros_like_shapes(
            jax.eval_shape(
                lambda: self.module.apply(
                    {"params": params},
                    jnp.ones(inputs.shape, jnp.int32),
                    jnp.ones(inputs.shape, jnp.int32),
                    enable_dropout=False,
                    decode=True,
                    max_decode_length=inputs.shape[1],
                    mutable=["cache"],
                )[1]["cache"]
            )
        )

        def prefill(span: int) -> Callable[[], PyTree]:
            def run() -> PyTree:
                head = dca[:, :span]
                _, new_vars = self.module.apply(
                    {"params": params, "cache": cache},
                    inputs[:, :span],
                    head,
                    None,
                    None,
                    head if self.inputs_bidirectional_attention else None,
                    enable_dropout=False,
                    prefill=True,
                    prefill_lengths=lengths,
                    mutable=["cache"],
                )
                return new_vars["cache"]

            return run

        # The prompts' positions (those under decoder_causal_attention) decide the result; a
        # pass over the shortest span holding all of them fills the same cache.
        spans = prefill_spans(inputs.shape[1])
        needed = jnp.max(jnp.sum(dca, axis=1))
        branch = jnp.sum(jnp.asarray(spans) < needed)
        return jax.lax.switch(branch, [prefill(span) for span in spans]), lengths

    def predict_batch_with_aux(
        self,
        params: PyTree,
        batch: Mapping[str, Any],
        rng: Any = None,
        decoder_params: Mapping[str, Any] | None = None,
        *,
        num_decodes: int = 1,
        return_all_decodes: bool = False,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Continues each example's prompt; returns only the continuation.

        Args:
          params: parameter tree.
          batch: ``decoder_input_tokens`` and ``decoder_causal_attention`` (1 on
            the prompt plus one position, as the prefix-LM converter makes it).
          rng: PRNG key for sampling.
          decoder_params: extra keyword arguments of ``decode_fn``.
          num_decodes: samples or beams per example.
          return_all_decodes: return ``[batch, num_decodes, length]``, best last.

        Returns:
          ``(continuations [batch, length], {"scores": [batch]})``, continuations
          left-aligned and zero-padded.

        Raises:
          ValueError: when a feature is missing.
        """
        _check_batch(
            batch,
            ("decoder_input_tokens", "decoder_causal_attention"),
            "DecoderOnlyModel.predict_batch_with_aux",
        )
        length = batch["decoder_input_tokens"].shape[1]
        cache, lengths = self.prefill_cache(params, batch)
        inputs = jnp.asarray(batch["decoder_input_tokens"], jnp.int32) * jnp.asarray(
            batch["decoder_causal_attention"], jnp.int32
        )
        rows = num_decodes if decoder_params is None else decoder_params.get("num_decodes", num_decodes)
        step_module, variables = self._step(params, inputs.shape[0] * rows, after=cache)

        def tokens_to_logits(state: Any) -> tuple[jax.Array, PyTree]:
            logits, new_vars = step_module.apply(
                {**variables, "cache": state.cache},
                state.cur_token,
                state.cur_token,
                enable_dropout=False,
                decode=True,
                max_decode_length=length,
                mutable=["cache"],
            )
            return logits[:, 0, :], new_vars["cache"]

        decodes, scores = self._decode(
            inputs, cache, tokens_to_logits, rng, decoder_params, num_decodes, initial_index=lengths
        )
        # Shift each row left past its prompt so only the continuation remains.
        positions = jnp.arange(length)[None, None, :] + lengths[:, None, None]
        shifted = jnp.take_along_axis(decodes, jnp.minimum(positions, length - 1), axis=-1)
        decodes = jnp.where(positions < length, shifted, 0)
        if return_all_decodes:
            return decodes, {"scores": scores}
        return decodes[:, -1, :], {"scores": scores[:, -1]}

    def flops_per_token(self, model_feature_lengths: Mapping[str, int]) -> float:
        """Training FLOPs per token (see ``decoder_only_flops_per_token``)."""
        return decoder_only_flops_per_token(self.config, model_feature_lengths)


def get_input_vocabulary(model: Any) -> Any:
    """The vocabulary a model reads its inputs with (upstream's gin plumbing for export and infer)."""
    return model.input_vocabulary


def get_output_vocabulary(model: Any) -> Any:
    """The vocabulary a model writes its outputs with."""
    return model.output_vocabulary
