"""What the sync journals here have shipped, kept apart from the sync journals.

Every ship from the command line goes through a sync journal
(:mod:`primeruns.ship.mirror`), which keeps the run's registration and
acknowledged offsets. When a sync journal is gone (deleted by hand, or pruned
by ``primeruns gc`` once its run was shipped and closed), the next copy of
its journal would make a new one, register the run again and ship every
record a second time.

So each sync journal leaves a small record beside the sync journals
(``<sync root>/.shipped/<local id>.json``): the platform run it ships to,
how far into its journal it imported, whether the run is closed, and what
it had left to ship when a ``sync``, ``replay`` or requeue's take-over of it
ended (``left``: records by sink; null while one ships it). A sync journal is made only
where no record is (:func:`refuse_if_shipped`); a copy that holds nothing
beyond what a pruned sync journal shipped is nothing to sync
(:func:`nothing_new`). A run closed with records left (a sink down at the
close-out) is not all shipped: its sync journal deleted by hand, those
records are named (:class:`LeftUnshipped`), never passed over as shipped.
The folder's name starts with a dot, which no local id does, so it is
never taken for a sync journal.

A record decides where a run's records go and which are skipped: it is read
only from a sync root of the user's own (``copies.check_sync_root``), never
through a link, and only when it is the user's own file (UntrustedPathError
otherwise, naming it).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..exceptions import JournalError
from .copies import K_SOURCE_PATH, make_sync_root, read_record

if TYPE_CHECKING:
    from ..journal import Journal

__all__ = [
    "LeftUnshipped",
    "nothing_new",
    "record_path",
    "recorded",
    "refuse_if_shipped",
    "remember",
    "remember_shipping",
]

_FOLDER = ".shipped"


class LeftUnshipped(JournalError):
    """A sync journal is gone (deleted by hand) whose record says it had
    records left to ship, or was shipping when it was last recorded: which
    of them the platform holds went with it. Its message says to restore
    it, or, the journal still here, to delete the record and sync it anew."""


def record_path(root: Path, local_id: str) -> Path:
    """Where the record of the sync journal ``root/local_id`` is."""
    return root / _FOLDER / f"{local_id}.json"


def recorded(root: Path, local_id: str) -> dict[str, Any] | None:
    """The record of ``local_id``'s sync journal, or None (none, or
    unreadable). UntrustedPathError for a root, folder or record another
    user could have planted or that is a link."""
    return read_record(root, _FOLDER, f"{local_id}.json", limit=1 << 20)


def remember(root: Path, local_id: str, **fields: Any) -> None:
    """Merge ``fields`` into the record (written whole, then renamed into place)."""
    record = recorded(root, local_id) or {}
    if all(record.get(k) == v for k, v in fields.items()):
        return
    record.update(fields)
    folder = make_sync_root(root, _FOLDER)
    fd, tmp = tempfile.mkstemp(prefix=".record-", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, record_path(root, local_id))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remember_shipping(journal: Journal, run_id: str, **left: dict[str, int] | None) -> None:
    """Record what the sync journal ``journal`` ships to platform run
    ``run_id``: how far into its journal it imported, whether the run is
    closed (its ``finalized``: a close-out's, not ``{}``), and, given
    ``left``, what it leaves to ship (None: it ships now, and a cut short
    leaves that unknown). ``sync``, ``replay`` and a take-over alike: a
    record without ``closed`` is never taken for a run shipped and closed."""
    source = journal.get_meta(K_SOURCE_PATH)
    upto = source.get("imported_upto") if isinstance(source, dict) else None
    remember(
        journal.path.parent,
        journal.local_id,
        run_id=run_id,
        imported_upto=upto if isinstance(upto, int) else journal.last_seq(),
        closed=bool(journal.get_meta("finalized")),
        **left,
    )


def refuse_if_shipped(root: Path, local_id: str, *, bound: bool | None = None) -> None:
    """JournalError naming the fix when a sync journal of ``local_id`` shipped
    records to the platform and is gone: a new one would ship them twice.
    ``bound``: whether the journal syncing it is bound to a platform run
    (online, attached by id, or keyed), where a new sync journal ships into
    that run again; None where it is not known."""
    record = recorded(root, local_id)
    if record is None or not record.get("run_id"):
        return
    left = _left(record)
    if left is not None:
        sync, run = root / local_id, record["run_id"]
        said = (
            f"the sync journal of {local_id} ({sync}) is gone, and it {left}: which of "
            f"the records platform run {run} holds went with it, so nothing ships them "
            f"now. Restore {sync} (from a backup) and run `primeruns sync` of this "
            "journal again to ship them."
        )
        closed = _closed_by_it(record)
        if closed is None:
            raise LeftUnshipped(
                f"{said} Or, with this journal or a copy of it that holds all it logged, "
                f"sync it anew: delete {record_path(root, local_id)} and run `primeruns "
                "sync` of it. Its new sync journal ships every record again: into a new "
                "platform run if the journal is bound to none (an offline run without a "
                f"run key; delete run {run} on the platform then), else into run {run}, "
                f"which may then hold some twice: {_RESENT}"
            )
        again = (
            f"a new sync journal would ship into run {run} again and close it a second "
            "time, which is never done (an evaluation's close-out is not idempotent)"
        )
        if bound:
            raise LeftUnshipped(
                f"{said} It {closed}, and this journal is bound to that run: {again}, "
                "so syncing it anew is not offered"
            )
        anew = (
            "Or, this journal bound to no platform run (an offline run without a run "
            "key), with it or a copy of it that holds all it logged, sync it anew: "
            f"delete {record_path(root, local_id)} and run `primeruns sync` of it: its "
            f"new sync journal ships every record into a new platform run (delete run "
            f"{run} on the platform then)."
        )
        if bound is None:
            anew += (
                f" Not for a journal bound to run {run} (online, attached or keyed): "
                f"it {closed}, and {again}"
            )
        raise LeftUnshipped(f"{said} {anew}")
    pruned = " (primeruns gc pruned it once the run was closed)" if record.get("pruned") else ""
    raise JournalError(
        f"the sync journal of {local_id} is gone{pruned}, and platform run "
        f"{record['run_id']} already holds the records it shipped: syncing this journal "
        "again would ship them twice. If the run was deleted on the platform and should "
        f"be shipped again as a new run, delete {record_path(root, local_id)} and sync again"
    )


# What the platform does with a record it holds sent again into the same
# run, by kind (the platform contract's idempotency).
_RESENT = (
    "an evaluation's sample rows are appended, and a training step's samples "
    "uploaded as one more file; a training step's metrics row is kept once (one "
    "row per step); Prime Traces takes a batch it holds byte for byte as done "
    "(its Idempotency-Key), and may store again what is batched otherwise"
)


def nothing_new(root: Path, local_id: str, last_seq: int) -> bool:
    """Whether a journal of ``local_id`` ending at ``last_seq`` holds nothing
    its pruned sync journal had not shipped into a run it closed."""
    record = recorded(root, local_id)
    if record is None or not record.get("closed") or _left(record) is not None:
        return False
    upto = record.get("imported_upto")
    return isinstance(upto, int) and last_seq <= upto


def _closed_by_it(record: dict[str, Any]) -> str | None:
    """How the run of a sync journal gone with records left was closed by
    it, or may have been (None: it was not): closed, or cut short while it
    shipped, its close-out perhaps sent (a record says shipping until the
    pass after its close-out is over)."""
    if record.get("closed"):
        return "closed the run"
    if not isinstance(record.get("left"), dict):
        return "may have closed the run before it was cut short"
    return None


def _left(record: dict[str, Any]) -> str | None:
    """What ``record`` says its sync journal had left to ship, or None: it
    shipped all it imported (``gc`` prunes only such a one), or an earlier
    version wrote the record, which does not say. A run closed out is not
    all shipped: ``replay`` closes it with a sink down. A count that is not
    one (of another type, negative, or past any journal's) is damage: read
    as records left, never as none, and never printed (an integer of
    thousands of digits raised ValueError out of sync and a requeue's init())."""
    if record.get("pruned") or "left" not in record:
        return None
    left = record["left"]
    if not isinstance(left, dict):
        return "was shipping when it was last recorded (a sync cut short)"
    counts = {k: v for k, v in left.items() if _count(v) and v > 0}
    damaged = any(not _count(v) for v in left.values())
    if not counts and not damaged:
        return None
    shown = ", ".join(f"{sink}: {n}" for sink, n in sorted(counts.items()))
    if damaged:
        shown = f"{shown}, and counts damaged" if shown else "its counts damaged"
        return f"had records left to ship ({shown})"
    return f"had {sum(counts.values())} records left to ship ({shown})"


# More records than any journal holds (its entries are numbered in 64 bits):
# a count past it is damage.
_MOST = 1 << 64


def _count(value: Any) -> bool:
    """Whether ``value`` is a count of records a record may hold."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MOST
