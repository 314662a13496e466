"""Upstream MoE checkpoints: flaxformer's names, shapes and axis orders, written on disk and loaded.

The expected trees below are written out by hand from flaxformer's MoE sources
(``flaxformer/architectures/moe/moe_layers.py``: experts are an ``MlpBlock`` vmapped
with its parameters on axis 0 under ``expert``; ``routing.py``: ``router_weights/w``;
``moe_architecture.py``: scanned stacks repeat ``subblock_<j>`` blocks under
``<stack>/<stack>``; ``moe_architecture_test.py`` ``test_scan_architecture`` lists the
scanned shapes), not derived from this package's models.
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import traverse_util

from t5x.checkpointing import save_t5x_checkpoint
from t5x.moe import (
    MoeBlock,
    MoeEncoderDecoderModel,
    MoeT5Config,
    load_upstream_moe_params,
    unscan_flaxformer_moe_params,
    upstream_moe_params,
)

# Distinct sizes, so that a swapped axis cannot go unnoticed.
V, D, H, DH, F, E, BUCKETS = 40, 12, 2, 8, 20, 4, 32
CONFIG = MoeT5Config(
    vocab_size=V,
    emb_dim=D,
    num_heads=H,
    head_dim=DH,
    mlp_dim=F,
    mlp_activations=("gelu", "linear"),
    num_encoder_layers=4,
    num_decoder_layers=2,
    dropout_rate=0.0,
    num_experts=E,
    moe_layer_period=2,
    eval_capacity_factor=float(E),  # room for every token: nothing dropped
    min_expert_capacity=1,
)
SHAPES = {"encoder_input_tokens": (2, 8), "decoder_input_tokens": (2, 6)}


def _layer_table(attention: tuple[str, ...], norms: tuple[str, ...], sparse: bool) -> dict[str, tuple]:
    table = {}
    for name in attention:
        for proj in ("query", "key", "value"):
            table[f"{name}/{proj}/kernel"] = (D, H * DH)  # flaxformer keeps heads joined
        table[f"{name}/out/kernel"] = (H * DH, D)
    for norm in norms:
        table[f"{norm}/scale"] = (D,)
    if sparse:
        table["mlp/router/router_weights/w/kernel"] = (D, E)  # upstream gin: use_bias=False
        table["mlp/expert/wi_0/kernel"] = (E, D, F)
        table["mlp/expert/wi_1/kernel"] = (E, D, F)
        table["mlp/expert/wo/kernel"] = (E, F, D)
    else:
        table["mlp/wi_0/kernel"] = (D, F)
        table["mlp/wi_1/kernel"] = (D, F)
        table["mlp/wo/kernel"] = (F, D)
    return table


def flaxformer_unscanned_table(per_layer_relpos: bool) -> dict[str, tuple]:
    """Every parameter of flaxformer's MoE encoder-decoder (MIXED layout, period 2), unscanned."""
    table = {
        "token_embedder/embedding": (V, D),
        "encoder/encoder_norm/scale": (D,),
        "decoder/decoder_norm/scale": (D,),
        "decoder/logits_dense/kernel": (D, V),
    }
    if not per_layer_relpos:
        table["encoder/relpos_bias/rel_embedding"] = (H, BUCKETS)
        table["decoder/relpos_bias/rel_embedding"] = (H, BUCKETS)
    stacks = {
        "encoder": (4, ("attention",), ("pre_attention_layer_norm", "pre_mlp_layer_norm")),
        "decoder": (
            2,
            ("self_attention", "encoder_decoder_attention"),
            ("pre_self_attention_layer_norm", "pre_cross_attention_layer_norm", "pre_mlp_layer_norm"),
        ),
    }
    for stack, (depth, attention, norms) in stacks.items():
        for i in range(depth):
            for name, shape in _layer_table(attention, norms, sparse=i % 2 == 1).items():
                table[f"{stack}/layers_{i}/{name}"] = shape
            if per_layer_relpos:
                table[f"{stack}/layers_{i}/relpos_bias/rel_embedding"] = (H, BUCKETS)
    return table


def _random_tree(table: dict[str, tuple], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    flat = {tuple(k.split("/")): (rng.standard_normal(s) * 0.3).astype(np.float32) for k, s in table.items()}
    return traverse_util.unflatten_dict(flat)


def _flaxformer_scanned(tree: dict) -> dict:
    """Stacks an unscanned tree the way flaxformer's scanned MoE stacks hold it."""
    flat = traverse_util.flatten_dict(tree)
    out, blocks = {}, {}
    for path, value in flat.items():
        if path[0] in ("encoder", "decoder") and path[1].startswith("layers_"):
            i = int(path[1][len("layers_") :])
            blocks.setdefault((path[0], path[0], f"subblock_{i % 2}", *path[2:]), []).append((i // 2, value))
        else:
            out[path] = value
    for path, values in blocks.items():
        out[path] = np.stack([v for _, v in sorted(values, key=lambda t: t[0])], axis=1)
    return traverse_util.unflatten_dict(out)


def _shapes(tree) -> dict[str, tuple]:
    return {"/".join(k): tuple(np.shape(v)) for k, v in traverse_util.flatten_dict(tree).items()}


def _batch(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    targets = rng.integers(1, V, (2, 6), dtype=np.int32)
    return {
        "encoder_input_tokens": rng.integers(1, V, (2, 8), dtype=np.int32),
        "decoder_input_tokens": np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], 1),
        "decoder_target_tokens": targets,
    }


def test_our_trees_are_flaxformers(tmp_path):
    model = MoeEncoderDecoderModel(CONFIG)
    ours = jax.eval_shape(lambda r: model.get_initial_variables(r, SHAPES)["params"], jax.random.PRNGKey(0))
    assert _shapes(ours) == flaxformer_unscanned_table(per_layer_relpos=False)
    scanned_cfg = dataclasses.replace(CONFIG, scan_layers=True, per_layer_relpos_bias=True)
    scanned = MoeEncoderDecoderModel(scanned_cfg)
    ours_scanned = jax.eval_shape(
        lambda r: scanned.get_initial_variables(r, SHAPES)["params"], jax.random.PRNGKey(0)
    )
    upstream = _shapes(_flaxformer_scanned(_random_tree(flaxformer_unscanned_table(True), 0)))
    # flaxformer's scanned shapes (as its test_scan_architecture lists them): layers on axis 1.
    assert upstream["encoder/encoder/subblock_1/mlp/expert/wi_0/kernel"] == (E, 2, D, F)
    assert upstream["encoder/encoder/subblock_1/mlp/router/router_weights/w/kernel"] == (D, 2, E)
    assert upstream["decoder/decoder/subblock_0/relpos_bias/rel_embedding"] == (H, 1, BUCKETS)
    # Ours keeps the scanned MoE blocks under <stack>/layers with split attention heads, as the
    # dense scanned models do; otherwise the same sub-blocks, names and (expert, layers, ...) order.
    renamed = {}
    for name, shape in upstream.items():
        parts = name.split("/")
        if parts[0] == parts[1]:
            parts[1] = "layers"
            if parts[3] in ("attention", "self_attention", "encoder_decoder_attention"):
                shape = (shape[0], shape[1], H, DH) if parts[4] != "out" else (H, shape[1], DH, D)
        renamed["/".join(parts)] = shape
    assert _shapes(ours_scanned) == renamed


@pytest.fixture(scope="module")
def upstream_tree():
    return _random_tree(flaxformer_unscanned_table(per_layer_relpos=True), seed=1)


def test_an_upstream_checkpoint_on_disk_loads_and_its_experts_compute_as_flaxformers(tmp_path, upstream_tree):
    cfg = dataclasses.replace(CONFIG, per_layer_relpos_bias=True)
    save_t5x_checkpoint(
        tmp_path, 7, {"target": upstream_tree, "state": {"step": np.int32(7)}}, compression="gzip"
    )
    params = load_upstream_moe_params(str(tmp_path), cfg)
    assert _shapes(params) == _shapes(upstream_tree)
    # One sparse layer against a NumPy Switch layer (top-1, output scaled by the router's
    # probability, gated GELU expert): expert e's weights are index e of the expert axis.
    layer = params["encoder"]["layers_3"]["mlp"]
    x = np.random.default_rng(2).standard_normal((2, 8, D)).astype(np.float32)
    got = MoeBlock(config=cfg).apply({"params": layer}, x, deterministic=True)
    logits = x @ layer["router"]["router_weights"]["w"]["kernel"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    chosen = probs.argmax(-1)
    wi_0, wi_1, wo = (np.asarray(layer["expert"][n]["kernel"]) for n in ("wi_0", "wi_1", "wo"))
    h0 = np.einsum("bld,bldf->blf", x, wi_0[chosen])
    gelu = 0.5 * h0 * (1 + np.tanh(np.sqrt(2 / np.pi) * (h0 + 0.044715 * h0**3)))
    h = gelu * np.einsum("bld,bldf->blf", x, wi_1[chosen])
    want = probs.max(-1)[..., None] * np.einsum("blf,blfd->bld", h, wo[chosen])
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-6)


def test_a_scanned_upstream_checkpoint_loads_into_the_scanned_model(tmp_path, upstream_tree):
    cfg = dataclasses.replace(CONFIG, per_layer_relpos_bias=True)
    scanned_cfg = dataclasses.replace(cfg, scan_layers=True)
    upstream_scanned = _flaxformer_scanned(upstream_tree)
    save_t5x_checkpoint(tmp_path, 3, {"target": upstream_scanned, "state": {"step": np.int32(3)}})
    params = load_upstream_moe_params(str(tmp_path), scanned_cfg)
    batch = _batch(3)
    want = MoeEncoderDecoderModel(cfg).compute_logits(upstream_tree, batch)
    got = MoeEncoderDecoderModel(scanned_cfg).compute_logits(params, batch)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    biased = traverse_util.flatten_dict(upstream_tree)
    biased[("encoder", "layers_1", "mlp", "router", "router_weights", "w", "bias")] = np.zeros(E, np.float32)
    with pytest.raises(
        ValueError, match=r"bias parameters \(encoder/layers_1/mlp/router/router_weights/w/bias\)"
    ):
        upstream_moe_params(traverse_util.unflatten_dict(biased), cfg)
    with pytest.raises(
        ValueError, match=r"the config's encoder has 6 layers in blocks of moe_layer_period=2"
    ):
        unscan_flaxformer_moe_params(upstream_scanned, dataclasses.replace(cfg, num_encoder_layers=6))
