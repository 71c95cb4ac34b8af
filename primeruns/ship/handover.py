"""A requeued job's uplink takes its predecessors' journals over through their sync journals.

A training job requeued with the same run id (``init(kind="train", id=...)``)
ships the journals an earlier process of the run left in its runs directory
(``earlier_journals``). On a cluster those are often copies: the
predecessor's journal copied from its node, perhaps twice (two rsyncs into
two names), perhaps synced from the login node already. Shipped where each
is, every copy would ship the same records again, and a later ``primeruns
sync`` of any of them once more.

So each is taken over as ``replay`` and ``sync`` take a journal: read from a
private snapshot, never written, imported into its sync journal
(:mod:`primeruns.ship.mirror`), and the uplink ships the sync journals,
one per journal however many copies of it there are. The original of a
predecessor, when it is one, is marked ``continued_by`` (so listings and
init's note on crashed runs know it was taken over).

A predecessor that finished and shipped everything (``left_nothing``: its
journal says so), or whose sync journal shipped all of it (taken over by an
earlier requeue: ``shipped_by_its_sync_journal``), is not taken over: a run key's
requeues would each copy and import every earlier attempt of the job
again, each requeue costing more than the last (DESIGN invariant 12).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from primeruns.logs import get_logger

from .. import ranks
from ..exceptions import JournalError
from ..journal import Journal, JournalInfo
from ..journal.origin import Origin
from ..sinks.kinds import sink_kinds
from ..spec import SPEC_KEY, listed_spec
from . import sync_records
from .copies import check_sync_root, note_copy
from .mirror import import_new, open_sync_journal, snapshot, sync_root

__all__ = [
    "left_nothing",
    "remember",
    "remember_left",
    "shipped_by_its_sync_journal",
    "take_over",
]

log = get_logger("primeruns.uplink")


def left_nothing(info: JournalInfo) -> bool:
    """Whether the listed journal ``info`` has nothing left to ship, as it
    records itself: its uplink closed it out with nothing pending (``state``
    shipped, ``finalized``; ``Uplink.close_out``) and every sink of its run
    acknowledged its last entry. Read as untrusted: a journal with damage,
    without a readable spec, or whose meta is of another shape is not one
    (it is taken over as before, and its import says what is wrong). One
    whose close-out failed (the platform down at its finish) is not either:
    a take-over closes its run."""
    meta = info.meta
    if info.damage or meta.get("state") != "shipped":
        return False
    closed = meta.get("finalized")
    if not isinstance(closed, dict) or not isinstance(closed.get("status"), str):
        return False  # ({}: a close-out that says nothing is none)
    spec = listed_spec(meta)
    stored = meta.get(SPEC_KEY)
    if spec is None or not isinstance(stored, dict) or stored.get("kind") != spec.kind:
        # A spec that does not name its kind reads as an evaluation's: the
        # sinks checked below would not be the run's.
        return False
    last = info.last_seq
    for sink in sink_kinds(spec.kind):
        acked = info.cursors.get(sink)
        if not isinstance(acked, int) or isinstance(acked, bool) or acked < last:
            return False
    return True


def shipped_by_its_sync_journal(info: JournalInfo) -> bool:
    """Whether the listed journal ``info``, one whose process is gone, had
    all it holds shipped through its sync journal (taken over by an earlier
    requeue, or synced): a take-over would import nothing and ship nothing.
    A journal with damage, or a sync root that cannot be read or trusted,
    says no (taken over as before, which says why)."""
    if info.damage:
        return False
    try:
        return ranks.shipped_through_sync(info, sync_root())
    except (JournalError, OSError):
        return False


def take_over(paths: Sequence[Path], root: Path, by: str) -> list[Journal]:
    """The sync journals of the journals at ``paths`` (opened as owner, for
    the caller to ship and close), each holding all its copies brought.
    ``by``: the local id of the run taking them over. A journal that cannot
    be taken (its sync journal shipped by another process, a copy changing
    as it is read) is left for ``sync``, and logged."""
    taken: dict[str, Journal] = {}
    try:
        check_sync_root(root)
    except JournalError as exc:  # another user's, or a link: nothing taken there
        if paths:
            log.warning("prime-runs: not taking over earlier journals of this run: %s", exc)
        return []
    for path in paths:
        origin = Origin.read_beside(path)
        if origin is not None and origin.producer_state() == "alive":
            # A copy of a journal whose uplink still ships it here: two
            # shippers would send its records twice. Left for sync.
            log.info("prime-runs: not taking over %s: its uplink still ships it", path)
            continue
        try:
            with snapshot(path, root) as private, Journal.open(private, owner=False) as source:
                journal = taken.get(source.local_id)
                if journal is None:
                    journal, _ = open_sync_journal(source, root)
                    taken[source.local_id] = journal
                import_new(source, journal)
            note_copy(journal, path)
            if origin is not None and origin.is_original(path.absolute()):
                with Journal.open(path, owner=True) as original:
                    original.set_meta("continued_by", by)
        except sync_records.LeftUnshipped as exc:
            # Nothing else will say it: the run closes without them.
            log.warning("prime-runs: not taking over %s: %s", path, exc)
            continue
        except JournalError as exc:  # its owner came back, or it is damaged: left for sync
            log.info("prime-runs: not taking over %s: %s", path, exc)
            continue
        log.info("prime-runs: shipping the backlog of an earlier process of this run (%s)", path)
    return list(taken.values())


def remember(journal: Journal, run_id: str) -> None:
    """Record beside the sync journals that ``journal``, one taken over,
    ships to platform run ``run_id``, before it ships anything
    (``sync_records``): deleted later, it is then never made again by a
    ``sync`` of a copy, which would ship its records a second time. Until
    ``remember_left`` says what it left, it is shipping (``left`` null): a
    take-over cut short is never taken for all shipped."""
    sync_records.remember_shipping(journal, run_id, left=None)


def remember_left(journal: Journal, pending: dict[str, int]) -> None:
    """Record beside the sync journals what ``journal``, one taken over and
    shipped, leaves to ship (``pending``, per sink), and whether its run is
    closed (``Uplink._close_adopted`` marks it so), where it has a record
    (it bound a run): a ``replay`` that left records there said so in it.
    Without ``closed``, one deleted by hand once it shipped everything was
    not taken for shipped: a ``sync`` of its journal was refused, saying it
    would ship the records twice."""
    root = journal.path.parent
    if sync_records.recorded(root, journal.local_id) is not None:
        sync_records.remember(
            root,
            journal.local_id,
            left={k: v for k, v in pending.items() if v},
            closed=bool(journal.get_meta("finalized")),
        )
