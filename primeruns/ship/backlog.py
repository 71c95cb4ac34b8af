"""Shipping a journal on disk: what ``primeruns replay`` and ``sync`` do.

A journal on disk is either where it was written (its *origin*, recorded at
creation: ``journal.origin``) or a copy of it (another path, another host:
cluster users copy runs directories from compute nodes to a login node, often
again and again while the job runs).

Every journal ships **through its sync journal** (``mirror``), the original
as much as any copy: the journal is read from a private snapshot, never
written; what it holds beyond what earlier copies brought is imported into
the syncing user's sync journal of that run, which keeps the registration
and offsets, and is shipped from there. So the original and any number of
copies of it, synced any number of times in any order, make one platform
run with every record once (a copy taken before the original shipped holds
none of the original's shipping state: had the original kept it, the copy
would register the run again). A sync journal that shipped and is gone is
refused, not made again (``sync_records``).

The original ships only once its producer is gone (its owner lock free;
refused, naming the owner, while it lives). A journal damaged beyond saying
where it was written, or damaged and final with no sync journal yet, is
rebuilt where it is from what is intact and shipped in place.

A copy is closed out only when that is known to be right: it holds the
finish entry, or its producer is known dead (same host, the pid gone), or
the user says the job ended (``job_ended``). Otherwise the run is shipped and
left open, and the report says why (a later sync of a newer copy goes on).
A copy of an online run whose uplink may still ship it is refused: two
shippers of one journal would send records twice.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primeruns.logs import get_logger

from ..exceptions import JournalCorruptError, JournalError, JournalLockedError
from ..journal import Damage, Journal, journal_info
from ..journal.lock import owner_alive, read_owner
from ..journal.origin import Origin
from ..journal.store import DATA_NAME
from ..platform import Settings
from ..spec import RunSpec, SpecError, spec_or_default, supply_spec
from . import ledger, run_keys, sync_records
from .copies import (
    K_SOURCE_PATH,
    check_sync_root,
    is_copy,
    note_copy,
    origin_of,
    sync_names,
    sync_path,
    sync_root,
)
from .factory import sink_kinds
from .mirror import (
    Imported,
    adopt_repaired,
    import_new,
    open_sync_journal,
    snapshot,
)
from .original_here import OriginalHere
from .policy import RetryPolicy
from .uplink import Progress, Uplink, journal_settings, terminal_state

__all__ = [
    "ShipReport",
    "is_copy",
    "needs_sync",
    "origin_of",
    "ship_journal",
    "spec_from_file",
    "sync_names",
]

log = get_logger("primeruns.uplink")


@dataclass
class ShipReport:
    """What shipping one journal did; ``ok`` when nothing is left to do now."""

    path: Path
    local_id: str
    run_id: str | None = None
    url: str | None = None
    status: str | None = None
    records: int = 0
    bytes: int = 0
    pending: dict[str, int] = field(default_factory=dict)
    losses: dict[str, dict[str, Any]] = field(default_factory=dict)
    damaged: list[Damage] = field(default_factory=list)
    finalized: bool = False
    errors: list[str] = field(default_factory=list)
    via: Path | None = None
    """The sync journal a copy was shipped from (None: shipped in place)."""
    imported: Imported | None = None
    left_open: str | None = None
    """Why the run was shipped but not closed out (its producer may still write)."""
    shipped_before: str | None = None
    """Why nothing was sent: its sync journal, gone, shipped all it holds
    into a run it closed, as its record says (``sync_records``)."""

    @property
    def ok(self) -> bool:
        done = self.finalized or self.left_open is not None
        return not self.pending and done and not self.errors


class _Shipped(Exception):
    """A journal whose sync journal, gone (pruned by ``gc``, or deleted),
    shipped everything it holds and closed its run, as its record says
    (``sync_records``): nothing to do."""

    def __init__(self, report: ShipReport, record: dict[str, Any], root: Path) -> None:
        super().__init__(report.local_id)
        if record.get("pruned"):
            gone = "was pruned by primeruns gc once the run was closed"
        else:
            gone = f"({root / report.local_id}) is gone"
        report.finalized = True
        report.shipped_before = (
            f"its sync journal {gone}, and its record says it shipped all this journal "
            "holds and closed the run: nothing is sent again"
        )
        self.report = report


def ship_journal(
    path: Path,
    *,
    settings: Settings | None = None,
    timeout: float = 3600.0,
    progress: Callable[[Progress], None] | None = None,
    policy: RetryPolicy | None = None,
    job_ended: bool = False,
    spec: RunSpec | None = None,
    synced_in: Path | None = None,
    base_url: str | None = None,
    register_only: bool = False,
    hold_close: str | None = None,
    finished_by: str | None = None,
) -> ShipReport:
    """Ship everything ``path`` holds (see module doc) and close the run out
    when that is right. ``job_ended``: the user knows the producer is gone (a
    copy without a finish entry is then closed as crashed). ``spec``: what the
    run's spec said, for a journal whose spec was lost to damage.
    ``synced_in``: where sync journals live (default :func:`sync_root`).
    ``base_url``: ship to this platform (with ``settings`` None, which are
    then the journal's own). ``register_only``: register the run (recorded
    where its forked children look for it, ``ship.family``) and ship
    nothing: its children then ship before it, and its close-out after them.
    ``hold_close``: ship everything but leave the run open, for this reason
    (a forked child of it that did not ship: its records would land in a
    closed run). ``finished_by``: another journal of this one's run key,
    holding the run's finish entry and shipped after it (a requeued job's
    attempt that finished): this one, without a finish entry, leaves the run
    open even with ``job_ended`` (closed as crashed first, the run would end
    failed although its job completed).

    Raises ``JournalLockedError`` (naming the owner) while the producer or its
    uplink lives, or another sync ships the same run, and ``JournalError`` for
    a path that is not a journal. Platform failures are reported, never raised.
    """
    root = synced_in if synced_in is not None else sync_root()
    check_sync_root(root)  # (UntrustedPathError: it holds registrations and offsets)
    try:
        return _ship_journal(
            Path(path),
            settings,
            timeout,
            progress,
            policy,
            job_ended,
            spec,
            root,
            base_url,
            register_only,
            hold_close,
            finished_by,
        )
    except _Shipped as done:
        return done.report


def _ship_journal(
    path: Path,
    settings: Settings | None,
    timeout: float,
    progress: Callable[[Progress], None] | None,
    policy: RetryPolicy | None,
    job_ended: bool,
    spec: RunSpec | None,
    root: Path,
    base_url: str | None,
    register_only: bool,
    hold_close: str | None,
    finished_by: str | None,
) -> ShipReport:
    journal: Journal | None = None
    report = ShipReport(path=path, local_id="")
    may_crash, why_open = True, None  # in place, the owner lock proves the producer gone
    damaged: list[Damage] = []
    beside = Origin.read_beside(path)
    damaged_final: list[Damage] = []
    if beside is not None:
        _refuse_a_live_original(path, beside)
    if beside is not None and _through_sync_journal(path, beside, root):
        # A journal is read from a private snapshot, never in place (see mirror).
        with snapshot(path, root) as taken:
            with Journal.open(taken, owner=False) as source:
                damaged_final = _damaged_and_final(source, path, beside, root, job_ended)
                if not damaged_final:
                    journal, report, may_crash, why_open = _import_copy(
                        source, path, beside, root, job_ended
                    )
                local_id, end = source.local_id, source.last_seq()
            if damaged_final:
                # The copy will not change (its producer is gone) and is
                # damaged, and nothing synced it before: its snapshot, rebuilt
                # from what is intact, becomes its sync journal (one made by
                # import takes entries only in order, so it would stop at the
                # damage). A later copy then finds the run there.
                journal = adopt_repaired(taken, path, beside, root, local_id, end)
                report = ShipReport(
                    path=path, local_id=local_id, damaged=damaged_final, via=journal.path
                )
    if beside is None or not _through_sync_journal(path, beside, root):
        probe = Journal.open(path, owner=False)
        try:
            meta = probe.all_meta()
            origin = origin_of(probe.path, meta)
            if origin is not None:
                _refuse_a_live_original(path, origin)
            mine = sync_path(path, meta, root)
            itself = mine is not None and path.absolute() == mine.absolute()
            if origin is not None and is_copy(probe.path, meta, root):
                journal, report, may_crash, why_open = _import_copy(
                    probe, path, origin, root, job_ended
                )
            else:
                # Damage is looked for before anything writes (opening as owner
                # writes): LMDB must never write into a damaged tree, so such a
                # journal is rebuilt from what is intact, the damaged file kept.
                damaged = probe.damage()
                if origin is not None and not itself and not damaged:
                    # An original written before origins were kept beside it.
                    journal, report, may_crash, why_open = _import_copy(
                        probe, path, origin, root, job_ended
                    )
        finally:
            probe.close()
    if journal is None:
        if path.absolute() != (root / path.name).absolute():
            sync_records.refuse_if_shipped(root, path.name)
        journal = Journal.open(path, owner=True, repair=bool(damaged))
        report = ShipReport(path=journal.path, local_id=journal.local_id, damaged=damaged)
    try:
        supply_spec(journal, spec)
        if settings is None:
            settings = journal_settings(journal, base_url=base_url, spec=spec)
        with contextlib.suppress(SpecError):
            run_spec = spec_or_default(journal)
            key = run_spec.run_key
            if (
                key is not None
                and not run_spec.attach_id
                and _closed_by_its_key(journal, key, settings)
            ):
                # Another journal of its key closed the run already: its
                # close-out sends nothing and says how (``Lifecycle``), so
                # nothing is left to wait for (a later copy's entries still
                # ship, into the closed run).
                may_crash, why_open = True, None
            elif key is not None and finished_by is not None:
                # Another attempt of the job finished the run, and closes it.
                may_crash = False
                why_open = f"{finished_by}, of the same run key {key!r}, finishes the run"
            elif key is not None and not job_ended:
                # One journal of several in turn (a requeued job): the one
                # that finishes closes the run; a crashed one cannot know
                # whether another comes after it.
                may_crash = False
                why_open = (
                    f"it is one journal of run key {key!r} and has no finish entry: the "
                    "journal that finishes the run closes it; pass --job-ended once the "
                    "job has ended for good"
                )
        if register_only:
            _register(journal, report, settings, timeout, policy, root)
        else:
            _ship(
                journal,
                report,
                settings,
                timeout,
                progress,
                policy,
                may_crash,
                why_open,
                root,
                hold_close,
            )
    finally:
        journal.close()
    return report


def _closed_by_its_key(journal: Journal, key: str, settings: Settings) -> bool:
    """Whether another journal of run key ``key`` closed the run this one
    ships to (``run_keys.note_closed``): nothing is left for a journal of
    it without a finish entry to wait for."""
    bound = journal.get_meta("platform")
    run_id = bound.get("run_id") if isinstance(bound, dict) else None
    found = None
    with contextlib.suppress(JournalError, OSError):
        found = run_keys.lookup(key, settings.api_root)
    if found is None or "closed_as" not in found:
        return False
    return run_id is None or found["run_id"] == run_id


def _through_sync_journal(path: Path, origin: Origin, root: Path) -> bool:
    """Whether ``path`` ships through its sync journal, decided from the
    origin file without opening it: every journal but the sync journal itself."""
    return path.absolute() != (root / path.name).absolute()


def _refuse_a_live_original(path: Path, origin: Origin) -> None:
    """JournalLockedError, naming the owner, for the original of a journal
    whose producer (or its uplink) still holds it."""
    if origin.is_original(path.absolute()) and origin.producer_state() == "alive":
        owner = read_owner(path)
        who = owner.describe() if owner is not None else origin.describe()
        raise JournalLockedError(
            f"journal {path} is owned by {who}, which is still running", owner=who
        )


def _remember(
    journal: Journal, report: ShipReport, root: Path, *, shipped: bool | None = None
) -> None:
    """Record what a sync journal shipped, beside it (``sync_records``).
    ``shipped``: False before it ships (what it leaves is not known yet,
    when it has records to ship), True once it did (what is left: the
    report's pending records); None says nothing of it.

    A record as it was is not written again (``sync_records.remember``), so
    a pass that has nothing to ship writes none: each pass wrote it twice,
    "shipping" then "nothing left", though nothing was shipped (``sync
    --watch`` over thousands of copies rewrote thousands of files a pass)."""
    if journal.path.parent.absolute() != root.absolute() or report.run_id is None:
        return
    left: dict[str, dict[str, int] | None] = {}
    if shipped:
        left["left"] = dict(report.pending)
    elif shipped is not None:
        kinds = sink_kinds(spec_or_default(journal).kind)
        left["left"] = None if ledger.pending_by_sink(journal, kinds) else {}
    sync_records.remember_shipping(journal, report.run_id, **left)


def _damaged_and_final(
    source: Journal, path: Path, origin: Origin, root: Path, job_ended: bool
) -> list[Damage]:
    """The damage of a copy no sync journal has taken yet and whose producer
    is gone (a scan of every entry: only for such a copy); else none. A
    copy that holds less than its original here is not final, damaged or
    not, whether its job ended or not: a ``cp`` cut short leaves one so (the
    original may hold the finish). Nor is one whose damaged or missing
    entry its original here holds intact (a bit flipped in transfer): the
    original, or a copy taken again, brings it.

    Found from each entry's checksum, nothing decompressed (``damage(decode=False)``):
    decompressing every entry here, and again in the import right after,
    was a tenth of a replay's own CPU. A frame written corrupt, which only
    decompressing finds, is met by the import, which treats it as any
    damage of a final copy (``import_new``): counted lost, or stopped at
    where the original holds it intact."""
    if (root / source.local_id / DATA_NAME).exists():
        return []
    dead = origin.producer_state() == "dead"
    if not (dead or job_ended) or (dead and _stale(origin, source.damaged_end())):
        return []
    damage = source.damage(decode=False)  # the intact entries' seqs not kept: unread here
    seqs = [d.seq for d in damage if d.seq is not None]
    if dead and seqs:
        with contextlib.closing(OriginalHere(origin)) as original:
            if original.holds(seqs):
                return []  # behind its original: imported up to the gap (``_import_copy``)
    return damage


def _import_copy(
    source: Journal, path: Path, origin: Origin | None, root: Path, job_ended: bool
) -> tuple[Journal, ShipReport, bool, str | None]:
    """Import what the copy ``source`` (read from ``path``) holds beyond its
    sync journal; (the sync journal, the report so far, whether a run without
    a finish entry may be closed as crashed, why it is left open otherwise).
    _Shipped when a pruned sync journal shipped all it holds."""
    local_id = source.local_id
    if not (root / local_id / DATA_NAME).exists() and sync_records.nothing_new(
        root, local_id, source.last_seq()
    ):
        record = sync_records.recorded(root, local_id) or {}
        report = ShipReport(path=path, local_id=local_id, run_id=record.get("run_id"))
        raise _Shipped(report, record, root)
    producer = origin.producer_state() if origin is not None else "unknown"
    _refuse_a_live_uplink(source, path, origin, producer, job_ended)
    journal, created = open_sync_journal(source, root)
    # Behind its original here, a copy is not final even once its job ended.
    stale = _stale(origin, source.damaged_end()) if producer == "dead" else None
    final = (producer == "dead" or job_ended) and stale is None
    behind: list[int] = []
    original = OriginalHere(origin if producer == "dead" else None)

    def held_by_original(seq: int) -> bool:
        # Missing or damaged in the copy alike: either is the copy's alone
        # when the original holds the entry intact, and no loss.
        if original.holds([seq]):
            behind.append(seq)
            return True
        return False

    try:
        imported = import_new(source, journal, final=final, held_elsewhere=held_by_original)
        note_copy(journal, path)
    except BaseException:
        journal.close()
        raise
    finally:
        original.close()
    if behind and origin is not None:
        final = False
        seq = behind[0]
        has = f"lacks entry {seq}" if _lacks(source, seq) else f"holds entry {seq} damaged"
        stale = (
            f"the copy {has}, which its original at {origin.path} holds intact: "
            "sync the original, or copy it again"
        )
    if created:
        log.info("prime-runs: %s is a copy; syncing it through %s", path, journal.path)
    report = ShipReport(path=path, local_id=source.local_id, via=journal.path, imported=imported)
    report.damaged = list(imported.passed)
    if final and imported.stopped is not None:
        report.damaged.append(Damage(imported.upto + 1, imported.stopped))
    may_crash = final and imported.stopped is None
    return journal, report, may_crash, stale or _why_left_open(origin, producer, imported)


def _lacks(source: Journal, seq: int) -> bool:
    """Whether the copy ``source`` lacks entry ``seq``, rather than holding
    it damaged (what the report says of it)."""
    try:
        return source.get(seq) is None
    except JournalError:
        return False


def _stale(origin: Origin | None, source_end: int) -> str | None:
    """Why a copy of a journal whose producer is gone from this machine,
    ending at ``source_end``, is older than its original (which is here:
    ``producer_state``), if it is: then the run is not closed from it (the
    original may hold the finish)."""
    if origin is None:
        return None
    try:
        with Journal.open(Path(origin.path), owner=False) as original:
            end = original.last_seq()
    except JournalError:
        return None  # the original cannot be read: the copy is all there is
    if end > source_end:
        return (
            f"the copy holds {source_end} entries and its original at {origin.path} "
            f"{end}: sync the original, or copy it again"
        )
    return None


def _register(
    journal: Journal,
    report: ShipReport,
    settings: Settings,
    timeout: float,
    policy: RetryPolicy | None,
    root: Path,
) -> None:
    """Register the run and record it; nothing shipped, the run left open."""
    uplink = Uplink(journal, settings, policy=policy, log_level=logging.INFO)
    try:
        binding = uplink.lifecycle.register_retrying(deadline=time.monotonic() + timeout)
        report.errors.extend(uplink.errors)
        if binding is None:
            return
        report.run_id, report.url = binding.run_id, binding.url
        report.left_open = "its forked children ship first, then its own records and its close-out"
        _remember(journal, report, root)
    finally:
        uplink.client.close()


def _ship(
    journal: Journal,
    report: ShipReport,
    settings: Settings,
    timeout: float,
    progress: Callable[[Progress], None] | None,
    policy: RetryPolicy | None,
    may_crash: bool,
    why_open: str | None,
    root: Path,
    hold_close: str | None = None,
) -> None:
    uplink = Uplink(journal, settings, policy=policy, log_level=logging.INFO)
    if progress is not None:
        # Shipping has begun: say so (where to, what is left) before a
        # registration that retries for seconds while the platform is down.
        progress(Progress())
    binding = uplink.lifecycle.register_retrying(deadline=time.monotonic() + timeout)
    if binding is None:
        # A platform refusal or one down, or a spec that cannot be registered
        # (one lost to damage): reported (uplink.errors), the journal kept
        # for another try.
        report.errors.extend(uplink.errors)
        with contextlib.suppress(JournalError):
            kinds = sink_kinds(spec_or_default(journal).kind)
            report.pending = ledger.pending_by_sink(journal, kinds)
        if any("spec" in e for e in uplink.errors):
            report.errors.append(
                "the run's spec cannot be read from the journal: pass what it said with "
                "--spec FILE (a JSON object: kind, name, model, environments, ...)"
            )
        uplink.client.close()
        return
    report.run_id, report.url = binding.run_id, binding.url
    _remember(journal, report, root, shipped=False)  # before anything ships: see sync_records
    uplink.start()
    status, error, summary = terminal_state(journal)
    close = (status != "crashed" or may_crash) and hold_close is None
    why_open = hold_close or why_open
    report.status = status if close else "running"
    outcome = uplink.close_out(
        status,
        error,
        summary,
        deadline=time.monotonic() + timeout,
        live=False,
        progress=progress,
        finalize=close,
    )
    if not close and not outcome.finalized:
        report.left_open = why_open or "its producer may still be writing it"
    elif outcome.finalized and report.left_open is None:
        # Its part done, yet nothing it sent closes the run (a rank that is
        # not the primary, a forked child, an attached run that did not
        # complete): said so, not that the run was closed.
        report.left_open = uplink.lifecycle.why_left_open(_closed_as(journal) or status)
    shippers = uplink.shippers
    report.records = sum(s.state.records_sent for s in shippers)
    report.bytes = sum(s.state.bytes_sent for s in shippers)
    report.pending = outcome.pending
    report.finalized = outcome.finalized
    report.status = _closed_as(journal) or report.status
    for shipper in shippers:
        if shipper.state.retired_reason:
            uplink.errors.append(f"{shipper.name} stopped: {shipper.state.retired_reason}")
    report.errors.extend(uplink.errors)
    report.losses = journal.losses()
    _remember(journal, report, root, shipped=True)


def _closed_as(journal: Journal) -> str | None:
    """The status the run was closed out with, if it was (by this command
    or an earlier one: a later copy's finish entry does not change it)."""
    closed = journal.get_meta("finalized")
    status = closed.get("status") if isinstance(closed, dict) else None
    return status if isinstance(status, str) else None


def needs_sync(
    path: Path, meta: Mapping[str, Any], last_seq: int, root: Path | None = None
) -> bool:
    """Whether syncing the copy at ``path`` would do anything: it holds
    entries its sync journal has not imported, or that run is not yet
    shipped and closed out (a run left open is looked at again)."""
    root = root if root is not None else sync_root()
    mine = sync_path(path, meta, root)
    if mine is None:
        return True  # its local id names no folder: syncing it is refused, naming it
    if not (mine / DATA_NAME).exists():
        # Pruned once it shipped and closed: only something new is to sync
        # (and is refused, naming the fix).
        return not sync_records.nothing_new(root, mine.name, last_seq)
    # Its summary, when it did not change since a listing read it: a pass
    # over a runs directory of copies opens only the sync journals that moved.
    sync = journal_info(mine)
    if sync.damage and not sync.meta:
        return True  # it cannot be read: syncing says why
    source = sync.meta.get(K_SOURCE_PATH)
    shipped = sync.meta.get("state") == "shipped" and bool(sync.meta.get("finalized"))
    upto = source.get("imported_upto") if isinstance(source, dict) else None
    return not shipped or not isinstance(upto, int) or last_seq > upto


def _refuse_a_live_uplink(
    copy: Journal, shown: Path, origin: Origin | None, producer: str, job_ended: bool
) -> None:
    """A copy of an online run its uplink may still ship: two shippers of
    one journal would send records twice. Its uplink records how the
    close-out went when it is done; until then, only the user can say."""
    try:
        online = spec_or_default(copy).mode == "online"
    except SpecError:
        online = False
    except JournalCorruptError:
        # Its spec is not JSON: whether it ran online cannot be read, so
        # it may have: refused while its uplink may live, the safe answer
        # (two shippers send records twice); before, a "damaged journal".
        online = True
    if not online or job_ended:
        return
    if copy.get_meta(ledger.K_CLOSEOUT) is not None:
        return  # its uplink closed it out and stopped
    if producer == "unknown":
        where = origin.host if origin else "another host"
        raise JournalLockedError(
            f"{shown} is a copy of an online run whose uplink on {where} may still ship "
            "it; once its job has ended, sync it with --job-ended",
            owner=origin.describe() if origin else None,
        )
    owner = read_owner(copy.path)  # names the uplink that shares the producer's lock
    if producer == "alive" or (owner is not None and owner_alive(owner)):
        raise JournalLockedError(
            f"{shown} is a copy of an online run still shipped by its own uplink "
            f"({owner.describe() if owner else 'another process'}); sync it once that "
            "process has exited",
            owner=owner.describe() if owner else None,
        )


def _why_left_open(origin: Origin | None, producer: str, imported: Imported) -> str:
    if imported.stopped is not None:
        return (
            f"the copy ends early at entry {imported.upto + 1} of {imported.source_end} "
            f"({imported.stopped}): copy it again and sync"
        )
    if producer == "alive":
        who = origin.describe() if origin else "its producer"
        return f"its producer ({who}) is still running; sync a newer copy after it ends"
    host = origin.host if origin else "another host"
    return (
        f"it has no finish entry and its producer ran on {host}, which cannot be checked "
        "from here; sync a newer copy later, or pass --job-ended to close it as crashed"
    )


def spec_from_file(path: Path) -> RunSpec:
    """A run spec from a JSON file (``--spec``): SpecError naming what is wrong."""
    import json

    try:
        value: Mapping[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"--spec {path}: {exc}") from None
    return RunSpec.from_json(value)
