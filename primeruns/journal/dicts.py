"""The zstd dictionaries of one journal: which one each kind uses, loading
them by id, and training new ones (``dictionary`` decides whether one pays).

The process that compresses, the mover's (``mover``), trains: appends
are spooled raw, so a dictionary is only ever used where entries are
compressed, and training (~0.2 s of CPU, with the GIL held, once per kind)
then never runs in a producer that handed its moving over to its uplink. A
dictionary is stored, committed, before any entry uses it, under an id taken
in the same transaction, so two movers for a moment (a hand-over) never give
one id two dictionaries. A mover reads which dictionaries are in use again
before each batch (``refresh``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lmdb
import zstandard

from primeruns.ascii_digits import decimal_or_none
from primeruns.exceptions import JournalError, JournalFullError
from primeruns.journal import dictionary
from primeruns.journal.dictionary import MAX_TRAINED_DICT_BYTES
from primeruns.journal.frames import EntryKind, FrameError, decode_frame
from primeruns.journal.txn import Transactions
from primeruns.journal.types import ReadResult

K_DICTS = "journal.dicts"  # {kind: dictionary id} in use for new entries
K_DICT_PREFIX = "journal.dict."  # + id: the dictionary's bytes
# A stored dictionary claiming more than this is damage, never decompressed:
# training makes them at most ~112 KB (dictionary).
MAX_DICT_BYTES = 1 << 20


class Dictionaries:
    def __init__(self, tx: Transactions) -> None:
        self._tx = tx
        self._loaded: dict[int, zstandard.ZstdCompressionDict] = {}
        self._counts: dict[int, int] = {}  # records compressed here, by kind
        self._tried: set[int] = set()
        self.active: dict[int, int] = {}
        self.refresh()

    def refresh(self) -> None:
        """Read which dictionary each kind uses (another process may have trained one)."""
        active = self._tx.safe_meta(K_DICTS)
        if isinstance(active, dict):
            self.active = _in_use(active)

    def for_kind(self, kind: int) -> tuple[int, zstandard.ZstdCompressionDict | None]:
        """The dictionary new entries of ``kind`` are compressed with (0, None: none)."""
        dict_id = self.active.get(kind, 0)
        return dict_id, (self.get(dict_id) if dict_id else None)

    def get(
        self, dict_id: int, txn: lmdb.Transaction | None = None
    ) -> zstandard.ZstdCompressionDict | None:
        """A stored dictionary by id (loaded once; None if absent or damaged).
        ``txn``: read in it (a check made inside a write transaction, which
        a read transaction of its own would wait on), else in a read one."""
        found = self._loaded.get(dict_id)
        if found is None:
            name = f"{K_DICT_PREFIX}{dict_id}".encode()
            try:
                if txn is None:
                    with self._tx.read() as own:
                        raw = own.get(name, db=self._tx.dbs["meta"])
                else:
                    raw = txn.get(name, db=self._tx.dbs["meta"])
                if raw is None:
                    return None
                found = zstandard.ZstdCompressionDict(
                    decode_frame(raw, max_bytes=MAX_DICT_BYTES)[1]
                )
            except (FrameError, lmdb.Error, JournalError):
                return None
            self._loaded[dict_id] = found
        return found

    def adopt(self, dict_id: int, data: bytes) -> bool:
        """Hold ``data`` (another journal's dictionary ``dict_id``) under
        that id, stored unless it is there already, not used for new
        entries: a sync journal's import stores its copy's frames as they
        are, and a frame names its dictionary by id. False when this
        journal holds another dictionary under that id (its own, trained
        here), or where it does not fit (the byte budget, a full disk): such
        frames are then not stored as they are, but appended, as an import's
        entries always were (spooled, the budget's reserve theirs). Nor one
        larger than training makes (``MAX_TRAINED_DICT_BYTES``): a copy is
        untrusted input, and its 255 dictionaries of up to 1 MiB each,
        adopted, were ~255 MB held in the sync's memory."""
        if not 0 < dict_id < 256 or len(data) > MAX_TRAINED_DICT_BYTES:
            return False
        name = f"{K_DICT_PREFIX}{dict_id}"

        def put(txn: lmdb.Transaction) -> bool:
            raw = txn.get(name.encode(), db=self._tx.dbs["meta"])
            if raw is None:
                self._tx.put_meta_bytes(txn, name, data)
                return True
            try:
                return decode_frame(raw, max_bytes=MAX_DICT_BYTES)[1] == data
            except FrameError:
                return False

        with self._tx.lock:
            try:
                # Not a control write: the reserve is kept for the entries.
                if not self._tx.write(put, control=False):
                    return False
            except JournalFullError:
                return False
            self._loaded.setdefault(dict_id, zstandard.ZstdCompressionDict(data))
        return True

    def cached(self, dict_id: int) -> zstandard.ZstdCompressionDict | None:
        """A dictionary ``get`` loaded already, else None (reads nothing: for a
        check made inside another read transaction)."""
        return self._loaded.get(dict_id)

    def _stored_ids(self, txn: lmdb.Transaction) -> list[int]:
        prefix = K_DICT_PREFIX.encode()
        cur = txn.cursor(db=self._tx.dbs["meta"])
        ids = []
        if cur.set_range(prefix):
            for key in cur.iternext(values=False):
                if not bytes(key).startswith(prefix):
                    break
                with contextlib.suppress(ValueError):
                    ids.append(int(bytes(key)[len(prefix) :]))
        return ids

    def seen(self, kind: int, count: int) -> None:
        """``count`` records of ``kind`` were moved into LMDB here."""
        self._counts[kind] = self._counts.get(kind, 0) + count

    def due(self) -> bool:
        """Whether a kind has enough records to train on and no dictionary yet."""
        return any(
            total >= dictionary.MIN_SAMPLES and kind not in self.active and kind not in self._tried
            for kind, total in self._counts.items()
        )

    def train(self, read: Callable[..., ReadResult], floor: int) -> list[EntryKind]:
        """Train a dictionary for each kind with enough records and none yet.

        ``read`` is the journal's reader; entries after ``floor`` are the samples.
        Returns the kinds that got one.
        """
        trained: list[EntryKind] = []
        for kind in EntryKind:
            if kind in self.active or kind in self._tried:
                continue
            if self._counts.get(kind, 0) < dictionary.MIN_SAMPLES:
                continue
            self._tried.add(kind)  # once, even if reading the samples fails
            got = read(
                floor,
                kinds=[kind],
                max_entries=dictionary.MAX_SAMPLES,
                max_bytes=dictionary.MAX_SAMPLE_BYTES,
            )
            if not self._train_kind(kind, [e.payload for e in got.entries]):
                break
            if kind in self.active:
                trained.append(kind)
        return trained

    def train_on(self, batch: Mapping[int, Sequence[bytes | memoryview]]) -> None:
        """Train for each kind of ``batch`` (a batch about to be compressed:
        its records by kind) with none yet, on the batch's own records, when
        they alone make enough: a kind that reaches enough in a few records
        a batch is left to ``train``, which reads the journal's (trained on
        the last few alone, it was tried and never got one).

        So the first batch already uses the dictionary: a run that logs its
        records in a burst and closes (an evaluation logging its results at
        its end) has them all moved by ``close()`` in a few batches, and a
        dictionary trained only after the first batch left the first 512
        entries without one (at rest, 0.45 bytes a raw byte of gsm8k
        episodes where the dictionary makes it 0.23)."""
        for kind, records in batch.items():
            if kind in self.active or kind in self._tried:
                continue
            if len(records) < dictionary.MIN_SAMPLES:
                continue
            # A dictionary that cannot be stored (the byte budget, a full
            # disk) never keeps the batch from moving: it goes without one.
            with contextlib.suppress(JournalError, lmdb.Error):
                if not self._train_kind(kind, _samples(records)):
                    return

    def _train_kind(self, kind: int, samples: Sequence[bytes]) -> bool:
        """Train ``kind``'s dictionary on ``samples``, tried once whatever
        comes of it; stored, committed, and in use when it pays. False when
        the journal has no id left for another dictionary."""
        self._tried.add(kind)
        data = dictionary.train(samples)
        if data is None:
            return True

        def put(txn: lmdb.Transaction) -> Any:
            # The id is taken from what is stored, in the transaction
            # that stores it: another process may have trained since.
            # Past every stored dictionary, in use or not: an id is never
            # given a second dictionary, whatever K_DICTS says.
            new_id = max([0, *self._stored_ids(txn)]) + 1
            stored = self._tx.meta_or(txn, K_DICTS, {})
            active = _in_use(stored) if isinstance(stored, dict) else {}
            if new_id > 255:
                return None
            active[int(kind)] = new_id
            self._tx.put_meta_bytes(txn, f"{K_DICT_PREFIX}{new_id}", data)
            self._tx.put_meta(txn, K_DICTS, {str(k): v for k, v in active.items()})
            return active

        with self._tx.lock:
            active = self._tx.write(put)
            if active is None:
                return False
            self._loaded[active[int(kind)]] = zstandard.ZstdCompressionDict(data)
            self.active = active
        return True


def _samples(records: Sequence[bytes | memoryview]) -> list[bytes]:
    """The first of ``records`` within what ``train`` reads of a journal
    (``MAX_SAMPLES`` records, ``MAX_SAMPLE_BYTES``; at least one), as bytes
    (zstd's trainer takes nothing else)."""
    samples: list[bytes] = []
    total = 0
    for record in records[: dictionary.MAX_SAMPLES]:
        if samples and total + len(record) > dictionary.MAX_SAMPLE_BYTES:
            break
        samples.append(bytes(record))
        total += len(record)
    return samples


def _in_use(stored: dict[Any, Any]) -> dict[int, int]:
    """``journal.dicts`` as read back: untrusted (a hostile journal), so a
    pair that is not a kind's number and a dictionary id is left out, rather
    than failing every open of the journal with a ValueError (``show``,
    ``export``): a kind's number is a few ASCII digits (``int`` reads
    Arabic-Indic ones as a number nobody wrote, and refuses thousands)."""
    return {
        kind: v
        for k, v in stored.items()
        if isinstance(k, str)
        and (kind := decimal_or_none(k, 9)) is not None
        and isinstance(v, int)
        and not isinstance(v, bool)
    }
