"""Damage made to one journal entry in place, for the tests of what a reader
makes of it."""

from __future__ import annotations

from primeruns.journal import Journal
from primeruns.journal.layout import key


def flip_stored(journal: Journal, seq: int, at: int = -1) -> None:
    """Flip byte ``at`` of entry ``seq``'s first value in LMDB: ``-1`` (its
    body's last byte) keeps its header whole and fails its checksum; ``0``
    (its header's version) leaves a header that does not read."""
    tx = journal._tx
    with tx.lock, tx.store.begin(write=True) as txn:
        db = tx.dbs["entries"]
        value = bytearray(txn.get(key(seq), db=db))
        value[at] ^= 0xFF
        txn.put(key(seq), bytes(value), db=db)


def put_stray(journal: Journal, raw_key: bytes, value: bytes) -> None:
    """Put ``value`` under ``raw_key`` in LMDB's entries, a key no entry has
    (a hand-made journal, a damaged tree)."""
    tx = journal._tx
    with tx.lock, tx.store.begin(write=True) as txn:
        txn.put(raw_key, value, db=tx.dbs["entries"])
