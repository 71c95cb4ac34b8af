"""The byte format of one stored value: a small header and a (usually) zstd payload.

Every value the journal stores (entries, meta values, cursors, in-flight bodies)
is one frame, so that every byte on disk is covered by a checksum. Without one,
most bit flips in a zstd stream decode to silently wrong JSON; with it, a torn
or rotted value becomes a precise, reported loss of that one value.

Layout (little-endian, 12-byte header)::

    0  u8   frame version (1, or 2: the checksum also covers the entry's seq)
    1  u8   kind (EntryKind, or 0 for journal-internal values)
    2  u8   flags (FLAG_ZSTD: payload is one zstd frame; else stored raw)
    3  u8   dictionary id (0: none; else a zstd dictionary stored in the journal)
    4  u32  raw length (decompressed payload bytes)
    8  u32  CRC32 over bytes 0..7, the stored payload and (version 2) the
            entry's seq as 8 big-endian bytes

Binding an entry's checksum to its seq (version 2, every entry written now)
matters where values are found without their B-tree: salvaging a damaged file
scans pages, and a stale leaf node can point at overflow pages reused since by
another entry, whose frame is valid on its own. Meta values, cursors and
in-flight bodies have no seq and stay version 1.

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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import zstandard

from primeruns.journal import checksum

__all__ = [
    "FLAG_ZSTD",
    "FRAME_VERSION",
    "FRAME_VERSIONS",
    "HEADER",
    "HEADER_SIZE",
    "MAX_ENTRY_BYTES",
    "EntryKind",
    "FrameError",
    "FrameHeader",
    "check_frame",
    "decode_frame",
    "decompressor",
    "encode_frame",
    "encode_frames_off_gil",
    "peek_header",
    "spool_frame",
    "spooled_payload",
    "verify_frame",
]

FRAME_VERSION = 2  # for entries (with their seq); other values are version 1
# Every frame version a reader takes.
FRAME_VERSIONS = (1, 2)
_SEQ = struct.Struct(">Q")
FLAG_ZSTD = 0x01
_KNOWN_FLAGS = FLAG_ZSTD
HEADER_SIZE = 12
# One entry may not claim more than this once decompressed: a corrupt length must
# never turn into a huge allocation. Records over the platform's 64 MiB line
# limit cannot ship anyway.
MAX_ENTRY_BYTES = 128 << 20
# Below this, zstd alone saves little (a 300-byte metrics row: 25%) for its
# cost; with a trained dictionary it saves more than half, so it always runs.
_COMPRESS_MIN = 512
# Level 1: ~400 MB/s. With a trained dictionary, level 3 costs about the same
# (the dictionary does most of the work) and packs typical 9 KB episodes under
# LMDB's ~2 KB in-page limit more often, which halves their page overhead.
_LEVEL = 1
_DICT_LEVEL = 3

# The whole header, checksum last.
HEADER = struct.Struct("<BBBBII")


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
    dict_id: int
    raw_len: int
    crc: int


_local = threading.local()


def _compressor(
    zdict: zstandard.ZstdCompressionDict | None, level: int | None = None
) -> zstandard.ZstdCompressor:
    # A ZstdCompressor is not thread-safe but is costly to build per call: one per
    # thread, dictionary and level. The cache keys by the dictionary object's id
    # and keeps the object itself, so an id is never reused while cached.
    cache: dict[tuple[int, int | None], tuple[Any, zstandard.ZstdCompressor]] | None = getattr(
        _local, "cctx", None
    )
    if cache is None:
        cache = _local.cctx = {}
    found = cache.get((id(zdict), level))
    if found is None:
        chosen = level if level is not None else _LEVEL if zdict is None else _DICT_LEVEL
        cctx = zstandard.ZstdCompressor(
            level=chosen,
            dict_data=None if zdict is None else _precomputed(zdict, chosen),
            write_checksum=False,
            write_content_size=True,
        )
        found = cache[(id(zdict), level)] = (zdict, cctx)
    return found[1]


def _precomputed(zdict: zstandard.ZstdCompressionDict, level: int) -> zstandard.ZstdCompressionDict:
    """A copy of ``zdict`` with its compression tables built once, for one
    thread's compressor. Given the dictionary as it is, zstd builds them
    anew for every ``multi_compress_to_buffer`` (a context of its own each
    call): ~0.5 ms of a 112 KiB dictionary's, the most of a mover's step
    of a few entries (a training loop's second). The frames are the same
    bytes. A copy, not ``zdict`` itself: readers decompress with that
    object, and a table built there would cost them time and memory."""
    own = zstandard.ZstdCompressionDict(zdict.as_bytes())
    own.precompute_compress(level=level)
    return own


def decompressor(zdict: zstandard.ZstdCompressionDict | None) -> zstandard.ZstdDecompressor:
    """This thread's decompressor for ``zdict`` (None: none), made once:
    building one per frame costs more than decoding a small entry."""
    cache: dict[int, tuple[Any, zstandard.ZstdDecompressor]] | None = getattr(_local, "dctx", None)
    if cache is None:
        cache = _local.dctx = {}
    found = cache.get(id(zdict))
    if found is None:
        found = cache[id(zdict)] = (zdict, zstandard.ZstdDecompressor(dict_data=zdict))
    return found[1]


def encode_frame(
    kind: int,
    payload: bytes,
    dict_id: int = 0,
    zdict: zstandard.ZstdCompressionDict | None = None,
    *,
    compress: bool = True,
    seq: int | None = None,
    level: int | None = None,
) -> bytes:
    """Frame ``payload`` (compressed when that helps and ``compress``) under
    ``kind``; an entry passes its ``seq`` (version 2), other values none.

    With ``zdict`` (stored in the journal under ``dict_id``) small records
    compress several times better: they share most of their text.
    ``level``: zstd's level, in place of the journal's (a frame decodes the
    same at any level).
    """
    raw_len = len(payload)
    if raw_len > MAX_ENTRY_BYTES:
        raise ValueError(f"payload of {raw_len} bytes is over the {MAX_ENTRY_BYTES}-byte limit")
    flags = 0
    stored = payload
    used_dict = 0
    if compress and worth_compressing(raw_len, zdict is not None):
        packed = _compressor(zdict if dict_id else None, level).compress(payload)
        if len(packed) < raw_len:
            stored, flags, used_dict = packed, FLAG_ZSTD, (dict_id if zdict else 0)
    return _assemble(kind, flags, used_dict, raw_len, stored, seq)


_HEAD8 = struct.Struct("<BBBBI")
_CRC = struct.Struct("<I")


def spool_frame(kind: int, payload: bytes, seq: int) -> bytes:
    """``encode_frame(kind, payload, compress=False, seq=seq)``, as an append
    frames each record for the spool: the same bytes, made on every ``log_*``
    call with none of ``encode_frame``'s choices (0.4-1 µs of a metrics
    row's ~14). Raises ValueError over MAX_ENTRY_BYTES."""
    raw_len = len(payload)
    if raw_len > MAX_ENTRY_BYTES:
        raise ValueError(f"payload of {raw_len} bytes is over the {MAX_ENTRY_BYTES}-byte limit")
    head = _HEAD8.pack(FRAME_VERSION, kind, 0, 0, raw_len)
    crc = checksum.crc32(_SEQ.pack(seq), checksum.crc32(payload, checksum.crc32(head)))
    return head + _CRC.pack(crc) + payload


def worth_compressing(raw_len: int, with_dictionary: bool) -> bool:
    """Whether zstd is tried on a payload of ``raw_len`` bytes."""
    return raw_len >= _COMPRESS_MIN or (with_dictionary and raw_len >= 32)


def _assemble(
    kind: int,
    flags: int,
    dict_id: int,
    raw_len: int,
    stored: bytes | memoryview,
    seq: int | None,
) -> bytes:
    version = 1 if seq is None else 2
    head = _HEAD8.pack(version, kind, flags, dict_id, raw_len)
    crc32 = checksum.crc32
    crc = crc32(stored, crc32(head))
    if seq is not None:
        crc = crc32(_SEQ.pack(seq), crc)
    return head + _CRC.pack(crc) + stored


def encode_frames_off_gil(
    kind: int,
    payloads: Sequence[bytes | memoryview],
    seqs: list[int],
    dict_id: int = 0,
    zdict: zstandard.ZstdCompressionDict | None = None,
) -> list[bytes]:
    """``encode_frame`` for a batch, compressing with the GIL released.

    For the journal's background compression: a one-shot ``compress`` holds
    the GIL, so it would stall the producer's thread for its whole duration;
    ``multi_compress_to_buffer`` releases it and runs beside the producer.
    """
    if not payloads:
        return []
    batch: list[bytes | bytearray | memoryview[int]] = list(payloads)
    packed = _compressor(zdict if dict_id else None).multi_compress_to_buffer(batch, threads=1)
    frames = []
    for index, payload in enumerate(payloads):
        # Framed from the compressor's buffer as it is: one copy, not two.
        segment = memoryview(packed[index])  # type: ignore[arg-type]  # (a buffer, unstubbed)
        if len(segment) < len(payload):
            frame = _assemble(
                kind, FLAG_ZSTD, dict_id if zdict else 0, len(payload), segment, seqs[index]
            )
        else:
            frame = _assemble(kind, 0, 0, len(payload), payload, seqs[index])
        frames.append(frame)
    return frames


def spooled_payload(value: bytes | memoryview, seq: int) -> bytes | memoryview:
    """The payload of entry ``seq``'s frame as the spool holds it (raw), for
    the mover to compress: checked as ``decode_frame`` checks it, and a view
    into ``value``, not a copy (a frame stored compressed is decoded).
    Raises FrameError."""
    view = memoryview(value)
    if len(view) >= HEADER_SIZE and 0 <= seq < 1 << 64:
        # A frame as an append spools it (version 2, stored raw, no
        # dictionary, its length its payload's), checked as ``_checked``
        # checks one in a single look: its chain of calls, each taking the
        # header apart again, cost ~6 us of a 9 KB episode's ~8 (the
        # checksum ~1.3), once per entry the mover moves.
        version, _, flags, dict_id, raw_len, crc = HEADER.unpack_from(view)
        payload = view[HEADER_SIZE:]
        if (
            version == 2
            and not flags
            and not dict_id
            and raw_len == len(payload)
            and raw_len <= MAX_ENTRY_BYTES
        ):
            crc32 = checksum.crc32
            if crc32(_SEQ.pack(seq), crc32(payload, crc32(view[:8]))) == crc:
                return payload
    # Anything else (a compressed frame, a damaged one) the whole way, which
    # words the damage.
    head = _checked(value, None, seq, MAX_ENTRY_BYTES)[0]
    if head.flags & FLAG_ZSTD:
        return decode_frame(value, seq=seq)[1]
    return memoryview(value)[HEADER_SIZE:]


def peek_header(value: bytes | memoryview) -> FrameHeader:
    """Parse the header only (no checksum, no decompression); raises FrameError."""
    if len(value) < HEADER_SIZE:
        raise FrameError(f"value of {len(value)} bytes is shorter than the frame header")
    version, kind, flags, dict_id, raw_len, crc = HEADER.unpack_from(value, 0)
    if version not in FRAME_VERSIONS:
        raise FrameError(f"unknown frame version {version}")
    return FrameHeader(version, kind, flags, dict_id, raw_len, crc)


def peek_kind(value: bytes | memoryview) -> int | None:
    """The entry kind a frame's header names, or None if it has no valid
    header: ``peek_header`` at a fraction of its cost, for counting."""
    if len(value) < HEADER_SIZE or value[0] not in FRAME_VERSIONS:
        return None
    return int(value[1])


def verify_frame(value: bytes | memoryview, seq: int | None = None) -> FrameHeader:
    """Check a frame's header and checksum without decompressing; raises FrameError.

    A version-2 frame (an entry) only verifies under the ``seq`` it was
    written for.
    """
    head = peek_header(value)
    view = memoryview(value)
    computed = checksum.crc32(view[HEADER_SIZE:], checksum.crc32(view[:8]))
    if head.version == 2:
        if seq is None:
            raise FrameError("an entry's frame can only be checked with its seq")
        if not 0 <= seq < 1 << 64:  # (a crafted segment's name: none is written for it)
            raise FrameError(f"seq {seq} is past any an entry is written for")
        computed = checksum.crc32(_SEQ.pack(seq), computed)
    if computed != head.crc:
        raise FrameError(f"checksum mismatch (stored {head.crc:08x}, computed {computed:08x})")
    return head


def decode_frame(
    value: bytes | memoryview,
    dicts: Callable[[int], zstandard.ZstdCompressionDict | None] | None = None,
    seq: int | None = None,
    max_bytes: int = MAX_ENTRY_BYTES,
) -> tuple[int, bytes]:
    """Verify and decode a frame into ``(kind, payload)``; raises FrameError.

    ``dicts`` looks up a stored dictionary by id. Safe on arbitrary bytes: it
    never allocates more than ``max_bytes`` (at most MAX_ENTRY_BYTES; a
    reader expecting small values passes less) and never raises anything but
    FrameError.
    """
    head, zdict = _checked(value, dicts, seq, max_bytes)
    # Decompressed from where it is: a copy first held a large entry's
    # stored bytes twice while it was decoded.
    stored = memoryview(value)[HEADER_SIZE:]
    if not head.flags & FLAG_ZSTD:
        return head.kind, bytes(stored)
    try:
        out = decompressor(zdict).decompress(stored, max_output_size=head.raw_len)
    except zstandard.ZstdError as exc:
        raise FrameError(f"zstd decode failed ({exc})") from None
    if len(out) != head.raw_len:
        raise FrameError(f"length mismatch (header {head.raw_len}, decoded {len(out)})")
    return head.kind, out


def check_frame(
    value: bytes | memoryview,
    dicts: Callable[[int], zstandard.ZstdCompressionDict | None] | None = None,
    seq: int | None = None,
    max_bytes: int = MAX_ENTRY_BYTES,
) -> FrameHeader:
    """Every check ``decode_frame`` makes short of decompressing (checksum,
    flags, lengths, the dictionary it needs); raises FrameError.

    A frame that passes decodes unless its zstd stream was written corrupt
    (the checksum covers every stored byte, so rot since is caught): what
    ``primeruns show`` checks a long journal with, at the cost of a CRC.
    """
    return _checked(value, dicts, seq, max_bytes)[0]


def _checked(
    value: bytes | memoryview,
    dicts: Callable[[int], zstandard.ZstdCompressionDict | None] | None,
    seq: int | None,
    max_bytes: int,
) -> tuple[FrameHeader, zstandard.ZstdCompressionDict | None]:
    max_bytes = min(max_bytes, MAX_ENTRY_BYTES)
    head = verify_frame(value, seq)
    view = memoryview(value)
    if head.flags & ~_KNOWN_FLAGS:
        raise FrameError(f"unknown flags {head.flags:#04x}")
    if head.raw_len > max_bytes:
        raise FrameError(f"claims {head.raw_len} bytes, over the {max_bytes}-byte limit")
    stored = view[HEADER_SIZE:]
    zdict = None
    if head.dict_id:
        zdict = dicts(head.dict_id) if dicts is not None else None
        if zdict is None or not head.flags & FLAG_ZSTD:
            raise FrameError(f"needs zstd dictionary {head.dict_id}, which is not in the journal")
    if not head.flags & FLAG_ZSTD:
        if len(stored) != head.raw_len:
            raise FrameError(f"length mismatch (header {head.raw_len}, stored {len(stored)})")
        return head, None
    try:
        # Check the zstd frame's own size claim against the (checksummed) header
        # before decompressing, so no corrupt size can drive the allocation.
        content = zstandard.frame_content_size(stored)
    except zstandard.ZstdError as exc:
        raise FrameError(f"bad zstd frame header ({exc})") from None
    if content != head.raw_len:
        raise FrameError(f"length mismatch (header {head.raw_len}, zstd frame {content})")
    return head, zdict
