"""TFRecord framing, read and written without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little endian)
    uint32 masked CRC-32C of the 8 length bytes
    bytes  data[length]
    uint32 masked CRC-32C of data

The mask is ``((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32). Warmup files are at most
1000 records, so a table-driven CRC in Python is fast enough.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

_MASK_DELTA = 0xA282EAD8
_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected


class TFRecordError(ValueError):
    """A TFRecord file is truncated or corrupt."""


def _make_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _make_table()


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data``."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """The masked CRC-32C that TFRecord stores."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def iter_records(blob: bytes, *, verify: bool = True, source: str = "<bytes>") -> Iterator[bytes]:
    """Yield the data of each record in ``blob``; raise ``TFRecordError`` on a bad frame."""
    offset = 0
    index = 0
    while offset < len(blob):
        if offset + 12 > len(blob):
            raise TFRecordError(f"{source}: record {index}: truncated header at byte {offset}")
        header = blob[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", blob[offset + 8 : offset + 12])
        if verify and masked_crc(header) != header_crc:
            raise TFRecordError(f"{source}: record {index}: bad length CRC at byte {offset}")
        start = offset + 12
        end = start + length
        if end + 4 > len(blob):
            raise TFRecordError(f"{source}: record {index}: truncated data at byte {start}")
        data = blob[start:end]
        (data_crc,) = struct.unpack("<I", blob[end : end + 4])
        if verify and masked_crc(data) != data_crc:
            raise TFRecordError(f"{source}: record {index}: bad data CRC at byte {start}")
        yield data
        offset = end + 4
        index += 1


def read_records(path: Path, *, verify: bool = True) -> list[bytes]:
    """All records of the TFRecord file at ``path``."""
    return list(iter_records(path.read_bytes(), verify=verify, source=str(path)))


def frame_record(data: bytes) -> bytes:
    """One record framed as TFRecord (used to write test fixtures)."""
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc(header)) + data
            + struct.pack("<I", masked_crc(data)))
