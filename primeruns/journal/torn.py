"""Whether a spool's torn tail is damage: only after a reboot since its last writer.

A spool segment may end in part of an append (``spool``): bytes whose
``write()`` never returned. After a crash of the writing *process* that is
expected and loses nothing a caller was told was kept: the page cache keeps
every ``write()`` that returned, so the torn part is a call that never
returned (and a live writer's segment ends in one for a moment, too). After a
*power cut* it is not: under ``durability="process"`` the bytes of calls that
returned may have been lost with the page cache, and the torn tail is what
is left of them. A reader cannot tell the two from the bytes, but it can tell
whether the machine rebooted since the last process that wrote the journal:
every appending open records its host and boot (``K_WRITER``), and a torn
tail is reported as damage (``show``, ``sync`` and ``replay`` exit 4) when
that boot is not this one, on the same host. A copy read on another host
(rsynced from a live job) may be torn by the copy itself: not damage there.
Nor is the tail of a writer with ``durability="fsync"`` (recorded with its
boot): each append was synced before its call returned, so what a power
cut tore is a call that never returned.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import lmdb

from primeruns.exceptions import JournalError
from primeruns.journal.meta import Meta
from primeruns.journal.origin import K_ORIGIN, Origin, boot_id
from primeruns.journal.spool import SpoolView
from primeruns.journal.txn import Transactions
from primeruns.journal.types import Damage

__all__ = ["K_WRITER", "record_writer", "torn_damage"]

# The last process that opened the journal to append: its host and boot.
K_WRITER = "journal.writer"


def record_writer(meta: Meta, path: Path, durability: str) -> None:
    """This process appends to the journal at ``path`` from now on, with
    ``durability``."""
    with contextlib.suppress(JournalError, lmdb.Error):
        meta.update({K_WRITER: {**Origin.here(path).to_json(), "durability": durability}})


def rebooted_since_writer(tx: Transactions) -> bool:
    """Whether this machine rebooted since the journal's last writer (False
    where that cannot be told: another host, no boot id, no record)."""
    writer = Origin.from_json(tx.safe_meta(K_WRITER)) or Origin.from_json(tx.safe_meta(K_ORIGIN))
    current = boot_id()
    if writer is None or writer.boot is None or current is None or not writer.on_this_host:
        return False
    return writer.boot != current


def _synced_each_append(tx: Transactions) -> bool:
    """Whether the journal's last writer synced each append before its call
    returned (``durability="fsync"``); False where it is not recorded."""
    writer = tx.safe_meta(K_WRITER)
    return isinstance(writer, dict) and writer.get("durability") == "fsync"


def torn_damage(tx: Transactions, spool: SpoolView) -> list[Damage]:
    """The spool's torn tails, as damage, if the machine rebooted since the
    journal's last writer (see the module doc); none otherwise."""
    tails = spool.torn_tails()
    if not tails or not rebooted_since_writer(tx) or _synced_each_append(tx):
        return []
    out = []
    for tail in tails:
        held = f"an append of {tail.entries} entries" if tail.entries else "an append's start"
        out.append(
            Damage(
                tail.after + 1,
                f"spool segment {tail.name}: a torn tail of {tail.bytes} bytes ({held}) "
                f"after entry {tail.after}, cut short by a power loss since its last writer; "
                "what it held and anything written after it are lost",
                entries=max(1, tail.entries),
            )
        )
    return out
