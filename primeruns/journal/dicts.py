"""The zstd dictionaries of one journal: which one each kind uses, loading
them by id, and training new ones (``dictionary`` decides whether one pays).

Only the appending process trains (``trains=True``): a dictionary is stored,
committed, before any entry uses it, and the appender is the one that knows
how many records of each kind it wrote. Another process that compresses the
appender's staged entries (its uplink) reads which dictionaries are in use
again before each batch (``refresh``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import lmdb
import zstandard

from primeruns.exceptions import JournalError
from primeruns.journal import dictionary
from primeruns.journal.frames import EntryKind, FrameError, decode_frame
from primeruns.journal.txn import Transactions
from primeruns.journal.types import ReadResult

K_DICTS = "journal.dicts"  # {kind: dictionary id} in use for new entries
K_DICT_PREFIX = "journal.dict."  # + id: the dictionary's bytes


class Dictionaries:
    def __init__(self, tx: Transactions, *, trains: bool, due: threading.Event) -> None:
        self._tx = tx
        self.trains = trains
        self._due = due  # set when a kind has enough records to train on
        self._loaded: dict[int, zstandard.ZstdCompressionDict] = {}
        self._counts: dict[int, int] = {}  # records appended here, by kind
        self._tried: set[int] = set()
        self.active: dict[int, int] = {}
        self.refresh()

    def refresh(self) -> None:
        """Read which dictionary each kind uses (another process may have trained one)."""
        active = self._tx.safe_meta(K_DICTS)
        if isinstance(active, dict):
            self.active = {int(k): int(v) for k, v in active.items()}

    def for_kind(self, kind: int) -> tuple[int, zstandard.ZstdCompressionDict | None]:
        """The dictionary new entries of ``kind`` are compressed with (0, None: none)."""
        dict_id = self.active.get(kind, 0)
        return dict_id, (self.get(dict_id) if dict_id else None)

    def get(self, dict_id: int) -> zstandard.ZstdCompressionDict | None:
        """A stored dictionary by id (loaded once; None if absent or damaged)."""
        found = self._loaded.get(dict_id)
        if found is None:
            try:
                with self._tx.read() as txn:
                    raw = txn.get(f"{K_DICT_PREFIX}{dict_id}".encode(), db=self._tx.dbs["meta"])
                if raw is None:
                    return None
                found = zstandard.ZstdCompressionDict(decode_frame(raw)[1])
            except (FrameError, lmdb.Error, JournalError):
                return None
            self._loaded[dict_id] = found
        return found

    def appended(self, kind: int, count: int) -> None:
        """``count`` records of ``kind`` were appended: wake training once there are enough."""
        total = self._counts[kind] = self._counts.get(kind, 0) + count
        if total >= dictionary.MIN_SAMPLES and kind not in self.active and kind not in self._tried:
            self._due.set()

    def train(self, read: Callable[..., ReadResult], floor: int) -> list[EntryKind]:
        """Train a dictionary for each kind with enough records and none yet.

        ``read`` is the journal's reader; entries after ``floor`` are the samples.
        Returns the kinds that got one. A no-op where this process does not append.
        """
        trained: list[EntryKind] = []
        if not self.trains:
            return trained
        for kind in EntryKind:
            if kind in self.active or kind in self._tried:
                continue
            if self._counts.get(kind, 0) < dictionary.MIN_SAMPLES:
                continue
            self._tried.add(kind)
            got = read(
                floor,
                kinds=[kind],
                max_entries=dictionary.MAX_SAMPLES,
                max_bytes=dictionary.MAX_SAMPLE_BYTES,
            )
            data = dictionary.train([e.payload for e in got.entries])
            if data is None:
                continue
            with self._tx.lock:
                new_id = max([0, *self.active.values()]) + 1
                if new_id > 255:
                    break
                active = {**self.active, int(kind): new_id}

                def put(
                    txn: lmdb.Transaction,
                    data: bytes = data,
                    active: Any = active,
                    new_id: int = new_id,
                ) -> None:
                    self._tx.put_meta_bytes(txn, f"{K_DICT_PREFIX}{new_id}", data)
                    self._tx.put_meta(txn, K_DICTS, {str(k): v for k, v in active.items()})

                self._tx.write(put)
                self._loaded[new_id] = zstandard.ZstdCompressionDict(data)
                self.active = active
            trained.append(kind)
        return trained
