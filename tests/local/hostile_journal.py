"""A small hostile journal: a few hundred KB on disk, gigabytes once decoded.

What a local attacker could plant in a shared runs directory (or a producer
with a bug could write) to take the offline dashboard down: every entry and
meta value is a valid, checksummed frame, honest about the size it declares,
and that size is huge. zstd bombs (a ~100 MiB string compresses to a few
KB), JSON nested hundreds of thousands of levels deep, objects of millions of
keys, in every place a page reads: the spec and other meta values, episodes
(more than a page of them), metric rows, summaries and the finish record.

Used by ``tests/local/test_security_hostile_journals.py`` and by
``tools/security/hostile_journal.py`` (which writes one for a manual look).
Payloads are built once and appended again and again, so writing one costs a
few seconds and a few hundred MB at most, never what a reader would decode.
"""

from __future__ import annotations

import json
from pathlib import Path

import lmdb
import zstandard

from primeruns.journal import EntryKind, Journal
from primeruns.journal.frames import FLAG_ZSTD, MAX_ENTRY_BYTES, _assemble
from primeruns.journal.layout import put_entry

#: The largest payload an entry may declare (the journal refuses more).
BOMB_BYTES = MAX_ENTRY_BYTES - 4096
#: Episodes written: more than a page of samples (50), so a page meets only bombs.
EPISODES = 60
DEEP = 200_000
MANY_KEYS = 300_000


def _bomb_string(size: int) -> bytes:
    """A JSON string of ``size`` bytes (``"xxx...x"``)."""
    return b'"' + b"x" * (size - 2) + b'"'


def _deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def _many_keys(count: int) -> bytes:
    return b"{" + b",".join(b'"k%d":%d' % (i, i) for i in range(count)) + b"}"


def _episode(field: bytes, index: int) -> bytes:
    """An episode the projection accepts (one trace, training step 0), with
    ``field`` as its extra value."""
    head = json.dumps(
        {
            "id": f"hostile-{index}",
            "run": {"type": "train", "work": {"type": "train", "step": 0}},
            "traces": [{"id": f"t{index}", "nodes": [], "rewards": {}}],
        }
    ).encode()
    return head[:-1] + b', "hostile": ' + field + b"}"


def _frames(payload: bytes) -> tuple[int, bytes]:
    """``payload`` compressed once (flags, stored bytes): every entry holding it reuses them."""
    packed = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(payload)
    return FLAG_ZSTD, packed


def write_hostile_journal(runs_dir: Path, local_id: str = "hostile", kind: str = "eval") -> Path:
    """Write the hostile journal under ``runs_dir``; its path.

    Its frames are put straight into the entries table (as a planted file
    would hold them), not appended through the producer's spool: that would
    write every payload out raw before compressing it."""
    spec = {"kind": kind, "name": "hostile", "model": "m", "mode": "offline"}
    bomb, deep, keys = _bomb_string(BOMB_BYTES), _deep(DEEP), _many_keys(MANY_KEYS)
    entries: list[tuple[EntryKind, bytes]] = []
    # One episode of each shape, appended again and again (each compressed once).
    shapes = [_episode(value, i) for i, value in enumerate((bomb, deep, keys))]
    for index in range(EPISODES):
        # Distinct keys compress least (~1 MB each): a few of them, the rest bombs.
        entries.append((EntryKind.EPISODE, shapes[2 if index % 20 == 2 else index % 2]))
    for value in (bomb, deep, keys):
        entries.append((EntryKind.METRICS, b'{"step": 1, "hostile": ' + value + b"}"))
        entries.append((EntryKind.SUMMARY, b'{"hostile": ' + value + b"}"))
    entries.append(
        (EntryKind.FINISH, b'{"status": "completed", "summary": {"hostile": ' + bomb + b"}}")
    )
    packed: dict[bytes, tuple[int, bytes]] = {}
    with Journal.create(runs_dir, local_id=local_id, meta={"spec": spec}) as journal:
        tx = journal._tx

        def put(txn: lmdb.Transaction) -> None:
            # Not deep nesting here: the listing would give up on the whole
            # journal (RecursionError), sparing the pages what follows.
            for name, value in (("bomb", bomb), ("keys", keys)):
                for i in range(4 if value is not keys else 1):
                    tx.put_meta_bytes(txn, f"hostile.{name}.{i}", value)
            for seq, (kind, payload) in enumerate(entries, 1):
                flags, stored = packed.get(payload) or packed.setdefault(payload, _frames(payload))
                frame = _assemble(int(kind), flags, 0, len(payload), stored, seq)
                put_entry(txn, seq, frame, tx.dbs["entries"])

        tx.write(put)
        return journal.path
