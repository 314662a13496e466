import jax
import pytest
from jax.sharding import PartitionSpec as P

import t5x.partitioning as tp

MESH_AXES = ("data", "model")

# Logical axes of typical T5 arrays: parameters and activations.
PARAMS = {
    "token_embedder": ("vocab", "embed"),
    "query": ("embed", "joined_kv"),
    "wi": ("embed", "mlp"),
    "wo": ("mlp", "embed"),
    "relpos": ("heads", "relpos_buckets"),
    "scale": ("embed",),
    "scanned_wi": ("embed", "layers", "mlp"),
}
ACTIVATIONS = {
    "hidden": ("batch", "length", "embed"),
    "mlp_out": ("batch", "length", "mlp"),
    "logits": ("batch", "length", "vocab"),
    "attention": ("batch", "length", "heads", "kv"),
}


def _specs(rules, tree):
    return {k: tp.logical_to_mesh_axes(v, rules, MESH_AXES) for k, v in tree.items()}


def test_1d_activations_1d_params():
    rules = tp.standard_logical_axis_rules(1, 1)
    assert _specs(rules, PARAMS) == {
        "token_embedder": P("model", None),
        "query": P(None, "model"),
        "wi": P(None, "model"),
        "wo": P("model", None),
        "relpos": P("model", None),
        "scale": P(None),
        "scanned_wi": P(None, None, "model"),
    }
    assert _specs(rules, ACTIVATIONS) == {
        "hidden": P("data", None, None),
        "mlp_out": P("data", None, "model"),
        "logits": P("data", None, "model"),
        "attention": P("data", None, "model", None),
    }


def test_2d_parameters_put_embed_on_data():
    rules = tp.standard_logical_axis_rules(activation_partitioning_dims=1, parameter_partitioning_dims=2)
    specs = _specs(rules, PARAMS)
    assert specs["token_embedder"] == P("model", "data")
    assert specs["wi"] == P("data", "model")
    assert specs["wo"] == P("model", "data")
    assert specs["scale"] == P("data")
    # Activations: batch already holds 'data', so embed stays replicated.
    assert _specs(rules, ACTIVATIONS)["hidden"] == P("data", None, None)


def test_2d_activations_put_embed_on_model():
    rules = tp.standard_logical_axis_rules(activation_partitioning_dims=2, parameter_partitioning_dims=1)
    acts = _specs(rules, ACTIVATIONS)
    assert acts["hidden"] == P("data", None, "model")
    # mlp is placed first, so embed finds 'model' taken and is replicated.
    assert _specs(rules, PARAMS)["wi"] == P(None, "model")
    assert _specs(rules, PARAMS)["scale"] == P("model")


def test_2d_both():
    rules = tp.standard_logical_axis_rules(2, 2)
    assert _specs(rules, ACTIVATIONS)["hidden"] == P("data", None, "model")
    assert _specs(rules, PARAMS)["wi"] == P("data", "model")
    assert _specs(rules, PARAMS)["scale"] == P("model")


@pytest.mark.parametrize(("act", "par"), [(3, 1), (1, 0), (2, 3)])
def test_unsupported_dims(act, par):
    with pytest.raises(ValueError, match="must be 1 or 2"):
        tp.standard_logical_axis_rules(act, par)


def test_additional_rules_are_appended():
    rules = tp.standard_logical_axis_rules(additional_rules=[("experts", "data"), ("cache_length", None)])
    assert rules[-2:] == [("experts", "data"), ("cache_length", None)]
    assert tp.logical_to_mesh_axes(("experts", "embed", "mlp"), rules, MESH_AXES) == P("data", None, "model")


def test_unknown_name_names_it_and_the_rules():
    rules = tp.standard_logical_axis_rules()
    with pytest.raises(ValueError, match="unknown logical axis name 'expert'") as info:
        tp.logical_to_mesh_axes(("expert", "embed"), rules, MESH_AXES)
    assert "'batch' -> 'data'" in str(info.value)
    assert "additional_rules" in str(info.value)


def test_duplicate_name_is_an_error():
    with pytest.raises(ValueError, match="more than once"):
        tp.logical_to_mesh_axes(("embed", "embed"), tp.standard_logical_axis_rules(), MESH_AXES)


def test_rule_to_missing_mesh_axis_is_an_error():
    with pytest.raises(ValueError, match="does not have"):
        tp.logical_to_mesh_axes(("batch",), [("batch", "replica")], MESH_AXES)


def test_mesh_axis_names_pass_through():
    rules = tp.standard_logical_axis_rules()
    assert tp.logical_to_mesh_axes(("data", None, "model"), rules, MESH_AXES) == P("data", None, "model")
    assert tp.logical_to_mesh_axes((("data", "model"), None), rules, MESH_AXES) == P(("data", "model"), None)
    with pytest.raises(ValueError, match=r"names mesh axes \['replica'\]"):
        tp.logical_to_mesh_axes((("replica", "data"),), rules, MESH_AXES)
    # Without a mesh to check against, a mesh axis is just an unknown name.
    with pytest.raises(ValueError, match="unknown logical axis name 'data'"):
        tp.logical_to_mesh_axes(("data",), rules)


def test_first_applicable_rule_wins_and_taken_axes_are_skipped():
    rules = [("a", "model"), ("b", "model"), ("b", "data"), ("c", "data")]
    assert tp.logical_to_mesh_axes(("b", "a"), rules, MESH_AXES) == P("data", "model")
    # 'c' wants 'data', taken by 'b': replicated, not an error.
    assert tp.logical_to_mesh_axes(("c", "b", "a"), rules, MESH_AXES) == P(None, "data", "model")


class _Box:
    """Duck-typed stand-in for Flax's LogicallyPartitioned."""

    def __init__(self, value, names):
        self.value = value
        self.names = names

    def unbox(self):
        return self.value


def test_tree_mapping_accepts_tuples_specs_boxes_and_none():
    rules = tp.standard_logical_axis_rules(1, 2)
    tree = {
        "tuple": ("embed", "mlp"),
        "spec": P("vocab", "embed"),
        "box": _Box(object(), ("mlp", "embed")),
        "none": None,
        "nested": [("batch", "length")],
    }
    specs = tp.logical_to_partition_specs(tree, rules, MESH_AXES)
    assert specs == {
        "tuple": P("data", "model"),
        "spec": P("model", "data"),
        "box": P("model", "data"),
        "none": P(),
        "nested": [P("data", None)],
    }
    assert tp.get_logical_axes({"a": _Box(1, ("embed",)), "b": 2}) == {"a": ("embed",), "b": None}


def test_is_axes_leaf():
    assert tp.is_axes_leaf(("batch", None))
    assert tp.is_axes_leaf(None)
    assert tp.is_axes_leaf(P("batch"))
    assert not tp.is_axes_leaf(["batch"])
    assert not tp.is_axes_leaf({"a": ("batch",)})
    assert not tp.is_axes_leaf(jax.ShapeDtypeStruct((1,), "float32"))
