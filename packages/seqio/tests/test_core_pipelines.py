"""seqio-style tasks in the core's pipelines: t5x-launch's BatchIterator (resumable) and evaluation."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import t5x.seqio as seqio
import t5x.tasks as core

VOCAB = seqio.ByteVocabulary()


def _lines_to_pair(ds):
    return ds.map(lambda line: {"inputs": line, "targets": tf.strings.upper(line)})


@seqio.map_over_dataset(num_seeds=1)
def _random_shift(ex, seed):
    shift = tf.random.stateless_uniform([], seed=seed, maxval=100, dtype=tf.int32)
    return {**ex, "targets": tf.concat([[shift + 3], ex["targets"]], 0)}


def test_batch_iterator_runs_a_text_line_task_and_resumes(clean_registry, tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(f"line {i}" for i in range(12)) + "\n")
    seqio.TaskRegistry.add(
        "lines_for_launch",
        source=seqio.TextLineDataSource({"train": str(tmp_path / "train.txt")}),  # yields bare strings
        preprocessors=[
            _lines_to_pair,
            seqio.preprocessors.tokenize,
            _random_shift,
            seqio.preprocessors.append_eos,
        ],
        output_features={"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)},
    )
    converter = seqio.EncDecFeatureConverter(pack=False)
    lengths = {"inputs": 10, "targets": 12}

    def batches(state=None, n=3):
        it = core.get_input_iterator("lines_for_launch", converter, lengths, 2, seed=5, block_size=4)
        if state is not None:
            it.set_state(state)
        return it, [next(it) for _ in range(n)]

    it, first = batches()
    _, again = batches()
    for a, b in zip(first, again, strict=True):  # the seqio-style random preprocessor is reproducible
        np.testing.assert_array_equal(a["decoder_target_tokens"], b["decoder_target_tokens"])
    assert first[0]["encoder_input_tokens"].shape == (2, 10)
    state = it.get_state()
    _, resumed = batches(state, n=2)
    _, straight = batches(n=5)
    for a, b in zip(resumed, straight[3:], strict=True):
        np.testing.assert_array_equal(a["decoder_target_tokens"], b["decoder_target_tokens"])


def test_preprocess_takes_the_cores_arguments():
    task = seqio.Task(
        "preprocess_args",
        source=seqio.FunctionDataSource(lambda split, shuffle_files: None, splits=["train"]),
        output_features={"targets": seqio.Feature(VOCAB)},
        preprocessors=[seqio.preprocessors.tokenize],
    )
    ds = tf.data.Dataset.from_tensors({"targets": "abcdef"})
    trimmed = next(iter(task.preprocess(ds, {"targets": 2}, seed=tf.constant([1, 2], tf.int64))))
    full = next(iter(task.preprocess(ds, {"targets": 2}, trim_output_features=False)))
    assert trimmed["targets"].numpy().tolist() == [100, 101] and len(full["targets"]) == 6
