"""Dropping journals' maps while other threads open, close and write journals.

A shipping process drops the pages of every journal it holds open
(``store.drop_every_resident_page``, from a shipper's thread after a batch)
while other threads open and close journals: ``sync`` of a run with
children, ``replay --all``, the uplink opening a predecessor. The set of
open stores changing under that walk raised ``RuntimeError: Set changed
size during iteration`` into the shipper, which retired its sink as
stopped by an internal error. And LMDB's meta pages, which ``env.info``
and ``env.stat`` read, are read only under the store's lock, where no drop
runs: py-lmdb's fail (EINVAL) while another thread remaps the file.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

from primeruns.journal import EntryKind, Journal, store


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


class _Guarded:
    """An environment whose meta-page reads check that the store's lock is held."""

    def __init__(self, env: lmdb.Environment, lock: Any, unlocked: list[str]) -> None:
        self._env = env
        self._lock = lock
        self._unlocked = unlocked

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._env, name)
        if name in ("info", "stat") and not self._lock._is_owned():
            self._unlocked.append(name)
        return value


def test_a_journal_reads_lmdbs_meta_pages_only_under_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unlocked: list[str] = []
    open_env = store.Store._open

    def guarded(self: store.Store, *args: Any, **kwargs: Any) -> None:
        open_env(self, *args, **kwargs)
        self.env = _Guarded(self.env, self.lock, unlocked)  # type: ignore[assignment]

    monkeypatch.setattr(store.Store, "_open", guarded)
    with Journal.create(tmp_path / "runs") as journal:
        for _ in range(3):
            journal.append(EntryKind.METRICS, [b"{}"] * 10)
        path = journal.path
    with Journal.open(path, owner=False) as reader:
        assert reader.read(0).entries
    assert unlocked == []
