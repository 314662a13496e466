"""The conformance checks accept correct implementations and name what is wrong in broken ones."""

import numpy as np
import pytest

from t5x.interfaces.testing import (
    ConformanceError,
    check_checkpointer,
    check_input_iterator,
    check_metric_writer,
    check_model,
    check_partitioner,
    check_vocabulary,
)

from .fakes import ByteLevelVocabulary, CountingIterator, ListWriter, MemoryCheckpointer, NumpyPartitioner

STATE = {
    "target": {"dense": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}},
    "state": {"step": np.int32(3), "param_states": {"dense": {"kernel": {"v": np.ones((2, 3), np.float32)}}}},
}


def test_vocabulary_check_accepts_a_correct_vocabulary():
    check_vocabulary(ByteLevelVocabulary(), check_tf=False)


def test_vocabulary_check_catches_eos_appended_by_encode():
    class AppendsEos(ByteLevelVocabulary):
        def encode(self, s):
            return [*super().encode(s), 1]

    with pytest.raises(ConformanceError, match="must not append EOS"):
        check_vocabulary(AppendsEos(), check_tf=False)


def test_vocabulary_check_catches_decode_that_ignores_eos():
    class IgnoresEos(ByteLevelVocabulary):
        def decode(self, ids):
            return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", errors="replace")

    with pytest.raises(ConformanceError, match="stop at EOS"):
        check_vocabulary(IgnoresEos(), check_tf=False)


def test_input_iterator_check_accepts_a_resumable_iterator():
    check_input_iterator(lambda: CountingIterator(total=100, batch_size=4))


def test_input_iterator_check_catches_a_state_that_does_not_resume():
    class ForgetfulIterator(CountingIterator):
        def set_state(self, state):
            pass  # always restarts from the beginning

    with pytest.raises(ConformanceError, match="after set_state differs"):
        check_input_iterator(lambda: ForgetfulIterator(total=100, batch_size=4))


def test_input_iterator_check_catches_a_state_that_is_not_json():
    class NumpyState(CountingIterator):
        def get_state(self):
            return {"position": np.int64(self.position)}

    with pytest.raises(TypeError):
        check_input_iterator(lambda: NumpyState(total=100, batch_size=4))


def test_input_iterator_check_catches_wrong_dtype():
    class WrongDtype(CountingIterator):
        def __next__(self):
            return {"x": super().__next__()["x"].astype(np.float32)}

    with pytest.raises(ConformanceError, match="dtype float32"):
        check_input_iterator(lambda: WrongDtype(total=100, batch_size=4))


def test_checkpointer_check_accepts_a_correct_checkpointer():
    store = {}
    check_checkpointer(lambda: MemoryCheckpointer(store), STATE)


def test_checkpointer_check_catches_lost_input_state():
    class DropsInputState(MemoryCheckpointer):
        def save(self, step, train_state, input_state=None):
            super().save(step, train_state, None)

    store = {}
    with pytest.raises(ConformanceError, match="input_state"):
        check_checkpointer(lambda: DropsInputState(store), STATE)


def test_metric_writer_check():
    writer = ListWriter()
    check_metric_writer(writer)
    assert writer.calls[1] == ("scalars", 1, {"loss": 2.5, "accuracy": 0.25})

    class NeverCloses(ListWriter):
        def close(self):
            pass

    with pytest.raises(ConformanceError, match="after close"):
        check_metric_writer(NeverCloses())


def test_partitioner_check_accepts_the_identity_partitioner():
    check_partitioner(NumpyPartitioner(), batch_size=4)


def test_model_check_accepts_a_correct_model():
    from .fakes import UnigramModel

    model = UnigramModel()
    params = {"logits": np.array([0.0, 1.0, 2.0, 0.5, -1.0], np.float32)}
    check_model(model, params, {"decoder_target_tokens": np.array([[1, 2, 0], [3, 4, 2]], np.int32)})


def test_model_check_catches_scores_that_are_not_log_likelihoods():
    from .fakes import UnigramModel

    class ProbabilityScores(UnigramModel):
        def score_batch(self, params, batch, return_intermediates=False):
            return np.exp(super().score_batch(params, batch))

    with pytest.raises(ConformanceError, match="log-likelihoods"):
        check_model(
            ProbabilityScores(),
            {"logits": np.zeros(5, np.float32)},
            {"decoder_target_tokens": np.ones((2, 3), np.int32)},
        )
