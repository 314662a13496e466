"""infer: order, padding of the last batch, atomic output, resuming mid-dataset."""

import json
import os

import jax
import numpy as np
import pytest
from training_doubles import ArrayIterator, LocalPartitioner, TinyModel, make_data

from t5x.training import infer


class FailingIterator(ArrayIterator):
    def __init__(self, *args, fail_at, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at, self.served = fail_at, 0

    def __next__(self):
        if self.served == self.fail_at:
            raise RuntimeError("preempted")
        self.served += 1
        return super().__next__()


@pytest.fixture(scope="module")
def setup():
    model = TinyModel()
    params = model.get_initial_variables(jax.random.PRNGKey(0), {})["params"]
    return model, params, LocalPartitioner(), make_data(30, seed=11)


def _read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_predict_in_order_with_padded_last_batch(setup, tmp_path):
    model, params, partitioner, data = setup
    out = infer(
        model,
        params,
        partitioner,
        ArrayIterator(data, 8, repeat=False, shuffle=False),
        str(tmp_path / "p.jsonl"),
        batch_size=8,
    )
    records = _read(out)
    assert [r["index"] for r in records] == list(range(30))
    want, aux = model.predict_batch_with_aux(params, data)
    assert [r["prediction"] for r in records] == np.asarray(want).tolist()
    np.testing.assert_allclose([r["score"] for r in records], np.asarray(aux["scores"]), rtol=1e-5)
    assert os.path.exists(out + ".COMPLETED")
    assert not os.path.exists(out + ".parts")


def test_score_resumes_after_interruption(setup, tmp_path):
    model, params, partitioner, data = setup
    path = str(tmp_path / "s.jsonl")
    with pytest.raises(RuntimeError, match="preempted"):
        infer(
            model,
            params,
            partitioner,
            FailingIterator(data, 4, repeat=False, shuffle=False, fail_at=5),
            path,
            batch_size=4,
            mode="score",
            chunk_batches=2,
        )
    assert not os.path.exists(path)
    assert len([n for n in os.listdir(path + ".parts") if n.endswith(".jsonl")]) == 2  # batches 0-3 kept
    resumed = ArrayIterator(data, 4, repeat=False, shuffle=False)
    infer(model, params, partitioner, resumed, path, batch_size=4, mode="score", chunk_batches=2)
    records = _read(path)
    assert [r["index"] for r in records] == list(range(30))
    np.testing.assert_allclose(
        [r["score"] for r in records], np.asarray(model.score_batch(params, data)), rtol=1e-5
    )
    with open(path + ".COMPLETED") as f:
        assert json.load(f) == {"examples": 30}
    with pytest.raises(ValueError, match="'beam'"):
        infer(model, params, partitioner, [], path, batch_size=4, mode="beam")
