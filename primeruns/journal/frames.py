"""The byte format of one stored value: a small header and a (usually) zstd payload.

Every value the journal stores (entries, meta values, cursors, in-flight bodies)
is one frame, so that every byte on disk is covered by a checksum. Without one,
most bit flips in a zstd stream decode to silently wrong JSON; with it, a torn
or rotted value becomes a precise, reported loss of that one value.

Layout (little-endian, 12-byte header)::

    0  u8   format version (FRAME_VERSION)
    1  u8   kind (EntryKind, or 0 for journal-internal values)
    2  u8   flags (FLAG_ZSTD: payload is one zstd frame; else stored raw)
    3  u8   reserved, 0
    4  u32  raw length (decompressed payload bytes)
    8  u32  CRC32 over bytes 0..7 and the stored payload

The kind sits in the header so that a reader skipping other kinds (a metrics
sink reading past 120 KB episodes) reads 12 bytes and decompresses nothing.
Decoding never trusts a length it has not checked: the raw length is capped
(MAX_ENTRY_BYTES) and must equal the zstd frame's own content size before any
buffer is allocated.
"""

from __future__ import annotations

import enum
import struct
import threading
import zlib
from typing import NamedTuple

import zstandard

__all__ = [
    "FLAG_ZSTD",
    "FRAME_VERSION",
    "HEADER_SIZE",
    "MAX_ENTRY_BYTES",
    "EntryKind",
    "FrameError",
    "FrameHeader",
    "decode_frame",
    "encode_frame",
    "peek_header",
]

FRAME_VERSION = 1
FLAG_ZSTD = 0x01
_KNOWN_FLAGS = FLAG_ZSTD
HEADER_SIZE = 12
# One entry may not claim more than this once decompressed: a corrupt length must
# never turn into a huge allocation. Records over the platform's 64 MiB line
# limit cannot ship anyway.
MAX_ENTRY_BYTES = 128 << 20
# Below this, zstd's frame overhead (~10 bytes) outweighs what it saves.
_COMPRESS_MIN = 64
# Level 1: ~400 MB/s and already within the disk budget for episode JSON.
_LEVEL = 1

_HEADER = struct.Struct("<BBBBII")


class EntryKind(enum.IntEnum):
    """What an entry holds; new kinds get new numbers, old numbers never change."""

    RUN_OPEN = 1
    EPISODE = 2
    TRACE = 3
    METRICS = 4
    SUMMARY = 5
    FINISH = 6


class FrameError(ValueError):
    """A stored value is not a valid frame; the message says precisely why."""


class FrameHeader(NamedTuple):
    version: int
    kind: int
    flags: int
    raw_len: int
    crc: int


_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    # A ZstdCompressor is not thread-safe but is costly to build per call: one per thread.
    cctx: zstandard.ZstdCompressor | None = getattr(_local, "cctx", None)
    if cctx is None:
        cctx = zstandard.ZstdCompressor(level=_LEVEL, write_checksum=False, write_content_size=True)
        _local.cctx = cctx
    return cctx


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = zstandard.ZstdDecompressor()
        _local.dctx = dctx
    return dctx


def encode_frame(kind: int, payload: bytes) -> bytes:
    """Frame ``payload`` (compressed when that helps) under ``kind``."""
    raw_len = len(payload)
    if raw_len > MAX_ENTRY_BYTES:
        raise ValueError(f"payload of {raw_len} bytes is over the {MAX_ENTRY_BYTES}-byte limit")
    flags = 0
    stored = payload
    if raw_len >= _COMPRESS_MIN:
        packed = _compressor().compress(payload)
        if len(packed) < raw_len:
            stored, flags = packed, FLAG_ZSTD
    head = struct.pack("<BBBBI", FRAME_VERSION, kind, flags, 0, raw_len)
    crc = zlib.crc32(stored, zlib.crc32(head))
    return head + struct.pack("<I", crc) + stored


def peek_header(value: bytes | memoryview) -> FrameHeader:
    """Parse the header only (no checksum, no decompression); raises FrameError."""
    if len(value) < HEADER_SIZE:
        raise FrameError(f"value of {len(value)} bytes is shorter than the frame header")
    version, kind, flags, _reserved, raw_len, crc = _HEADER.unpack_from(value, 0)
    if version != FRAME_VERSION:
        raise FrameError(f"unknown frame version {version}")
    return FrameHeader(version, kind, flags, raw_len, crc)


def decode_frame(value: bytes | memoryview) -> tuple[int, bytes]:
    """Verify and decode a frame into ``(kind, payload)``; raises FrameError.

    Safe on arbitrary bytes: it never allocates more than MAX_ENTRY_BYTES and
    never raises anything but FrameError.
    """
    head = peek_header(value)
    view = memoryview(value)
    computed = zlib.crc32(view[HEADER_SIZE:], zlib.crc32(view[:8]))
    if computed != head.crc:
        raise FrameError(f"checksum mismatch (stored {head.crc:08x}, computed {computed:08x})")
    if head.flags & ~_KNOWN_FLAGS:
        raise FrameError(f"unknown flags {head.flags:#04x}")
    if head.raw_len > MAX_ENTRY_BYTES:
        raise FrameError(f"claims {head.raw_len} bytes, over the {MAX_ENTRY_BYTES}-byte limit")
    stored = bytes(view[HEADER_SIZE:])
    if not head.flags & FLAG_ZSTD:
        if len(stored) != head.raw_len:
            raise FrameError(f"length mismatch (header {head.raw_len}, stored {len(stored)})")
        return head.kind, stored
    try:
        # Check the zstd frame's own size claim against the (checksummed) header
        # before decompressing, so no corrupt size can drive the allocation.
        content = zstandard.frame_content_size(stored)
    except zstandard.ZstdError as exc:
        raise FrameError(f"bad zstd frame header ({exc})") from None
    if content != head.raw_len:
        raise FrameError(f"length mismatch (header {head.raw_len}, zstd frame {content})")
    try:
        out = _decompressor().decompress(stored, max_output_size=head.raw_len)
    except zstandard.ZstdError as exc:
        raise FrameError(f"zstd decode failed ({exc})") from None
    if len(out) != head.raw_len:
        raise FrameError(f"length mismatch (header {head.raw_len}, decoded {len(out)})")
    return head.kind, out
