"""A read's batch decode says of every stored value what ``decode_entry`` says of it.

``decoding.decode_entries`` is the forward read's fast path; ``layout.decode_entry``
is the reference. On sound frames, damaged ones (bytes flipped, cut short, read
under another seq) and ones whose header was rewritten with a valid checksum (so
the checks after the checksum are reached: flags, lengths, dictionary, version,
kind), both must return the same entries and the same damage, in the same words.
And a whole journal read in batches of a few entries (``Reader.read``: headers
read in place, chunks taken as the cursor moves forward) returns what a plain
walk of its LMDB table decodes, chunked entries and damaged ones included.
"""

from __future__ import annotations

import json
import random
import struct
import tempfile
import zlib
from pathlib import Path

import lmdb
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from primeruns.journal import EntryKind, Journal
from primeruns.journal.decoding import decode_entries
from primeruns.journal.frames import HEADER_SIZE, FrameError, encode_frame, peek_header
from primeruns.journal.layout import decode_entry
from primeruns.journal.types import Damage, Entry

_ZDICT = zstandard.ZstdCompressionDict(
    b'{"reward": 0.5, "answer": "the total is", "completion": ' * 40,
    dict_type=zstandard.DICT_TYPE_RAWCONTENT,
)
_DICTS = {1: _ZDICT}.get  # id 2 names a dictionary the journal lacks
_HEAD8 = struct.Struct("<BBBBI")


def _reheaded(frame: bytes, fields: dict[int, int], seq: int | None) -> bytes:
    """``frame`` with header fields replaced and its checksum made valid again."""
    head = list(_HEAD8.unpack_from(frame))
    for index, value in fields.items():
        head[index] = value
    packed = _HEAD8.pack(*head)
    crc = zlib.crc32(frame[HEADER_SIZE:], zlib.crc32(packed))
    if seq is not None:
        crc = zlib.crc32(struct.pack(">Q", seq), crc)
    return packed + struct.pack("<I", crc) + frame[HEADER_SIZE:]


@st.composite
def stored_values(draw: st.DrawFn) -> tuple[int, bytes]:
    seq = draw(st.integers(0, (1 << 64) - 1))
    kind = draw(st.integers(0, 9))  # 1..6 are entry kinds
    text = draw(st.sampled_from([b"", b'{"reward": 0.5, "answer": "the total is 7"}']))
    payload = text * draw(st.integers(0, 40)) + draw(st.binary(max_size=64))
    dict_id = draw(st.sampled_from([0, 1]))
    frame = encode_frame(
        kind,
        payload,
        dict_id,
        _ZDICT if dict_id else None,
        compress=draw(st.booleans()),
        seq=None if draw(st.integers(0, 9)) == 0 else seq,
    )
    damage = draw(st.sampled_from(["none", "flip", "cut", "seq", "header"]))
    if damage == "flip":
        at = draw(st.integers(0, len(frame) - 1))
        frame = frame[:at] + bytes([frame[at] ^ draw(st.integers(1, 255))]) + frame[at + 1 :]
    elif damage == "cut":
        frame = frame[: draw(st.integers(0, len(frame) - 1))]
    elif damage == "seq":
        seq = (seq + draw(st.integers(1, 3))) % (1 << 64)
    elif damage == "header":
        fields = draw(
            st.dictionaries(
                st.integers(0, 4),
                st.one_of(st.integers(0, 3), st.integers(0, 255)),
                min_size=1,
                max_size=2,
            )
        )
        if 4 in fields:  # the raw length: off by a little, or huge
            fields[4] = draw(st.sampled_from([0, 1, len(payload) + 1, (1 << 32) - 1]))
        frame = _reheaded(frame, fields, seq if fields.get(0, frame[0]) == 2 else None)
    return seq, frame


@settings(max_examples=600, deadline=None)
@given(st.lists(stored_values(), max_size=6), st.booleans())
def test_a_batch_decodes_to_what_each_entry_alone_decodes_to(
    values: list[tuple[int, bytes]], keep_frames: bool
) -> None:
    want_entries: list[Entry] = []
    want_damage: list[Damage] = []
    want_frames: dict[int, bytes] = {}
    for seq, value in values:
        entry, damage = decode_entry(seq, value, _DICTS)
        if entry is not None:
            want_entries.append(entry)
            want_frames[seq] = value
        if damage is not None:
            want_damage.append(damage)
    entries: list[Entry] = []
    damaged: list[Damage] = []
    frames: dict[int, bytes] | None = {} if keep_frames else None
    decode_entries(values, _DICTS, entries, damaged, frames)
    assert entries == want_entries
    assert [(e.seq, type(e.kind), e.payload) for e in entries] == [
        (e.seq, type(e.kind), e.payload) for e in want_entries
    ]
    assert damaged == want_damage
    if frames is not None:
        assert frames == want_frames


# Hex of random bytes compresses to about half: stored values on both sides of
# the in-page limit, chunked ones, and ones past the chunking range.
_SIZES = [0, 40, 700, 1_300, 2_600, 9_000, 20_000, 40_000]


def _reference_read(path: Path, kinds: frozenset[int] | None) -> tuple[list[Entry], list[Damage]]:
    """A straightforward read of a whole journal held in LMDB: every entry key
    with the chunk keys after it joined, its header peeked, a wanted one
    decoded alone by ``decode_entry``."""
    env = lmdb.open(str(path), max_dbs=8, readonly=True, lock=False)
    groups: list[tuple[int, list[bytes]]] = []
    try:
        with env.begin() as txn:
            for raw_key, value in txn.cursor(db=env.open_db(b"entries", txn=txn)):
                if len(raw_key) == 10:
                    groups[-1][1].append(value)
                else:
                    groups.append((struct.unpack(">Q", raw_key)[0], [value]))
    finally:
        env.close()
    entries: list[Entry] = []
    damaged: list[Damage] = []
    for seq, parts in groups:
        whole = b"".join(parts)
        try:
            kind = peek_header(whole).kind
        except FrameError as exc:
            damaged.append(Damage(seq, f"entry {seq}: {exc}"))
            continue
        if kinds is None or kind in kinds:
            entry, damage = decode_entry(seq, whole, lambda _: None)
            entries += [] if entry is None else [entry]
            damaged += [] if damage is None else [damage]
    return entries, damaged


def _damage(path: Path, draw: st.DrawFn) -> None:
    """Flip a byte of a few stored values (an entry's first or a chunk) and
    drop a few chunks, through LMDB (the tree stays sound)."""
    env = lmdb.open(str(path), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"entries", txn=txn)
            keys = [bytes(k) for k in txn.cursor(db=db).iternext(values=False)]
            for raw_key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
                value = bytearray(txn.get(raw_key, db=db))
                if len(raw_key) == 10 and draw(st.booleans()):
                    txn.delete(raw_key, db=db)
                    continue
                at = draw(st.integers(0, len(value) - 1))
                value[at] ^= draw(st.integers(1, 255))
                txn.put(raw_key, bytes(value), db=db)
    finally:
        env.close()


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_a_journal_read_in_batches_returns_what_a_plain_walk_of_it_decodes(
    data: st.DataObject,
) -> None:
    sizes = data.draw(st.lists(st.sampled_from(_SIZES), min_size=1, max_size=12))
    kinds = data.draw(
        st.lists(st.sampled_from(EntryKind), min_size=len(sizes), max_size=len(sizes))
    )
    with tempfile.TemporaryDirectory() as tmp:
        with Journal.create(Path(tmp), local_id="run") as journal:
            for i, (size, kind) in enumerate(zip(sizes, kinds, strict=True)):
                noise = random.Random(i).randbytes(size).hex()
                journal.append(kind, [json.dumps({"i": i, "noise": noise}).encode()])
        path = Path(tmp) / "run"
        if data.draw(st.booleans()):
            _damage(path, data.draw)
        wanted = data.draw(st.one_of(st.none(), st.sets(st.sampled_from(EntryKind), min_size=1)))
        want = _reference_read(path, None if wanted is None else frozenset(wanted))
        per_read = data.draw(st.integers(1, 5))
        entries: list[Entry] = []
        damaged: list[Damage] = []
        with Journal.open(path, owner=False) as journal:
            after = 0
            while True:
                got = journal.read(after, kinds=wanted, max_entries=per_read, max_bytes=1 << 30)
                entries += got.entries
                damaged += got.damaged
                if got.next_after == after:
                    break
                after = got.next_after
    # Within one read, damage met in the scan (an unreadable header) is listed
    # before damage met decoding: the order of seqs is not the report's.
    assert entries == want[0]
    assert sorted(damaged, key=_by_seq) == sorted(want[1], key=_by_seq)


def _by_seq(damage: Damage) -> tuple[int, str]:
    return (-1 if damage.seq is None else damage.seq, damage.what)
