"""A read's batch decode says of every stored value what ``decode_entry`` says of it.

``decoding.decode_entries`` is the forward read's fast path; ``layout.decode_entry``
is the reference. On sound frames, damaged ones (bytes flipped, cut short, read
under another seq) and ones whose header was rewritten with a valid checksum (so
the checks after the checksum are reached: flags, lengths, dictionary, version,
kind), both must return the same entries and the same damage, in the same words.
"""

from __future__ import annotations

import struct
import zlib

import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from primeruns.journal.decoding import decode_entries
from primeruns.journal.frames import HEADER_SIZE, encode_frame
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
