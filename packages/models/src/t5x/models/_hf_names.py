"""Name and layout map between t5x parameter trees and Hugging Face T5-family state dicts.

Covers ``transformers`` T5 (T5.1.0 and T5.1.1), mT5, ByT5 (same layout as T5)
and UMT5 (one relative-position table per layer). Hugging Face linear weights
are ``[out, in]``; t5x kernels are ``[in, out]`` (joined heads). Neither side
scales the query at run time (t5x folds ``1/sqrt(head_dim)`` into the query
initialiser only), so weights copy unchanged apart from transposes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import traverse_util

from t5x.models._config import T5Config
from t5x.models._scan import scan_params, unscan_params

_LAYER_NORM_EPSILON = 1e-6
# Hugging Face spells the tanh-approximated GELU (flax's default) "gelu_new";
# plain "gelu" there is the exact erf form, which our MlpBlock does not offer.
_HF_TO_OURS_ACT = {
    "relu": "relu",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "silu": "silu",
    "swish": "silu",
}
_OURS_TO_HF_ACT = {"relu": "relu", "gelu": "gelu_new", "silu": "silu", "swish": "silu"}
_ATTN_HF = {"query": "q", "key": "k", "value": "v", "out": "o"}


def _require(config: Mapping[str, Any], key: str) -> Any:
    if key not in config:
        raise KeyError(f"Hugging Face config is missing {key!r} (keys present: {sorted(config)})")
    return config[key]


def _activations_from_hf(feed_forward_proj: str) -> tuple[str, ...]:
    parts = feed_forward_proj.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        raise ValueError(f"feed_forward_proj must be 'ACT' or 'gated-ACT', got {feed_forward_proj!r}")
    act = parts[-1]
    # "gated-gelu" historically means the tanh GELU in transformers.
    if gated and act == "gelu":
        act = "gelu_new"
    if act not in _HF_TO_OURS_ACT:
        raise ValueError(
            f"feed_forward_proj activation {act!r} has no t5x equivalent; expected one of {sorted(_HF_TO_OURS_ACT)}"
        )
    ours = _HF_TO_OURS_ACT[act]
    return (ours, "linear") if gated else (ours,)


def _activations_to_hf(activations: tuple[str, ...]) -> str:
    if len(activations) == 1 and activations[0] in _OURS_TO_HF_ACT:
        act = _OURS_TO_HF_ACT[activations[0]]
        return act
    if len(activations) == 2 and activations[1] == "linear" and activations[0] in _OURS_TO_HF_ACT:
        act = _OURS_TO_HF_ACT[activations[0]]
        return "gated-gelu" if act == "gelu_new" else f"gated-{act}"
    raise ValueError(
        f"mlp_activations {activations!r} cannot be expressed in Hugging Face T5; expected (ACT,) or "
        f"(ACT, 'linear') with ACT in {sorted(_OURS_TO_HF_ACT)}"
    )


def _major_version(version: Any) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


def _scales_decoder_output(hf_config: Mapping[str, Any]) -> bool:
    # transformers >= 5 records the scaling separately and always ties lm_head;
    # older configs use tie_word_embeddings (default True) for both.
    if "scale_decoder_outputs" in hf_config:
        return bool(hf_config["scale_decoder_outputs"])
    if hf_config.get("model_type") == "mt5" and _major_version(hf_config.get("transformers_version")) >= 5:
        # transformers 5's mT5 forces tie_word_embeddings=True and never scales.
        return False
    return hf_config.get("tie_word_embeddings", True) is not False


def config_from_hf(hf_config: Mapping[str, Any], *, logits_via_embedding: bool) -> T5Config:
    """Builds the :class:`T5Config` of a Hugging Face T5-family ``config.json`` dict.

    Raises:
      ValueError: for a model type, activation or epsilon t5x cannot express.
    """
    model_type = hf_config.get("model_type", "t5")
    if model_type not in ("t5", "mt5", "umt5"):
        raise ValueError(f"model_type must be one of 't5', 'mt5', 'umt5', got {model_type!r}")
    eps = float(hf_config.get("layer_norm_epsilon", _LAYER_NORM_EPSILON))
    if eps != _LAYER_NORM_EPSILON:
        raise ValueError(f"layer_norm_epsilon must be {_LAYER_NORM_EPSILON} (t5x's RMS norm), got {eps}")
    num_layers = int(_require(hf_config, "num_layers"))
    return T5Config(
        vocab_size=int(_require(hf_config, "vocab_size")),
        emb_dim=int(_require(hf_config, "d_model")),
        num_heads=int(_require(hf_config, "num_heads")),
        num_encoder_layers=num_layers,
        num_decoder_layers=int(hf_config.get("num_decoder_layers") or num_layers),
        head_dim=int(_require(hf_config, "d_kv")),
        mlp_dim=int(_require(hf_config, "d_ff")),
        mlp_activations=_activations_from_hf(str(hf_config.get("feed_forward_proj", "relu"))),
        dropout_rate=float(hf_config.get("dropout_rate", 0.1)),
        logits_via_embedding=logits_via_embedding,
        num_buckets=int(hf_config.get("relative_attention_num_buckets", 32)),
        max_distance=int(hf_config.get("relative_attention_max_distance", 128)),
        per_layer_relpos_bias=model_type == "umt5",
    )


def config_to_hf(config: T5Config) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict of a :class:`T5Config`."""
    umt5 = config.per_layer_relpos_bias
    tied = config.logits_via_embedding
    return {
        "architectures": ["UMT5ForConditionalGeneration" if umt5 else "T5ForConditionalGeneration"],
        "model_type": "umt5" if umt5 else "t5",
        "vocab_size": config.vocab_size,
        "d_model": config.emb_dim,
        "d_kv": config.head_dim,
        "d_ff": config.mlp_dim,
        "num_layers": config.num_encoder_layers,
        "num_decoder_layers": config.num_decoder_layers,
        "num_heads": config.num_heads,
        "relative_attention_num_buckets": config.num_buckets,
        "relative_attention_max_distance": config.max_distance,
        "dropout_rate": config.dropout_rate,
        "layer_norm_epsilon": _LAYER_NORM_EPSILON,
        "initializer_factor": 1.0,
        "feed_forward_proj": _activations_to_hf(tuple(config.mlp_activations)),
        "is_encoder_decoder": True,
        "tie_word_embeddings": tied,
        "scale_decoder_outputs": tied,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }


def _layer_map(config: T5Config, stack: str, i: int) -> dict[tuple[str, ...], tuple[str, bool]]:
    """``t5x path -> (hf name, transpose)`` for layer ``i`` of ``stack``."""
    hf = f"{stack}.block.{i}.layer"
    out: dict[tuple[str, ...], tuple[str, bool]] = {}
    layer = (stack, f"layers_{i}")
    if stack == "encoder":
        blocks = [("attention", "pre_attention_layer_norm", "SelfAttention")]
    else:
        blocks = [
            ("self_attention", "pre_self_attention_layer_norm", "SelfAttention"),
            ("encoder_decoder_attention", "pre_cross_attention_layer_norm", "EncDecAttention"),
        ]
    for j, (attn, norm, hf_attn) in enumerate(blocks):
        out[(*layer, norm, "scale")] = (f"{hf}.{j}.layer_norm.weight", False)
        for ours, theirs in _ATTN_HF.items():
            out[(*layer, attn, ours, "kernel")] = (f"{hf}.{j}.{hf_attn}.{theirs}.weight", True)
    if config.per_layer_relpos_bias:
        out[(*layer, "relpos_bias", "rel_embedding")] = (
            f"{hf}.0.SelfAttention.relative_attention_bias.weight",
            True,
        )
    m = len(blocks)
    out[(*layer, "pre_mlp_layer_norm", "scale")] = (f"{hf}.{m}.layer_norm.weight", False)
    acts = tuple(config.mlp_activations)
    wis = ["wi"] if len(acts) == 1 else [f"wi_{k}" for k in range(len(acts))]
    for wi in [*wis, "wo"]:
        out[(*layer, "mlp", wi, "kernel")] = (f"{hf}.{m}.DenseReluDense.{wi}.weight", True)
    return out


def name_map(config: T5Config) -> dict[tuple[str, ...], tuple[str, bool]]:
    """``t5x path -> (Hugging Face name, transpose)`` for every unscanned parameter.

    The tied/untied output head is not included (it depends on the
    decoder-output scaling and is handled by the converters).
    """
    out: dict[tuple[str, ...], tuple[str, bool]] = {("token_embedder", "embedding"): ("shared.weight", False)}
    for stack, n, norm in (
        ("encoder", config.num_encoder_layers, "encoder_norm"),
        ("decoder", config.num_decoder_layers, "decoder_norm"),
    ):
        if not config.per_layer_relpos_bias:
            out[(stack, "relpos_bias", "rel_embedding")] = (
                f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                True,
            )
        for i in range(n):
            out.update(_layer_map(config, stack, i))
        out[(stack, norm, "scale")] = (f"{stack}.final_layer_norm.weight", False)
    return out


def _take(hf_state: Mapping[str, Any], name: str, transpose: bool, shape: tuple[int, ...]) -> np.ndarray:
    if name not in hf_state:
        raise KeyError(f"Hugging Face state is missing {name!r}")
    value = np.asarray(hf_state[name], dtype=np.float32)
    if transpose:
        value = value.T
    if value.shape != shape:
        raise ValueError(f"{name}: expected shape {shape} in t5x layout, got {value.shape}")
    return np.ascontiguousarray(value)


def _expected_shape(path: tuple[str, ...], config: T5Config) -> tuple[int, ...]:
    inner = config.num_heads * config.head_dim
    leaf = path[-2] if path[-1] == "kernel" else path[-1]
    if path == ("token_embedder", "embedding"):
        return (config.vocab_size, config.emb_dim)
    if path[-1] == "rel_embedding":
        return (config.num_heads, config.num_buckets)
    if path[-1] == "scale":
        return (config.emb_dim,)
    if leaf in ("query", "key", "value"):
        return (config.emb_dim, inner)
    if leaf == "out":
        return (inner, config.emb_dim)
    if leaf == "wo":
        return (config.mlp_dim, config.emb_dim)
    return (config.emb_dim, config.mlp_dim)


def hf_to_t5x_params(
    hf_state: Mapping[str, Any], hf_config: Mapping[str, Any], *, scan_layers: bool = False
) -> tuple[dict[str, Any], T5Config]:
    """Converts a Hugging Face T5-family state dict to a t5x parameter tree.

    Args:
      hf_state: ``name -> array`` as ``transformers`` saves it (``[out, in]``).
      hf_config: the ``config.json`` dict.
      scan_layers: return the scanned (scalable-T5) layout.

    Returns:
      ``(params, config)``: float32 numpy tree with upstream t5x names, and the
      matching :class:`T5Config`.

    Raises:
      KeyError: for a missing weight or config entry.
      ValueError: for a shape or setting t5x cannot express.
    """
    scaled = _scales_decoder_output(hf_config)
    shared = np.asarray(_require(hf_state, "shared.weight"), np.float32)
    head = np.asarray(hf_state["lm_head.weight"], np.float32) if "lm_head.weight" in hf_state else shared
    tied = scaled and np.array_equal(head, shared)
    config = config_from_hf(hf_config, logits_via_embedding=tied)
    flat: dict[tuple[str, ...], np.ndarray] = {}
    for path, (name, transpose) in name_map(config).items():
        flat[path] = _take(hf_state, name, transpose, _expected_shape(path, config))
    if not tied:
        kernel = head.T
        if scaled:
            # A scaled head that differs from the embedding: fold the factor in.
            kernel = kernel * np.float32(config.emb_dim**-0.5)
        if kernel.shape != (config.emb_dim, config.vocab_size):
            raise ValueError(
                f"lm_head.weight: expected shape {(config.vocab_size, config.emb_dim)}, got {head.shape}"
            )
        flat[("decoder", "logits_dense", "kernel")] = np.ascontiguousarray(kernel, np.float32)
    params = traverse_util.unflatten_dict(flat)
    if scan_layers:
        config = dataclasses.replace(config, scan_layers=True)
        params = scan_params(params, config)
    return params, config


def t5x_to_hf_state(
    params: Mapping[str, Any], config: T5Config
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Converts a t5x encoder-decoder parameter tree to a Hugging Face state dict.

    Args:
      params: parameter tree with upstream t5x names (scanned or not, as
        ``config.scan_layers`` says; a ``{'params': ...}`` wrapper is accepted).
      config: the network's :class:`T5Config`.

    Returns:
      ``(hf_state, hf_config)``: ``name -> float32 array`` in ``[out, in]``
      layout (tied heads write ``lm_head.weight`` as a copy of the embedding),
      and the ``config.json`` dict.

    Raises:
      KeyError: for a parameter the config implies but the tree lacks.
      ValueError: for a shape or setting Hugging Face T5 cannot express.
    """
    if not isinstance(config, T5Config):
        raise TypeError(f"config must be a T5Config, got {type(config).__name__}")
    tree = dict(params)
    if set(tree) == {"params"}:
        tree = dict(tree["params"])
    if config.scan_layers:
        tree = unscan_params(tree, config)
    flat = {tuple(k): np.asarray(v) for k, v in traverse_util.flatten_dict(tree).items()}
    names = name_map(config)
    expected_paths = set(names) | (
        set() if config.logits_via_embedding else {("decoder", "logits_dense", "kernel")}
    )
    unexpected = sorted("/".join(p) for p in set(flat) - expected_paths)
    if unexpected:
        raise ValueError(f"parameters with no Hugging Face name for this config: {unexpected[:5]}")
    state: dict[str, np.ndarray] = {}
    for path, (name, transpose) in names.items():
        if path not in flat:
            raise KeyError(f"t5x parameters are missing {'/'.join(path)}")
        value = np.asarray(flat[path], np.float32)
        shape = _expected_shape(path, config)
        if value.shape != shape:
            raise ValueError(f"{'/'.join(path)}: expected shape {shape}, got {value.shape}")
        state[name] = np.ascontiguousarray(value.T if transpose else value)
    if config.logits_via_embedding:
        state["lm_head.weight"] = state["shared.weight"].copy()
    else:
        path = ("decoder", "logits_dense", "kernel")
        if path not in flat:
            raise KeyError(
                "t5x parameters are missing decoder/logits_dense/kernel (logits_via_embedding=False)"
            )
        kernel = np.asarray(flat[path], np.float32)
        if kernel.shape != (config.emb_dim, config.vocab_size):
            raise ValueError(
                f"decoder/logits_dense/kernel: expected shape {(config.emb_dim, config.vocab_size)}, got {kernel.shape}"
            )
        state["lm_head.weight"] = np.ascontiguousarray(kernel.T)
    return state, config_to_hf(config)
