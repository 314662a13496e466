"""The trainer with a real scanned T5 from t5x-models and the real PjitPartitioner."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

models = pytest.importorskip("t5x.models", reason="needs t5x-models (test extra)")
partitioning = pytest.importorskip("t5x.partitioning", reason="needs t5x-partitioning (test extra)")

from t5x.training import (  # noqa: E402
    Trainer,
    adafactor,
    create_learning_rate_scheduler,
    init_train_state,
    standard_logical_factor_rules,
)

SHAPES = {
    "encoder_input_tokens": (4, 8),
    "decoder_input_tokens": (4, 6),
    "decoder_target_tokens": (4, 6),
    "decoder_loss_weights": (4, 6),
}


@pytest.mark.slow
def test_scanned_t5_trains_with_t5x_factor_rules():
    model = models.EncoderDecoderModel(models.preset("umt5_tiny", vocab_size=64))
    partitioner = partitioning.PjitPartitioner(num_partitions=1)
    optimizer = adafactor(logical_factor_rules=standard_logical_factor_rules())
    init = init_train_state(model, optimizer, partitioner, SHAPES, {k: jnp.int32 for k in SHAPES})
    assert init.params_axes["encoder/layers/mlp/wi_0/kernel"] == ("embed", "layers", "mlp")
    trainer = Trainer(
        model,
        partitioner,
        init.state,
        init.shardings,
        learning_rate_fn=create_learning_rate_scheduler("constant", base_learning_rate=0.05),
        num_microbatches=2,
    )
    rng = np.random.default_rng(0)
    targets = rng.integers(1, 64, (4, 6)).astype(np.int32)
    batch = {
        "encoder_input_tokens": rng.integers(1, 64, (4, 8)).astype(np.int32),
        "decoder_target_tokens": targets,
        "decoder_input_tokens": np.concatenate([np.zeros((4, 1), np.int32), targets[:, :-1]], axis=1),
        "decoder_loss_weights": np.ones((4, 6), np.int32),
    }
    losses = [float(trainer.train_step(batch)["loss"]) for _ in range(8)]
    assert losses[-1] < 0.6 * losses[0], losses
    slots = jax.device_get(trainer.state.state_dict()["state"]["param_states"])["encoder"]["layers"]
    # Kernel [embed 8, layers 2, mlp 16]: embed is the row, mlp the column, layers a batch dim.
    assert slots["mlp"]["wi_0"]["kernel"]["v_row"].shape == (8, 2)
    assert slots["mlp"]["wi_0"]["kernel"]["v_col"].shape == (2, 16)
    assert slots["mlp"]["wi_0"]["kernel"]["v"].shape == (1,)
    # Attention kernel [embed, layers, heads, kv]: heads and kv are both columns.
    assert slots["attention"]["query"]["kernel"]["v_col"].shape == (2, 4, 3)
    # A layer-norm scale [embed, layers] is only half-factored, so unfactored.
    assert slots["pre_mlp_layer_norm"]["scale"]["v"].shape == (8, 2)
