"""Name map from Mesh TensorFlow / TF T5 checkpoint variables to the T5X state dict.

Mesh TensorFlow T5 names variables like ``encoder/block_003/layer_001/DenseReluDense/wi_0/kernel``
and stores Adafactor's slots beside them with a suffix (``..._slot_vr``,
``..._slot_vc``, ``..._slot_v``). Its kernels are already ``[in, out]`` with joined
heads, so values copy unchanged; only names move. The rules follow upstream t5x's
importer: per-block relative-position tables collapse to one per stack when only
block 0 has one, and the slots Flax's Adafactor keeps but TF's does not are
filled with ``(1,)`` placeholders.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from t5x.interfaces import unflatten
from t5x.models._config import T5Config

StatePath = tuple[str, ...]

_SLOTS = {"_slot_vc": "v_col", "_slot_vr": "v_row", "_slot_v": "v"}
_SLOT = r"(_slot_vc|_slot_vr|_slot_v)?"
_STACK = r"(encoder|decoder)"
_BLOCK = _STACK + r"/block_(\d+)/layer_(\d+)/"
_QKVO = {"q": "query", "k": "key", "v": "value", "o": "out"}
_NORMS = {
    "encoder": ("pre_attention_layer_norm", "pre_mlp_layer_norm"),
    "decoder": ("pre_self_attention_layer_norm", "pre_cross_attention_layer_norm", "pre_mlp_layer_norm"),
}
_FINAL_NORMS = {"encoder": "encoder_norm", "decoder": "decoder_norm"}

_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"shared/embedding" + _SLOT), "embedding"),
    (re.compile(_BLOCK + r"SelfAttention/relative_attention_bias" + _SLOT), "relpos"),
    (re.compile(_BLOCK + r"(SelfAttention|EncDecAttention)/([qkvo])" + _SLOT), "attention"),
    (re.compile(_BLOCK + r"DenseReluDense/(wi|wo|wi_\d+)/kernel" + _SLOT), "mlp"),
    (re.compile(_BLOCK + r"(?:layer|rms)_norm/scale" + _SLOT), "norm"),
    (re.compile(_STACK + r"/(?:final_layer|rms)_norm/scale" + _SLOT), "final_norm"),
    (re.compile(r"decoder/logits/kernel" + _SLOT), "logits"),
]


def _param_path(kind: str, groups: tuple[str | None, ...]) -> tuple[tuple[str, ...], str | None]:
    """``(parameter path below target, slot suffix)`` of one matched rule."""
    *fields, slot = groups
    if kind == "embedding":
        return ("token_embedder", "embedding"), slot
    if kind == "final_norm":
        stack = str(fields[0])
        return (stack, _FINAL_NORMS[stack], "scale"), slot
    if kind == "logits":
        return ("decoder", "logits_dense", "kernel"), slot
    stack, block, sub = str(fields[0]), int(str(fields[1])), int(str(fields[2]))
    layer = (stack, f"layers_{block}")
    if kind == "relpos":
        return (*layer, "relpos_bias", "rel_embedding"), slot
    if kind == "attention":
        attention_type, qkvo = str(fields[3]), str(fields[4])
        if stack == "encoder":
            attn = "attention"
        else:
            attn = "self_attention" if attention_type == "SelfAttention" else "encoder_decoder_attention"
        return (*layer, attn, _QKVO[qkvo], "kernel"), slot
    if kind == "mlp":
        return (*layer, "mlp", str(fields[3]), "kernel"), slot
    norms = _NORMS[stack]
    if sub >= len(norms):
        raise ValueError(
            f"{stack} block {block} has a layer norm in sub-layer {sub}; a {stack} block has {len(norms)} sub-layers"
        )
    return (*layer, norms[sub], "scale"), slot


def mtf_variable_to_t5x(name: str) -> StatePath | None:
    """The T5X state-dict path of one Mesh TensorFlow variable.

    Args:
      name: a variable name as TensorFlow's checkpoint reader lists it, e.g.
        ``encoder/block_000/layer_000/SelfAttention/q_slot_vr``.

    Returns:
      ``("target", ...)`` for a parameter, ``("state", "param_states", ...,
      slot)`` for an Adafactor slot, ``("state", "step")`` for
      ``global_step``; None for a name no rule covers.

    Raises:
      ValueError: for a layer-norm index a block of that stack cannot have.
    """
    if name == "global_step":
        return ("state", "step")
    for pattern, kind in _RULES:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        path, slot = _param_path(kind, match.groups())
        if slot is None:
            return ("target", *path)
        return ("state", "param_states", *path, _SLOTS[slot])
    return None


def _collapse_shared_relpos(flat: dict[StatePath, Any]) -> dict[StatePath, Any]:
    """Moves ``layers_0/relpos_bias`` to the stack when no other block has a table."""
    blocks = {
        (path[path.index("relpos_bias") - 2], path[path.index("relpos_bias") - 1])
        for path in flat
        if "relpos_bias" in path
    }
    per_layer = any(layer != "layers_0" for _, layer in blocks)
    if per_layer:
        return flat
    out: dict[StatePath, Any] = {}
    for path, value in flat.items():
        if "relpos_bias" in path:
            i = path.index("relpos_bias")
            path = (*path[: i - 1], *path[i:])
        out[path] = value
    return out


def _placeholder_slots(flat: dict[StatePath, Any]) -> None:
    """Adds the ``(1,)`` slots Flax's Adafactor keeps for every parameter (in place)."""
    placeholder = np.zeros((1,), np.float32)
    for path in [p for p in flat if p[0] == "target"]:
        slots = ("state", "param_states", *path[1:])
        has_slots = any((*slots, s) in flat for s in _SLOTS.values())
        if not has_slots:
            continue
        flat.setdefault((*slots, "m"), placeholder)
        if (*slots, "v") in flat:
            flat.setdefault((*slots, "v_row"), placeholder)
            flat.setdefault((*slots, "v_col"), placeholder)
        else:
            flat.setdefault((*slots, "v"), placeholder)


def mtf_to_t5x_state(variables: Mapping[str, Any]) -> dict[str, Any]:
    """Renames a Mesh TensorFlow T5 checkpoint's variables into a T5X state dict.

    Args:
      variables: ``name -> array`` as TensorFlow's checkpoint reader returns
        them (values are passed through unchanged, lazily read arrays included).

    Returns:
      ``{"target": params, "state": {"step": ..., "param_states": slots}}`` with
      upstream t5x names; ``param_states`` is empty when the checkpoint holds
      no optimizer slots.

    Raises:
      ValueError: when a variable has no T5X name (all such names are listed),
        or the checkpoint holds no parameters.
    """
    flat: dict[StatePath, Any] = {}
    unmapped: list[str] = []
    for name, value in variables.items():
        path = mtf_variable_to_t5x(name)
        if path is None:
            unmapped.append(name)
        else:
            flat[path] = value
    if unmapped:
        raise ValueError(
            f"Mesh TensorFlow variables with no T5X name: {sorted(unmapped)[:10]}"
            f"{' ...' if len(unmapped) > 10 else ''} (expected T5 encoder-decoder names such as "
            "'encoder/block_000/layer_000/SelfAttention/q')"
        )
    if not any(p[0] == "target" for p in flat):
        raise ValueError(f"the checkpoint holds no T5 parameters (variables: {sorted(variables)[:10]})")
    flat = _collapse_shared_relpos(flat)
    _placeholder_slots(flat)
    flat.setdefault(("state", "step"), np.int32(0))
    tree = unflatten(flat, sep=None)
    tree["state"].setdefault("param_states", {})
    tree["state"]["step"] = np.asarray(tree["state"]["step"]).astype(np.int32)
    return tree


def _count_layers(params: Mapping[str, Any], stack: str) -> int:
    layers = [k for k in params.get(stack, {}) if re.fullmatch(r"layers_\d+", k)]
    if not layers:
        raise ValueError(f"the parameters have no {stack} layers")
    return len(layers)


def t5_config_from_params(
    params: Mapping[str, Any],
    *,
    mlp_activation: str | None = None,
    max_distance: int = 128,
    dropout_rate: float = 0.0,
) -> T5Config:
    """Infers the :class:`T5Config` of an unscanned T5 parameter tree from its shapes.

    Layers split off a scanned tree (attention kernels ``[embed, heads, kv]``)
    are read as well.

    Shapes fix every size. They cannot say which activation a feed-forward block
    uses, so ``mlp_activation`` defaults to T5's: ``'relu'`` for a single ``wi``
    (T5.1.0) and ``'gelu'`` for a gated ``wi_0``/``wi_1`` (T5.1.1, mT5, ByT5).
    The relative-position ``max_distance`` is not stored either (T5 uses 128).

    Args:
      params: the ``target`` tree (``token_embedder``, ``encoder``, ``decoder``).
      mlp_activation: the activation of ``wi`` / ``wi_0``.
      max_distance: relative-position distance of the last bucket.
      dropout_rate: dropout of the rebuilt network.

    Returns:
      The config; ``logits_via_embedding`` is True when there is no
      ``decoder/logits_dense``.

    Raises:
      ValueError: for a tree that is not an unscanned T5 encoder-decoder.
    """
    try:
        embedding = params["token_embedder"]["embedding"]
        layer0 = params["encoder"]["layers_0"]
        query = layer0["attention"]["query"]["kernel"]
        mlp = layer0["mlp"]
    except KeyError as err:
        raise ValueError(
            f"not an unscanned T5 encoder-decoder parameter tree: missing {err} "
            "(expected token_embedder/embedding and encoder/layers_0/attention, mlp)"
        ) from None
    per_layer = "relpos_bias" in layer0
    relpos = (layer0 if per_layer else params["encoder"])["relpos_bias"]["rel_embedding"]
    num_heads, num_buckets = (int(d) for d in np.shape(relpos))
    vocab_size, emb_dim = (int(d) for d in np.shape(embedding))
    gated = "wi_0" in mlp
    wi = (mlp["wi_0"] if gated else mlp["wi"])["kernel"]
    act = mlp_activation or ("gelu" if gated else "relu")
    return T5Config(
        vocab_size=vocab_size,
        emb_dim=emb_dim,
        num_heads=num_heads,
        num_encoder_layers=_count_layers(params, "encoder"),
        num_decoder_layers=_count_layers(params, "decoder"),
        # Joined heads [embed, heads * kv]; a layer split from the scanned layout keeps them apart.
        head_dim=int(np.shape(query)[-1]) if np.ndim(query) == 3 else int(np.shape(query)[1]) // num_heads,
        mlp_dim=int(np.shape(wi)[1]),
        mlp_activations=(act, "linear") if gated else (act,),
        dropout_rate=dropout_rate,
        logits_via_embedding="logits_dense" not in params.get("decoder", {}),
        num_buckets=num_buckets,
        max_distance=max_distance,
        per_layer_relpos_bias=per_layer,
    )
