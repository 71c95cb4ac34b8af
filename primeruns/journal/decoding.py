"""Decoding a batch of read entries: every check of ``decode_entry``, paid once per entry.

A forward read (each sink of the uplink, ``sync``/``replay``, ``show``,
``export``) decodes thousands of entries per call, and ``decode_entry`` costs
~10 µs of Python around each one's decompression: its header parsed twice into
a named tuple, a thread-local look for the decompressor, a dictionary looked up,
an ``EntryKind`` and a frozen ``Entry`` built the slow way. ``decode_entries``
makes the same checks in one pass over the header (checksum with the seq,
version, flags, length limit, dictionary, zstd's own content size, decoded
length, kind) with what they need looked up once per batch.

It never decides damage itself: an entry failing any of its checks, or one of
a shape it does not take (a version-1 frame of an old journal), is handed to
``decode_entry``, so what is reported, and in which words, is exactly what the
reference reports (``tests/journal/test_decoding.py`` holds the two together
on arbitrary and damaged frames).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import zstandard

from primeruns.journal import checksum
from primeruns.journal.frames import (
    FLAG_ZSTD,
    FRAME_VERSION,
    HEADER,
    HEADER_SIZE,
    MAX_ENTRY_BYTES,
    EntryKind,
    decompressor,
)
from primeruns.journal.layout import KEY, decode_entry
from primeruns.journal.types import Damage, Entry

# A kind by its number, without ``EntryKind(k)``'s call (0.76 µs an entry).
_KIND_OF = {int(k): k for k in EntryKind}
_MAX_SEQ = (1 << 64) - 1
_new = object.__new__


def _entry(seq: int, kind: EntryKind, payload: bytes) -> Entry:
    # ``Entry(...)``, without a frozen dataclass's ``__init__`` (an
    # ``object.__setattr__`` per field): the same fields in the same place.
    made: Entry = _new(Entry)
    made.__dict__.update(seq=seq, kind=kind, payload=payload)
    return made


def decode_entries(
    raw: Iterable[tuple[int, bytes]],
    dicts: Callable[[int], zstandard.ZstdCompressionDict | None],
    entries: list[Entry],
    damaged: list[Damage],
    stored: dict[int, bytes] | None = None,
) -> None:
    """``decode_entry`` of each ``(seq, value)`` in turn: a sound entry is
    appended to ``entries`` (its frame to ``stored`` too, when given), a
    damaged one's report to ``damaged``, in the order of ``raw``."""
    # (An entry's checksum covers its seq packed as its key is.)
    unpack, pack_seq, crc32 = HEADER.unpack_from, KEY.pack, checksum.crc32
    content_size, zstd_error = zstandard.frame_content_size, zstandard.ZstdError
    kind_of = _KIND_OF.get
    # Per dictionary id: the decompressor (None: take the reference's path).
    ready: dict[int, zstandard.ZstdDecompressor | None] = {}
    for seq, value in raw:
        payload: bytes | None = None
        if len(value) >= HEADER_SIZE and 0 <= seq <= _MAX_SEQ:
            version, kind, flags, dict_id, raw_len, crc = unpack(value)
            entry_kind = kind_of(kind)
            if version == FRAME_VERSION and entry_kind is not None and raw_len <= MAX_ENTRY_BYTES:
                view = memoryview(value)
                body = view[HEADER_SIZE:]
                if crc32(pack_seq(seq), crc32(body, crc32(view[:8]))) == crc:
                    if flags == FLAG_ZSTD:
                        if dict_id in ready:
                            dctx = ready[dict_id]
                        else:
                            dctx = ready[dict_id] = _decompressor_for(dict_id, dicts)
                        payload = _unpacked(dctx, body, raw_len, content_size, zstd_error)
                    elif flags == 0 and dict_id == 0 and len(body) == raw_len:
                        payload = bytes(body)
            if payload is not None:
                entries.append(_entry(seq, entry_kind, payload))  # type: ignore[arg-type]
                if stored is not None:
                    stored[seq] = value
                continue
        # Damaged, or a frame this pass does not take: the reference decides.
        entry, damage = decode_entry(seq, value, dicts)
        if entry is not None:
            entries.append(entry)
            if stored is not None:
                stored[seq] = value
        if damage is not None:
            damaged.append(damage)


def _decompressor_for(
    dict_id: int, dicts: Callable[[int], zstandard.ZstdCompressionDict | None]
) -> zstandard.ZstdDecompressor | None:
    """What decodes frames compressed with ``dict_id`` (0: none), or None
    where the dictionary is absent (the reference reports it)."""
    if not dict_id:
        return decompressor(None)
    zdict = dicts(dict_id)
    return None if zdict is None else decompressor(zdict)


def _unpacked(
    dctx: zstandard.ZstdDecompressor | None,
    body: memoryview,
    raw_len: int,
    content_size: Callable[[memoryview], int],
    zstd_error: type[Exception],
) -> bytes | None:
    """The payload ``body`` decodes to, checked as ``decode_frame`` checks it
    (zstd's own size claim first, then the decoded length), or None."""
    if dctx is None:
        return None
    try:
        if content_size(body) != raw_len:
            return None
        out: bytes = dctx.decompress(body, max_output_size=raw_len)
    except zstd_error:
        return None
    return out if len(out) == raw_len else None
