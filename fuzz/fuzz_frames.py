"""Fuzz frame decoding: arbitrary bytes must decode or raise FrameError, nothing else.

Run (from the repository root, after ``pip install atheris``)::

    python fuzz/fuzz_frames.py fuzz/corpus/fuzz_frames -max_total_time=60

It also checks that a frame that decodes re-encodes to a frame with the same
payload, and that no decode allocates more than the per-entry cap (a corrupt
length must never become a huge allocation: ``-rss_limit_mb`` catches that).
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    import zstandard

    from primeruns.journal.frames import FrameError, decode_frame, encode_frame

_DICT = zstandard.ZstdCompressionDict(b"\x00" * 64, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def test_one_input(data: bytes) -> None:
    try:
        kind, payload = decode_frame(data, lambda i: _DICT if i == 1 else None)
    except FrameError:
        return
    again = decode_frame(encode_frame(kind, payload))
    assert again == (kind, payload)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
