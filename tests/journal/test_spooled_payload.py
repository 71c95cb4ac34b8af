"""The mover takes a spooled frame's payload as ``decode_frame`` would.

``frames.spooled_payload`` checks a frame as an append spools it (raw,
version 2, no dictionary) in one look, and everything else the whole way:
whatever the bytes, it must give the payload ``decode_frame`` gives, or
raise FrameError where ``decode_frame`` does (a damaged spool segment, a
frame spooled compressed).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from primeruns.journal.frames import (
    FrameError,
    decode_frame,
    encode_frame,
    spool_frame,
    spooled_payload,
)


def _either(frame: bytes, seq: int) -> bytes | None:
    try:
        return decode_frame(frame, seq=seq)[1]
    except FrameError:
        return None


@given(
    st.binary(max_size=3_000),
    st.integers(0, 2**64 - 1),
    st.booleans(),
    st.integers(-1, 3_100),
    st.integers(1, 255),
    st.integers(-1, 1),
)
def test_spooled_payload_is_decode_frames(
    payload: bytes, seq: int, compressed: bool, at: int, flip: int, seq_off: int
) -> None:
    frame = bytearray(
        encode_frame(2, payload, compress=True, seq=seq)
        if compressed
        else spool_frame(2, payload, seq)
    )
    if 0 <= at < len(frame):
        frame[at] ^= flip  # one byte changed: its header, its checksum or its payload
    asked = seq + seq_off
    if not 0 <= asked < 2**64:
        asked = seq
    expected = _either(bytes(frame), asked)
    if expected is None:
        with pytest.raises(FrameError):
            spooled_payload(bytes(frame), asked)
    else:
        assert bytes(spooled_payload(bytes(frame), asked)) == expected


def test_a_short_frame_is_damage() -> None:
    with pytest.raises(FrameError):
        spooled_payload(spool_frame(2, b"x" * 100, 7)[:11], 7)
