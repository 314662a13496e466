import dataclasses

import pytest

from t5x.interfaces import ArraySpec, DataLayout, RestoredCheckpoint, ShardInfo


def test_shard_info_accepts_valid_and_is_frozen():
    info = ShardInfo(index=1, num_shards=4)
    assert (info.index, info.num_shards) == (1, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.index = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("index", "num_shards", "message"),
    [(4, 4, r"index.*\[0, 4\).*4"), (-1, 2, "index"), (0, 0, "num_shards")],
)
def test_shard_info_rejects_out_of_range(index, num_shards, message):
    with pytest.raises(ValueError, match=message):
        ShardInfo(index=index, num_shards=num_shards)


def test_data_layout_splits_the_batch():
    layout = DataLayout(batch_size=32, shard_id=1, num_shards=4)
    assert layout.per_shard_batch_size == 8
    assert layout.shard_info == ShardInfo(1, 4)


def test_data_layout_names_the_numbers_when_the_batch_does_not_divide():
    with pytest.raises(ValueError, match="batch_size=30.*num_shards=4"):
        DataLayout(batch_size=30, shard_id=0, num_shards=4)


def test_value_types_compare_by_value():
    assert ArraySpec((None, 8), "int32") == ArraySpec((None, 8), "int32")
    assert RestoredCheckpoint(3, {"target": {}}).input_state is None
