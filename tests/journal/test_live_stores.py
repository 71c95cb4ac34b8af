"""Dropping every journal's map while another thread opens and closes journals.

A shipping process drops the pages of every journal it holds open
(``store.drop_every_resident_page``, from a shipper's thread after a batch)
while other threads open and close journals: ``sync`` of a run with
children, ``replay --all``, the uplink opening a predecessor. The set of
open stores changing under that walk raised ``RuntimeError: Set changed
size during iteration`` into the shipper, which retired its sink as
stopped by an internal error.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from primeruns.journal import store


class _Held:
    """One of many journals held open (a stand-in: only its drop is called)."""

    forked = False

    def drop_resident_pages(self) -> None:
        pass


@pytest.fixture
def many_held() -> Iterator[list[_Held]]:
    held = [_Held() for _ in range(1000)]  # a long walk: the window to change the set in
    for one in held:
        store._LIVE.add(one)  # type: ignore[arg-type]
    yield held
    for one in held:
        store._LIVE.discard(one)  # type: ignore[arg-type]


def test_dropping_every_map_while_journals_open_and_close_never_raises(
    many_held: list[_Held],
) -> None:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the walk meets the opens
    stop = threading.Event()
    opened = [0]

    def open_and_close() -> None:
        while not stop.is_set():
            # What opening a journal (Store.__init__) and closing it
            # (Store.close) do to the set, without LMDB's cost between.
            one = _Held()
            store._LIVE.add(one)  # type: ignore[arg-type]
            store._LIVE.discard(one)  # type: ignore[arg-type]
            opened[0] += 1

    churn = threading.Thread(target=open_and_close)
    churn.start()
    errors: list[BaseException] = []
    try:
        for _ in range(1000):
            try:
                store.drop_every_resident_page()
            except RuntimeError as exc:
                errors.append(exc)
    finally:
        stop.set()
        churn.join()
        sys.setswitchinterval(interval)
    assert opened[0] > 0
    assert errors == []
