from ckpt_helpers import make_state

from t5x.checkpointing import Checkpointer
from t5x.interfaces import Checkpointer as CheckpointerProtocol
from t5x.interfaces.testing import check_checkpointer


def test_check_checkpointer_async(tmp_path):
    check_checkpointer(lambda: Checkpointer(tmp_path), make_state())


def test_check_checkpointer_sync_zstd(tmp_path):
    check_checkpointer(lambda: Checkpointer(tmp_path, async_save=False, compression="zstd"), make_state())


def test_is_a_checkpointer(tmp_path):
    assert isinstance(Checkpointer(tmp_path), CheckpointerProtocol)
