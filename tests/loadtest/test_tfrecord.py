"""TFRecord framing without TensorFlow."""

from __future__ import annotations

import pytest

from tfsdeploy.core.tfserving.tfrecord import TFRecordError, crc32c, frame_record, iter_records


def test_crc32c_known_vector() -> None:
    # the standard CRC-32C check value
    assert crc32c(b"123456789") == 0xE3069283


def test_round_trip_several_records() -> None:
    records = [b"", b"a", b"x" * 1000]
    blob = b"".join(frame_record(r) for r in records)
    assert list(iter_records(blob)) == records


def test_corrupt_data_is_detected() -> None:
    blob = bytearray(frame_record(b"hello"))
    blob[13] ^= 0xFF
    with pytest.raises(TFRecordError, match="bad data CRC"):
        list(iter_records(bytes(blob)))


def test_truncated_file_is_detected() -> None:
    blob = frame_record(b"hello world")
    with pytest.raises(TFRecordError, match="truncated"):
        list(iter_records(blob[:-3]))


def test_tensorflow_written_file_matches() -> None:
    """A framing written by TensorFlow's own writer reads back (golden bytes, no TF import)."""
    # b"abc" framed by tf.io.TFRecordWriter (checked once with TensorFlow 2.21)
    golden = bytes.fromhex("0300000000000000" "b099490e" "616263" "6e57f121")
    assert frame_record(b"abc") == golden
    assert list(iter_records(golden)) == [b"abc"]
