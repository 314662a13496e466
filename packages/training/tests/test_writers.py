"""Metric writers: TensorBoard files without TensorFlow, JSON Lines, console."""

import glob
import io
import json
import re
import struct

import pytest

from t5x.interfaces.testing import check_metric_writer
from t5x.training import ConsoleWriter, JsonlWriter, MultiWriter, TensorBoardWriter
from t5x.training._tfevents import crc32c, masked_crc32c


def test_crc32c_known_vector():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert masked_crc32c(b"") == 0xA282EAD8


def _records(path):
    with open(path, "rb") as f:
        data = f.read()
    records, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        (length_crc,) = struct.unpack_from("<I", data, offset + 8)
        assert length_crc == masked_crc32c(data[offset : offset + 8])
        payload = data[offset + 12 : offset + 12 + length]
        (payload_crc,) = struct.unpack_from("<I", data, offset + 12 + length)
        assert payload_crc == masked_crc32c(payload)
        records.append(payload)
        offset += 16 + length
    return records


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: TensorBoardWriter(str(tmp / "tb")),
        lambda tmp: JsonlWriter(str(tmp / "m.jsonl")),
        lambda tmp: ConsoleWriter(total_steps=10, stream=io.StringIO()),
        lambda tmp: MultiWriter([JsonlWriter(str(tmp / "a.jsonl")), ConsoleWriter()]),
    ],
)
def test_writers_meet_the_contract(tmp_path, make):
    check_metric_writer(make(tmp_path))


def test_tensorboard_records_are_framed_and_hold_values(tmp_path):
    writer = TensorBoardWriter(str(tmp_path))
    writer.write_scalars(7, {"loss": 1.5})
    writer.write_texts(7, {"sample": "héllo"})
    writer.close()
    (path,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    records = _records(path)
    assert len(records) == 3
    assert b"brain.Event:2" in records[0]
    assert b"loss" in records[1] and struct.pack("<f", 1.5) in records[1]
    assert "héllo".encode() in records[2] and b"text" in records[2]


def test_tensorflow_reads_our_event_files(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="the TensorFlow cross-check needs the optional tensorflow")
    writer = TensorBoardWriter(str(tmp_path))
    writer.write_scalars(3, {"loss": 2.25, "accuracy": 0.5})
    writer.write_scalars(2**40, {"loss": -1.0})
    writer.write_texts(4, {"prediction": "a cat"})
    writer.close()
    (path,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    events = list(tf.compat.v1.train.summary_iterator(path))
    assert events[0].file_version == "brain.Event:2"
    scalars = [(e.step, v.tag, v.simple_value) for e in events[1:3] for v in e.summary.value]
    assert scalars == [(3, "loss", 2.25), (3, "accuracy", 0.5), (2**40, "loss", -1.0)]
    text = events[3].summary.value[0]
    assert events[3].step == 4
    assert text.metadata.plugin_data.plugin_name == "text"
    assert tf.make_ndarray(text.tensor).item() == b"a cat"


def test_jsonl_lines(tmp_path):
    path = tmp_path / "sub" / "metrics.jsonl"
    writer = JsonlWriter(str(path))
    writer.write_hparams({"lr": 0.1})
    writer.write_scalars(5, {"loss": 2.0})
    writer.write_texts(5, {"p": "x"})
    writer.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"hparams": {"lr": 0.1}}, {"step": 5, "loss": 2.0}, {"step": 5, "texts": {"p": "x"}}]


def test_non_primary_process_writes_nothing(tmp_path):
    writer = JsonlWriter(str(tmp_path / "m.jsonl"), is_primary=False)
    writer.write_scalars(1, {"loss": 1.0})
    writer.close()
    assert not (tmp_path / "m.jsonl").exists()


class _Tty(io.StringIO):
    def isatty(self):
        return True


# absl-py's log prefix: level letter, MMDD, time, thread, file:line.
ABSL_PREFIX = re.compile(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ _writers\.py:\d+\] ")


def test_console_log_lines_when_not_a_terminal():
    log = io.StringIO()
    writer = ConsoleWriter(total_steps=100, stream=log)
    assert writer.active and not writer.live
    writer.write_scalars(10, {"loss": 2.0, "learning_rate": 0.01, "timing/steps_per_second": 4.0})
    first = log.getvalue()
    assert ABSL_PREFIX.match(first), first
    assert ABSL_PREFIX.sub("", first) == "step 10/100 | loss 2.0000 | lr 0.01 | 4 steps/s\n"
    writer.write_scalars(10, {"eval/synthetic/accuracy": 0.5})  # not a training step: no line
    writer.write_scalars(20, {"loss": 1.5})
    writer.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and ABSL_PREFIX.sub("", lines[1]).startswith("step 20/100 | loss 1.5000 | ETA ")
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()
    quiet = io.StringIO()
    ConsoleWriter(stream=quiet, is_primary=False).write_scalars(1, {"loss": 1.0})
    assert quiet.getvalue() == ""


def test_console_goes_through_absl_logging_under_absl_app(monkeypatch, caplog):
    import t5x.training._writers as writers

    monkeypatch.setattr(writers, "_absl_flags_parsed", lambda: True)  # as under absl's app.run
    writer = ConsoleWriter(total_steps=4)  # no stream given: absl's handlers decide
    with caplog.at_level("INFO", logger="absl"):
        writer.write_scalars(2, {"loss": 1.25})
    assert [r.getMessage() for r in caplog.records] == ["step 2/4 | loss 1.2500"]


def test_console_progress_line_on_terminal():
    tty = _Tty()
    writer = ConsoleWriter(total_steps=100, stream=tty)
    assert writer.format_line(10, {"loss": 2.0}, now=0.0).startswith("step 10/100 | loss 2.0000")
    line = writer.format_line(20, {"loss": 1.5, "timing/tokens_per_second": 12345.0}, now=5.0)
    assert line == "step 20/100 | loss 1.5000 | 12.3k tok/s | ETA 0:00:40"
    writer.write_scalars(30, {"loss": 1.0})
    assert "step 30/100" in tty.getvalue() and "\n" not in tty.getvalue()
    assert ConsoleWriter(stream=tty, is_primary=False).active is False
