"""Numbers read from outside (a launcher's environment, a copied journal's
file names, a Content-Length) are read as ASCII digits alone: ``str.isdigit``
passes a superscript two, and Arabic-Indic digits, that ``int`` refuses or
reads as a number nobody wrote, and ``int`` refuses thousands of digits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from primeruns.ascii_digits import decimal_or_none
from primeruns.journal import EntryKind, Journal, spool
from primeruns.journal.dicts import K_DICTS
from primeruns.local.context import read_capped_from
from primeruns.platform import client
from primeruns.ranks import launcher_rank

ODD_DIGITS = ["²", "٣", "1²", "9" * 5000]


def _name(value: object) -> str:
    text = str(value)
    return text if len(text) < 40 else f"{len(text)} digits"


@given(text=st.text() | st.text("0123456789"), most=st.integers(0, 25))
@example(text="", most=5)
@example(text="+1", most=5)
@example(text="-1", most=5)
@example(text=" 1", most=5)
@example(text="1 ", most=5)
@example(text="\u0661", most=5)
@example(text="1_0", most=5)
@example(text="\u00b2", most=5)
@example(text="123456", most=5)
@example(text="012345", most=6)
@example(text="9" * 5000, most=10_000)
def test_a_number_from_outside_is_ascii_digits_within_its_bound(text: str, most: int) -> None:
    """What every reader of a number from untrusted text takes: what ``int``
    reads of ASCII digits alone, at most ``most`` of them, and nothing else
    (``int`` takes a sign, spaces, underscores and other scripts' digits)."""
    plain = text != "" and all("0" <= c <= "9" for c in text)
    expected = int(text) if plain and len(text) <= min(most, 4300) else None
    assert decimal_or_none(text, most) == expected


@pytest.mark.parametrize("raw", ODD_DIGITS, ids=_name)
def test_a_rank_that_is_no_ascii_number_is_no_rank(raw: str) -> None:
    assert launcher_rank({"RANK": raw}) is None
    assert launcher_rank({"RANK": " 3 "}) == 3


def test_a_segment_named_with_other_digits_is_not_a_segment(tmp_path: Path) -> None:
    real = spool.segment_name(1)
    (tmp_path / real).write_bytes(b"")
    for odd in ("²" * 20, "٣" * 20):
        (tmp_path / f"{spool.PREFIX}{odd}").write_bytes(b"")
    assert spool.list_segments(tmp_path) == [(1, real)]


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.mark.parametrize("declared", [*ODD_DIGITS, "0" * 30 + "2"], ids=_name)
def test_a_body_whose_length_is_no_ascii_number_is_read_by_its_bytes(declared: str) -> None:
    body = asyncio.run(read_capped_from(_chunks(b"{}"), declared, 10))
    assert body == (None if declared == "9" * 5000 else b"{}")


@pytest.mark.parametrize("declared", ["0" * 30 + "2", "9" * 5000], ids=_name)
def test_an_answer_whose_length_is_odd_is_read_by_its_bytes(declared: str) -> None:
    # (httpx itself refuses a header value that is not ASCII.)
    response = httpx.Response(
        200,
        headers={"content-length": declared},
        stream=httpx.ByteStream(b"{}"),
        request=httpx.Request("GET", "http://127.0.0.1/"),
    )
    if declared == "9" * 5000:
        with pytest.raises(client.AnswerTooLarge):
            client._read_within(response)
    else:
        assert client._read_within(response).content == b"{}"


@pytest.mark.parametrize("odd", ODD_DIGITS, ids=_name)
def test_a_journal_naming_a_kind_in_other_digits_opens_and_reads(tmp_path: Path, odd: str) -> None:
    # journal.dicts names each kind's dictionary by the kind's number: one of
    # thousands of digits failed every open of the journal (show, export,
    # sync) with int's ValueError.
    with Journal.create(tmp_path, local_id="run") as j:
        j.append(EntryKind.EPISODE, [b"{}"])
        j.set_meta(K_DICTS, {odd: 1})
    with Journal.open(tmp_path / "run", owner=False) as j:
        assert [e.payload for e in j.read(0, max_entries=5).entries] == [b"{}"]
