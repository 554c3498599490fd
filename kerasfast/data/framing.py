"""TFRecord framing read in Python, to find *where* a file is damaged.

TensorFlow's reader reports a damaged record as "corrupted record at 184"
without the file name, and `ignore_errors()` silently drops every record after
the first bad one in a file. This reader walks the framing of the format spec
itself::

    uint64 length            (little endian)
    uint32 masked_crc32c(length)
    byte   data[length]
    uint32 masked_crc32c(data)

so that a problem can be reported with file, record index and byte offset, and
the good records around a bad one can still be read.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import struct
import zlib
from typing import Iterator

import crc32c as _crc32c

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
# A length above this is taken as garbage, not as a record to allocate.
MAX_RECORD_BYTES = 1 << 31

GZIP_MAGIC = b"\x1f\x8b"


def masked_crc32c(data: bytes) -> int:
    crc = _crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class RecordProblem:
    """One problem found in a TFRecord file.

    Attributes:
        file: path of the file.
        index: 0-based index of the record, or None when the problem is the
            whole file (missing, not TFRecord, wrong compression).
        offset: byte offset of the record in the (decompressed) stream, or None.
        kind: short machine-readable kind: "missing", "unreadable", "empty_pattern",
            "not_tfrecord", "compression", "truncated", "bad_length_crc",
            "bad_data_crc", "parse", "decode", "size_mismatch", "count_mismatch".
        message: what is wrong and what to do.
        fatal_for_file: True when no record after this one can be read.
    """

    file: str
    index: int | None
    offset: int | None
    kind: str
    message: str
    fatal_for_file: bool = False

    def where(self) -> str:
        if self.index is None:
            return self.file
        return f"{self.file}, record {self.index} (byte offset {self.offset})"

    def __str__(self) -> str:
        return f"{self.where()}: {self.message}"


NOT_TFRECORD = "not-tfrecord"


def sniff_compression(head: bytes) -> str | None:
    """Guesses the compression of a TFRecord file from its first bytes.

    Returns None (plain TFRecord), "GZIP", "ZLIB", or NOT_TFRECORD when the
    bytes are none of these. An empty `head` is a valid empty plain file.
    """
    if not head:
        return None
    if len(head) >= 12:
        length, length_crc = _HEADER.unpack_from(head)
        if masked_crc32c(head[:8]) == length_crc:
            return None
    if head[:2] == GZIP_MAGIC:
        return "GZIP"
    # zlib header: deflate method, window <= 32K, header checksum multiple of 31.
    if len(head) >= 2 and (head[0] & 0x0F) == 8 and (head[0] >> 4) <= 7 and ((head[0] << 8) | head[1]) % 31 == 0:
        return "ZLIB"
    return NOT_TFRECORD


def describe_compression(c) -> str:
    return "uncompressed" if c is None else ("not TFRecord" if c == NOT_TFRECORD else f"{c}-compressed")


class _ZlibReader(io.RawIOBase):
    """Streams the decompressed bytes of a file holding one zlib stream."""

    def __init__(self, fh):
        self._fh = fh
        self._d = zlib.decompressobj()
        self._buf = b""
        self._eof = False

    def readable(self):
        return True

    def readinto(self, b):
        while not self._buf and not self._eof:
            chunk = self._fh.read(1 << 16)
            if not chunk:
                self._buf = self._d.flush()
                self._eof = True
                if not self._d.eof:
                    raise EOFError("zlib stream ended before its end marker")
                break
            self._buf = self._d.decompress(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self):
        self._fh.close()
        super().close()


def open_stream(path: str, compression: str | None):
    """Opens `path` as a stream of TFRecord bytes (decompressing as needed)."""
    if compression == "GZIP":
        return gzip.open(path, "rb")
    if compression == "ZLIB":
        return io.BufferedReader(_ZlibReader(open(path, "rb")), buffer_size=1 << 16)
    return open(path, "rb", buffering=1 << 16)


@dataclasses.dataclass
class Frame:
    """One record as found in the file: index, offset and payload (or a problem)."""

    index: int
    offset: int
    payload: bytes | None
    problem: RecordProblem | None = None


def _read_exact(stream, n: int) -> bytes:
    parts, need = [], n
    while need:
        chunk = stream.read(need)
        if not chunk:
            break
        parts.append(chunk)
        need -= len(chunk)
    return b"".join(parts)


def iter_frames(path: str, compression: str | None) -> Iterator[Frame]:
    """Yields every record of a file, with a problem attached where one is found.

    A record with a bad data CRC is yielded with `payload=None` and reading goes
    on (its length was valid). A bad length CRC, a truncated record or a broken
    compressed stream ends the iteration with a `fatal_for_file` problem.
    """
    index = offset = 0
    comp = describe_compression(compression)
    try:
        with open_stream(path, compression) as stream:
            while True:
                header = _read_exact(stream, 12)
                if not header:
                    return
                if len(header) < 12:
                    yield Frame(index, offset, None, RecordProblem(
                        path, index, offset, "truncated",
                        f"the file ends inside the header of record {index} ({len(header)} of 12 bytes): "
                        f"it was truncated (an interrupted copy or write); re-copy or re-write it, "
                        f"or read it with on_error='skip' to use the {index} records before.", True))
                    return
                length, length_crc = _HEADER.unpack(header)
                if masked_crc32c(header[:8]) != length_crc or length > MAX_RECORD_BYTES:
                    hint = ("the file may not be a TFRecord file, or be compressed: check compression=" if index == 0
                            else "the file is corrupted from here on; re-copy or re-write it")
                    yield Frame(index, offset, None, RecordProblem(
                        path, index, offset, "bad_length_crc",
                        f"the length field of record {index} fails its CRC check ({comp} read); {hint}.", True))
                    return
                payload = _read_exact(stream, length)
                footer = _read_exact(stream, 4)
                if len(payload) < length or len(footer) < 4:
                    yield Frame(index, offset, None, RecordProblem(
                        path, index, offset, "truncated",
                        f"record {index} is truncated: the file ends {length + 4 - len(payload) - len(footer)} "
                        f"bytes early (an interrupted copy or write); re-copy or re-write it, or read it with "
                        f"on_error='skip' to use the {index} records before.", True))
                    return
                if masked_crc32c(payload) != _FOOTER.unpack(footer)[0]:
                    yield Frame(index, offset, None, RecordProblem(
                        path, index, offset, "bad_data_crc",
                        f"record {index} is corrupted (its data fails the CRC32C check); re-copy or re-write "
                        f"the file, or read it with on_error='skip'."))
                else:
                    yield Frame(index, offset, payload)
                index += 1
                offset += 16 + length
    except (EOFError, OSError, zlib.error) as exc:
        # gzip/zlib report a cut-off or damaged compressed stream this way.
        yield Frame(index, offset, None, RecordProblem(
            path, index, offset, "truncated",
            f"the {comp} stream breaks at record {index} ({exc}); the file was truncated or damaged; "
            f"re-copy or re-write it, or read it with on_error='skip' to use the {index} records before.", True))
