"""A traces part's gzip is inflated with ISA-L where isal is installed, and
with zlib where it is not: either way a good stream comes back whole, a bomb
stops at the cap, and a truncated or garbled stream is ``malformed_encoding``
(isal raises its own error type, which must not escape as a 500)."""

from __future__ import annotations

import gzip
import random
import sys
import zlib
from types import ModuleType

import pytest
from isal import isal_zlib

from primeruns.local import traces_ingest
from primeruns.local.errors import TracesError

#: A stream a few inflate steps long, so the streaming loop goes round.
_STEP = 4096
_TEXT = b"".join(
    b'{"id":"t-%d","note":"%s"}\n' % (i, random.Random(i).randbytes(24).hex().encode())
    for i in range(2000)
)
_GOOD = gzip.compress(_TEXT, mtime=0)


@pytest.fixture(params=[isal_zlib, zlib], ids=["isal", "zlib"])
def inflate(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module: ModuleType = request.param
    monkeypatch.setattr(traces_ingest, "_INFLATE", module)
    monkeypatch.setattr(traces_ingest, "_INFLATE_STEP", _STEP)
    return module


def _refusal(compressed: bytes) -> str:
    with pytest.raises(TracesError) as caught:
        traces_ingest._gunzip(compressed)
    assert caught.value.status == 400
    return caught.value.code


def test_isal_is_the_inflater_where_it_is_installed() -> None:
    assert traces_ingest._inflate_module() is isal_zlib


def test_zlib_is_the_inflater_where_isal_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "isal.isal_zlib")
    monkeypatch.setitem(sys.modules, "isal", None)  # import isal: ImportError
    assert traces_ingest._inflate_module() is zlib


def test_a_good_stream_inflates_whole(inflate: ModuleType) -> None:
    assert traces_ingest._gunzip(_GOOD) == _TEXT


def test_a_bomb_is_refused_at_the_cap(inflate: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    cap = 64 * 1024
    monkeypatch.setattr(traces_ingest, "MAX_UPLOAD_BYTES", cap)
    bomb = gzip.compress(b"\n" * (100 * cap), mtime=0)
    assert _refusal(bomb) == "upload_too_large"


@pytest.mark.parametrize("cut", [1, 10, len(_GOOD) // 2, len(_GOOD) - 8, len(_GOOD) - 1])
def test_a_truncated_stream_is_malformed(inflate: ModuleType, cut: int) -> None:
    assert _refusal(_GOOD[:cut]) == "malformed_encoding"


def _flipped(at: int) -> bytes:
    garbled = bytearray(_GOOD)
    garbled[at] ^= 0xFF
    return bytes(garbled)


@pytest.mark.parametrize(
    "garbage",
    [
        b"not gzip at all",
        zlib.compress(_TEXT),  # a zlib stream, not gzip
        _flipped(len(_GOOD) - 6),  # its CRC
        _flipped(len(_GOOD) - 2),  # its length
        _flipped(len(_GOOD) // 2),  # its deflate data
    ],
    ids=["text", "zlib-wrapper", "crc", "length", "data"],
)
def test_a_garbled_stream_is_malformed(inflate: ModuleType, garbage: bytes) -> None:
    assert _refusal(garbage) == "malformed_encoding"
