"""Recover a damaged ``data.mdb`` by reading its pages in Python, never through LMDB.

LMDB trusts its file: on a truncated or structurally damaged ``data.mdb`` it
may abort (``Assertion 'IS_LEAF(mp)' failed``) or fault, taking the whole
process with it, and it cannot reach entries below a lost branch page at all.
Every value the journal stores is a checksummed frame, so a scan of every
leaf page recognises intact values by their checksum alone, whatever state
the tree is in. ``salvage`` does that scan (pure Python: bad bytes can only
make it skip, never crash) and rebuilds a fresh environment from what it found.

Only LMDB 0.9's on-disk layout on 64-bit builds is read (the bundled library).
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primeruns.journal.frames import FrameError, decode_frame, encode_frame, verify_frame

__all__ = ["Salvaged", "scan_pages"]

_PAGE_HDR = 16
_P_LEAF = 0x02
_P_OVERFLOW = 0x04
_F_BIGDATA = 0x01
_F_SUBDATA = 0x02
_F_DUPDATA = 0x04
_NODE = struct.Struct("<HHHH")  # lo, hi (data size), flags, key size


_CHUNK_KEY = struct.Struct(">QH")  # a chunk of a stored entry: (seq, index)
# How many ways of putting a chunked entry together are checked at most.
_MAX_TRIES = 64


@dataclass
class Salvaged:
    """What a page scan recovered: entries by seq, and the journal's small tables."""

    entries: dict[int, bytes] = field(default_factory=dict)  # seq -> frame
    meta: dict[bytes, bytes] = field(default_factory=dict)
    cursors: dict[bytes, bytes] = field(default_factory=dict)
    pages: int = 0


def _leaf_nodes(data: Any, page: int, psize: int) -> Iterator[tuple[bytes, bytes]]:
    base = page * psize
    flags, lower = struct.unpack_from("<HH", data, base + 10)
    if not flags & _P_LEAF or flags & _P_OVERFLOW:
        return
    count = (lower - _PAGE_HDR) // 2
    if lower < _PAGE_HDR or count > psize // 8:
        return
    for i in range(count):
        (off,) = struct.unpack_from("<H", data, base + _PAGE_HDR + 2 * i)
        if off < _PAGE_HDR or off + 8 > psize:
            continue
        lo, hi, nflags, ksize = _NODE.unpack_from(data, base + off)
        dsize = lo | (hi << 16)
        kstart = base + off + 8
        if off + 8 + ksize > psize or nflags & (_F_SUBDATA | _F_DUPDATA):
            continue
        key = data[kstart : kstart + ksize]
        if nflags & _F_BIGDATA:
            if off + 8 + ksize + 8 > psize:
                continue
            (opg,) = struct.unpack_from("<Q", data, kstart + ksize)
            start = opg * psize + _PAGE_HDR
            if opg == 0 or start + dsize > len(data):
                continue
            yield bytes(key), bytes(data[start : start + dsize])
        else:
            if off + 8 + ksize + dsize > psize:
                continue
            yield bytes(key), bytes(data[kstart + ksize : kstart + ksize + dsize])


def scan_pages(path: Path, psize: int = 4096) -> Salvaged:
    """Scan every page of ``path`` for intact journal values (never raises on content)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 3 * psize:
            return Salvaged(pages=size // psize)
        # A map, not a read: journals can be far larger than RAM. Python bounds-checks
        # every access to it, so bad offsets raise (and are skipped), never fault.
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return _scan(view, psize)


def _scan(data: Any, psize: int) -> Salvaged:
    found = Salvaged(pages=len(data) // psize)
    acked: dict[bytes, int] = {}
    # An entry stored in chunks (see layout) is its head under the 8-byte key
    # plus (seq, index) chunks: put back together, then checked. Every
    # distinct candidate head is kept, not the first found: a stale copy under
    # the same key (left in a freed page by a copy on write, and damaged
    # since) fails its checksum too, and may sit in a page before the live head.
    heads: dict[int, list[bytes]] = {}
    chunks: dict[tuple[int, int], list[bytes]] = {}  # the same: a stale copy may have rotted
    for page in range(2, len(data) // psize):
        (pgno,) = struct.unpack_from("<Q", data, page * psize)
        if pgno != page:
            continue  # not a page header (overflow continuation, garbage, zeros)
        for key, value in _leaf_nodes(data, page, psize):
            if len(key) == _CHUNK_KEY.size:
                copies = chunks.setdefault(_CHUNK_KEY.unpack(key), [])
                if value not in copies:
                    copies.append(value)
                continue
            try:
                # Entries are only checksummed here: one compressed with a stored
                # dictionary decodes once that dictionary is restored too.
                seq = struct.unpack(">Q", key)[0] if len(key) == 8 else None
                kind = verify_frame(value, seq).kind
                if kind != 0 and len(key) == 8:
                    found.entries[struct.unpack(">Q", key)[0]] = value
                    continue
                if kind != 0:
                    continue
                payload = decode_frame(value)[1]
            except FrameError:
                if len(key) == 8:
                    candidates = heads.setdefault(struct.unpack(">Q", key)[0], [])
                    if value not in candidates:
                        candidates.append(value)
                continue
            _classify(key, value, payload, found, acked)
    for seq, candidates in heads.items():
        if seq in found.entries:
            continue
        rest: list[list[bytes]] = []
        while (seq, len(rest) + 1) in chunks:
            rest.append(chunks[(seq, len(rest) + 1)])
        # Copies found first are tried first; the tries are bounded, since
        # each distinct copy of every part multiplies them.
        for parts in itertools.islice(itertools.product(candidates, *rest), _MAX_TRIES):
            whole = b"".join(parts)
            try:
                if verify_frame(whole, seq).kind != 0:
                    found.entries[seq] = whole
                    break
            except FrameError:
                pass
    return found


def _classify(
    key: bytes, value: bytes, payload: bytes, found: Salvaged, acked: dict[bytes, int]
) -> None:
    # Stale copies of small values survive in freed pages: keep the most
    # advanced cursor (acked only grows) and any readable meta value.
    if key.startswith(b"journal.dict."):
        found.meta.setdefault(key, value)  # a zstd dictionary later entries need
        return
    try:
        obj: Any = json.loads(payload)
    except ValueError:
        return  # an in-flight body: not restored (the shipper rebuilds its batch)
    if isinstance(obj, dict) and set(obj) == {"acked", "inflight"}:
        try:
            seq = int(obj["acked"])
        except (TypeError, ValueError):
            return
        if seq >= acked.get(key, -1):
            acked[key] = seq
            # Restored without its in-flight batch: the body may be a stale copy.
            found.cursors[key] = encode_frame(
                0, json.dumps({"acked": seq, "inflight": None}).encode()
            )
        return
    found.meta.setdefault(key, value)
