import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tasks_testlib import PadConverter, make_docs, span_task, text_task

import t5x.tasks as tt
from t5x.interfaces import ShardInfo
from t5x.interfaces.testing import check_input_iterator

LENGTHS = {"inputs": 64, "targets": 16}


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_conforms_to_input_iterator_contract(vocab):
    task = span_task("it_span", vocab, make_docs(60))
    check_input_iterator(
        lambda: tt.BatchIterator(task, PadConverter(), LENGTHS, 4, seed=1, block_size=16), num_batches=5
    )


def test_same_seed_same_stream_other_seed_differs(vocab):
    task = span_task("it_seed", vocab, make_docs(30))

    def run(seed):
        it = tt.BatchIterator(task, PadConverter(), LENGTHS, 2, seed=seed, block_size=8)
        return [next(it) for _ in range(4)]

    a, b, c = run(3), run(3), run(4)
    assert all(_same(x, y) for x, y in zip(a, b, strict=True))
    assert not all(_same(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_are_disjoint_and_complete(vocab, shuffle):
    pairs = [(f"example {i}", "x") for i in range(37)]
    task = text_task("it_shard", vocab, pairs)
    seen = []
    for index in range(4):
        it = tt.BatchIterator(
            task,
            PadConverter(),
            {"inputs": 16, "targets": 4},
            3,
            shard_info=ShardInfo(index, 4),
            num_epochs=1,
            shuffle=shuffle,
            drop_remainder=False,
            block_size=4,
        )
        rows = [row for batch in it for row in batch["inputs"]]
        assert rows, f"shard {index} is empty"
        seen.extend(vocab.decode(r.tolist()) for r in rows)
    assert len(seen) == len(set(seen)) == 37
    assert set(seen) == {p[0] for p in pairs}


def test_epochs_reshuffle_and_state_reports_epoch(vocab):
    pairs = [(f"e{i}", "x") for i in range(8)]
    it = tt.BatchIterator(
        text_task("it_epochs", vocab, pairs),
        PadConverter(),
        {"inputs": 8, "targets": 4},
        8,
        seed=2,
        block_size=8,
    )
    first, second = next(it), next(it)
    assert sorted(map(tuple, first["inputs"])) == sorted(map(tuple, second["inputs"]))
    assert it.get_state()["epochs"] == {"it_epochs": 1}


def test_mixture_iterator_mixes_by_rate(vocab):
    a = text_task("it_a", vocab, [(f"a{i}", "a") for i in range(50)])
    b = text_task("it_b", vocab, [(f"b{i}", "b") for i in range(50)])
    mix = tt.Mixture("it_mix", [(a, 1.0), (b, 3.0)])
    it = tt.BatchIterator(mix, PadConverter(), {"inputs": 8, "targets": 4}, 20, seed=0, block_size=40)
    batches = [next(it) for _ in range(10)]
    firsts = np.concatenate([bt["targets"][:, 0] for bt in batches])
    share_b = np.mean(firsts == vocab.encode("b")[0])
    assert share_b == pytest.approx(0.75, abs=0.06)
    check_input_iterator(
        lambda: tt.BatchIterator(mix, PadConverter(), {"inputs": 8, "targets": 4}, 5, block_size=10)
    )


def test_set_state_rejects_other_data(vocab):
    task = span_task("it_state", vocab, make_docs(10))
    it = tt.BatchIterator(task, PadConverter(), LENGTHS, 2, seed=1)
    state = it.get_state()
    other = tt.BatchIterator(task, PadConverter(), LENGTHS, 4, seed=1)
    with pytest.raises(ValueError, match="field 'batch_size' is 2 in the state but 4 here"):
        other.set_state(state)
    with pytest.raises(ValueError, match="version"):
        it.set_state({"version": 99})


def test_empty_shard_is_reported(vocab):
    def empty(split, shuffle_files):
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(
            {"inputs": tf.constant([], tf.string), "targets": tf.constant([], tf.string)}
        )

    task = tt.Task(
        "it_empty",
        tt.FunctionDataSource(empty, splits=["train"]),
        {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)},
        [tt.tokenize],
    )
    it = tt.BatchIterator(task, PadConverter(), LENGTHS, 2, shard_info=ShardInfo(1, 2))
    with pytest.raises(ValueError, match="'it_empty': split 'train' shard 1 of 2 yields no examples"):
        next(it)


def test_bad_arguments(vocab):
    task = span_task("it_bad", vocab, make_docs(3))
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        tt.BatchIterator(task, PadConverter(), LENGTHS, 0)
    with pytest.raises(TypeError, match="feature_converter does not implement the FeatureConverter contract"):
        tt.BatchIterator(task, object(), LENGTHS, 2)


_RESUME_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import t5x.tasks as tt
    from t5x.feature_converters import EncDecFeatureConverter
    from t5x.vocabularies import ByteVocabulary


    def run(data_dir, out, mode):
        vocab = ByteVocabulary(extra_ids=100)
        task = tt.Task(
            "resume_span",
            tt.TextLineDataSource({"train": data_dir + "/*.txt"}),
            {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)},
            [lambda ds: tt.rekey(ds, key_map={"inputs": None, "targets": "text"}), tt.tokenize,
             tt.span_corruption, tt.append_eos_after_trim],
        )
        it = tt.BatchIterator(task, EncDecFeatureConverter(pack=True), {"inputs": 64, "targets": 16}, 3,
                              seed=11, block_size=12)
        if mode == "full":
            batches = [next(it) for _ in range(7)]
            state = it.get_state()
            batches += [next(it) for _ in range(6)]
            json.dump(state, open(out + "/state.json", "w"))
        else:
            it.set_state(json.load(open(out + "/state.json")))
            batches = [next(it) for _ in range(6)]
        np.savez(out + f"/{mode}.npz", **{f"{i}:{k}": v for i, b in enumerate(batches) for k, v in b.items()})


    if __name__ == "__main__":
        run(*sys.argv[1:4])
    """
)


def test_resume_in_fresh_process_matches_uninterrupted_run(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for shard in range(3):
        (data / f"part-{shard}.txt").write_text("\n".join(make_docs(15, seed=shard)) + "\n")
    script = tmp_path / "resume.py"
    script.write_text(_RESUME_SCRIPT)
    namespace: dict = {"__name__": "resume_script"}
    exec(compile(_RESUME_SCRIPT, str(script), "exec"), namespace)
    namespace["run"](str(data), str(tmp_path), "full")  # the uninterrupted run, in this process
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    subprocess.run([sys.executable, str(script), str(data), str(tmp_path), "resumed"], check=True, env=env)
    full, resumed = np.load(tmp_path / "full.npz"), np.load(tmp_path / "resumed.npz")
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["block"] > 0 or state["offset"] > 0
    assert len(resumed.files) == 6 * 8
    for key in resumed.files:
        index, name = key.split(":")
        assert np.array_equal(resumed[key], full[f"{int(index) + 7}:{name}"]), key
