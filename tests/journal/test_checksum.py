"""The journal's CRC-32 is zlib's function, whichever library computes it.

``journal.checksum`` takes ISA-L's CRC-32 where isal is installed and zlib's
elsewhere (isal's wheels cover some platforms only): a journal written on
one must check out on the other, and frames written before the switch must
still verify. Both hold only if the two compute the same function,
continued from any running value, over any buffer a frame is checked as.
"""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from primeruns.journal import checksum
from primeruns.journal.frames import encode_frame, verify_frame


@given(st.binary(max_size=20_000), st.integers(0, 2**32 - 1), st.integers(0, 64))
def test_crc32_is_zlibs(data: bytes, start: int, cut: int) -> None:
    view = memoryview(data)[min(cut, len(data)) :]
    assert checksum.crc32(data) == zlib.crc32(data)
    assert checksum.crc32(data, start) == zlib.crc32(data, start)
    assert checksum.crc32(view, start) == zlib.crc32(view, start)


@given(st.binary(max_size=5_000), st.integers(0, 2**63))
def test_frames_check_out_under_zlibs_crc(payload: bytes, seq: int) -> None:
    """An entry's frame carries zlib's CRC-32 of its header, body and seq, as
    every journal written before ``checksum`` did."""
    frame = encode_frame(1, payload, seq=seq)
    crc = zlib.crc32(seq.to_bytes(8, "big"), zlib.crc32(frame[12:], zlib.crc32(frame[:8])))
    assert int.from_bytes(frame[8:12], "little") == crc
    verify_frame(frame, seq)
