"""An unreachable remote SentencePiece path (upstream's gs:// default) fails with one clear message."""

import pytest

from t5x.launch._errors import is_user_error


def test_unreadable_remote_vocabulary_names_the_path_and_the_fix():
    from t5x.upstream import prepare

    prepare()
    import seqio  # t5x.seqio, aliased by prepare (install_as_seqio)

    path = "nosuchfs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model"
    with pytest.raises(FileNotFoundError) as error:
        seqio.SentencePieceVocabulary(path).vocab_size  # noqa: B018 (loading is the point)
    message = str(error.value)
    assert path in message and "copy it to this machine" in message
    assert is_user_error(error.value)  # t5x-launch prints it as one line, exit code 2
