"""Reports on runs, read from their journals: what the CLI and the dashboard show.

Both ``primeruns ls``/``show``/``export`` (``primeruns.commands``) and the
local platform's dashboard (``primeruns.local.dashboard``) read journals the
same way: a run's state (running, shipped, offline, finished, crashed),
what each sink has left, a journal's records page by page, and its metric
curves. That shared reading lives here, below both, so neither imports the
other. Journals are opened read-only (no lock): every report works while
the run is live. Damaged entries are collected, never raised: the caller
reports them and goes on with what is intact.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .exceptions import JournalCorruptError, JournalError
from .journal import Damage, Entry, EntryKind, JournalInfo, journal_info, list_journals
from .journal.by_kind import seqs_of
from .journal.meta import unreadable
from .journal.origin import Origin
from .journal.types import K_SKIPPED, as_count, skipped_within
from .models import CRASH_ERROR, RUN_KIND, RunKind
from .ship.copies import (
    K_SOURCE_LOSSES,
    K_SOURCE_PATH,
    check_sync_root,
    is_copy,
    origin_of,
    sync_name,
    sync_names,
    sync_root,
    uncarried,
)
from .sinks.kinds import records_left, sink_kinds
from .spec import SPEC_KEY, RunSpec, listed_spec

if TYPE_CHECKING:
    from .journal.journal import Journal

__all__ = [
    "CRASH_ERROR",
    "KIND_NAMES",
    "NOT_OPENED",
    "RECORD_KINDS",
    "UNIT_LABELS",
    "UNKNOWN_SINKS",
    "CurveFields",
    "RunStatus",
    "describe",
    "iter_entries",
    "iter_rows",
    "load_rows",
    "metric_curves",
    "pending_per_sink",
    "sample_rows",
    "spec_damaged",
    "statuses",
    "unit_of",
]


# The record kinds a user logs: by their names in JSON, and as a sentence says them.
RECORD_KINDS = {
    "episodes": EntryKind.EPISODE,
    "traces": EntryKind.TRACE,
    "metrics": EntryKind.METRICS,
}
_LOGGED = frozenset(RECORD_KINDS.values())
UNIT_LABELS = {
    EntryKind.EPISODE: "episodes",
    EntryKind.TRACE: "traces",
    EntryKind.METRICS: "metric rows",
}


def unit_of(kinds: Collection[EntryKind], logged: Mapping[str, int]) -> str:
    """What a sink shipping ``kinds`` counts, in words: the one kind of them
    the run logged, else plain records."""
    names = [name for name, kind in RECORD_KINDS.items() if kind in kinds and logged.get(name)]
    return UNIT_LABELS[RECORD_KINDS[names[0]]] if len(names) == 1 else "records"


def pending_per_sink(
    info: JournalInfo, spec: RunSpec | Literal[False] | None = False
) -> dict[str, int | str]:
    """Per sink of the run, the records it has still to ship, or ``"off"``
    (counted when ``info`` comes from a listing with ``tally=True``).
    ``spec``: the run's, when the caller read it already."""
    out: dict[str, int | str] = {}
    if spec is False:
        spec = listed_spec(info.meta)
    if spec is None and spec_damaged(info.meta):
        # Which sinks the run has is the spec's to say: read with the
        # defaults, a training run's records were counted against an
        # evaluation's. What no sink of it acknowledged is still to ship.
        # Its sinks are those it holds an offset of, and those whose standing
        # their shippers recorded: one whose offset cannot be read (left out
        # of ``cursors``) acknowledged nothing, as with a readable spec, and
        # one turned off for good is owed nothing.
        named = set(info.cursors) | {
            key[len(_STANDING) :] for key in info.meta if key.startswith(_STANDING)
        }
        owed = (s for s in named if not info.meta.get(f"sink_off.{s}"))
        acked = min((as_count(info.cursors.get(s)) or 0 for s in owed), default=0)
        if acked in info.after:  # the records a user logs, whatever their sinks
            return {UNKNOWN_SINKS: records_left(info.after[acked], _LOGGED)}
        skipped = skipped_within(info.meta.get(K_SKIPPED), acked, info.last_seq)
        return {UNKNOWN_SINKS: max(0, info.last_seq - acked - skipped)}
    for sink, kinds in sink_kinds(_sink_kind(spec)).items():
        if info.meta.get(f"sink_off.{sink}"):
            out[sink] = "off"
            continue
        acked = int(info.cursors.get(sink, 0))
        if acked in info.after:
            out[sink] = records_left(info.after[acked], kinds)
        else:  # not counted (no tally, or it failed): every entry past the offset
            skipped = skipped_within(info.meta.get(K_SKIPPED), acked, info.last_seq)
            out[sink] = max(0, info.last_seq - acked - skipped)
    return out


def _sink_kind(spec: RunSpec | None) -> RunKind:
    return spec.kind if spec is not None else RUN_KIND


# Meta: a sink's standing, recorded by its shipper (``ship.ledger``'s
# prefix, not imported: that module loads the HTTP client, which a listing
# never does).
_STANDING = "sink_state."

# The state, outcome and shipping of a journal that was not opened
# (``JournalInfo.not_opened``): a link in the runs directory, another user's
# folder. Not damage: nothing of it was read, and no command goes into it.
NOT_OPENED = "not opened"

# ``pending``'s key for a journal whose spec is damaged: its run's sinks are
# not known, nor so what each has left.
UNKNOWN_SINKS = "sinks unknown (spec damaged)"


def spec_damaged(meta: Mapping[str, Any]) -> bool:
    """Whether the journal whose meta values are ``meta`` holds a spec that
    cannot be read (not JSON, of another shape, or ``{}`` naming no kind):
    ``sync`` and ``replay`` ship it only given the run's spec (``--spec
    FILE``). A journal with no spec at all (one rebuilt after damage) is not one."""
    return _holds_spec(meta) and listed_spec(meta) is None


def _holds_spec(meta: Mapping[str, Any]) -> bool:
    """Whether the journal holds a spec, readable or not: one that is not
    JSON is left out of a listing's meta and named unreadable there (read as
    none, it was counted against an evaluation's sinks and said nothing)."""
    return meta.get(SPEC_KEY) is not None or unreadable(meta, SPEC_KEY)


@dataclass(frozen=True)
class RunStatus:
    """One journal as the commands see it."""

    info: JournalInfo
    state: str  # running | shipped | offline | finished | crashed | unknown | not opened
    finish: dict[str, Any] | None
    pending: dict[str, int | str]
    elsewhere: str | None = None
    """The host its producer ran on, when that is another machine and the
    journal has no finish entry: whether it still runs cannot be told here."""
    synced: RunStatus | None = None
    """For a copy: its sync journal's status (what ``sync`` shipped from it)."""
    unimported: int = 0
    """For a copy: entries it holds that its sync journal has not imported."""

    @cached_property
    def spec(self) -> RunSpec | None:
        """The run's spec; None when the journal has none or it is damaged."""
        return listed_spec(self.info.meta)

    @property
    def spec_damaged(self) -> bool:
        """Its spec cannot be read (``spec_damaged``): shipped only with
        ``--spec FILE``. A copy's is its sync journal's, which ships it (and
        whose spec it reads where its own is damaged: ``describe``)."""
        # (Its spec as read once, cached: a listing of thousands reads each.)
        if self.synced is not None:
            return self.spec is None and self.synced.spec_damaged
        return self.spec is None and _holds_spec(self.info.meta)

    @property
    def kind(self) -> RunKind:
        """The kind its sinks are those of (an evaluation's without a spec)."""
        return _sink_kind(self.spec)

    @property
    def opened_offline(self) -> bool:
        """Opened as an offline run (``primeruns sync`` ships it)."""
        return self.spec is not None and self.spec.mode == "offline"

    @property
    def shipping_meta(self) -> dict[str, Any]:
        """The meta that says how it shipped: its sync journal's, if it has one."""
        return self.synced.info.meta if self.synced is not None else self.info.meta

    @property
    def platform(self) -> dict[str, Any]:
        bound = self.shipping_meta.get("platform")
        return bound if isinstance(bound, dict) else {}

    @property
    def finalized(self) -> dict[str, Any] | None:
        value = self.shipping_meta.get("finalized")
        return value if isinstance(value, dict) else None

    @property
    def pending_total(self) -> int:
        return sum(v for v in self.pending.values() if isinstance(v, int))

    @property
    def needs_shipping(self) -> bool:
        """What replay/sync would do something for: not closed out or not all shipped."""
        return self.state not in ("running", "shipped")

    @cached_property
    def counts(self) -> dict[str, int]:
        """What the run logged, in the user's units (episodes, traces, metric
        rows). Kept: a listing reads it for the line and for its run's totals."""
        logged = self.info.after.get(0, Counter())
        return {name: logged[int(kind)] for name, kind in RECORD_KINDS.items()}

    @property
    def losses(self) -> dict[str, dict[str, Any]]:
        """Per sink, the records counted lost (``count``) and why
        (``reasons``). For a copy, its sync journal's, which ships it: what
        the copy's producer counted, carried over as it is imported
        (``mirror._carry_losses``), and what the sync counted (damage it
        passed over, records the platform rejected); and what the copy
        counted since its last import. The copy's own alone left out every
        record its sync counted lost, beside a sync journal's ``shipped``."""
        own = {sink: _loss(value) for sink, value in self.info.losses.items()}
        if self.synced is None:
            return own
        merged = {sink: _loss(value) for sink, value in self.synced.info.losses.items()}
        counted = {sink: loss["count"] for sink, loss in own.items()}
        carried = self.synced.info.meta.get(K_SOURCE_LOSSES)
        for sink, more in uncarried(counted, carried).items():
            loss = own[sink]
            into = merged.setdefault(sink, {"count": 0, "reasons": []})
            into["count"] += more
            into["reasons"] += [r for r in loss["reasons"] if r not in into["reasons"]]
        return merged

    @property
    def losses_total(self) -> int:
        return sum(loss["count"] for loss in self.losses.values())

    @property
    def outcome(self) -> str:
        """How the run ended: running, completed, failed, or crashed (no finish
        entry), whatever became of its shipping; or not opened (a link, another
        user's folder: ``JournalInfo.not_opened``), which no damage of its is."""
        if self.info.not_opened is not None:
            return NOT_OPENED
        if self.info.owner_alive and self.elsewhere is None:
            return "running"
        if self.finish is None:
            if self.elsewhere is not None:
                return "unknown"
            return "damaged" if self.info.damage and not self.info.meta else "crashed"
        return str(self.finish.get("status") or "failed")

    @property
    def shipping(self) -> str:
        """Where its shipping stands: shipped, N pending, offline (never synced),
        not closed out, live (its uplink ships now), damaged, or not opened."""
        if self.info.not_opened is not None:
            return NOT_OPENED
        if self.info.damage and not self.info.meta:
            return "damaged"
        if self.synced is not None:
            if self.unimported:
                return f"{self.unimported} to sync"
            return self.synced.shipping
        if self.opened_offline and not self.platform:
            return "offline"
        if self.info.owner_alive and self.elsewhere is None:
            return "live"
        if self.spec_damaged and (self.pending_total or not self.finalized):
            return "spec damaged"
        if self.pending_total:
            # Sinks ship the same episodes: the most any sink has left, not the sum.
            return f"{max(v for v in self.pending.values() if isinstance(v, int))} pending"
        return "shipped" if self.finalized else "not closed out"

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.info.modified) if self.info.modified else 0.0


def _loss(value: object) -> dict[str, Any]:
    """One sink's loss as a journal's meta holds it (untrusted: a copy is
    another machine's file), as ``{"count": int, "reasons": [str]}``: a count
    that is none (``as_count``) is 0, named as damage by its reader
    (``losses_in``)."""
    count = value.get("count") if isinstance(value, dict) else None
    reasons = value.get("reasons") if isinstance(value, dict) else None
    return {
        "count": as_count(count) or 0,
        "reasons": [str(r) for r in reasons] if isinstance(reasons, list) else [],
    }


def describe(
    info: JournalInfo, root: Path | None = None, in_root: Collection[str] | None = None
) -> RunStatus:
    """Derive a journal's state: running while its owner lives; shipped once it
    is closed out on the platform with nothing pending; offline for an offline
    run not yet synced; else finished (it has a finish entry), crashed, or
    unknown (no finish entry, and its producer ran on another machine). A copy
    (a journal away from where it was written) is shipped through its sync
    journal, whose state it reports. ``root``: where sync journals are
    (``sync_root()``, looked up once by a caller describing many), and
    ``in_root`` the names in it (``sync_names``, listed once so). One not
    opened (``JournalInfo.not_opened``) is that alone: nothing in its folder
    is read (its lock file, through a link, named a "crashed" run)."""
    if info.not_opened is not None:
        return RunStatus(info=info, state=NOT_OPENED, finish=None, pending={})
    origin = origin_of(info.path, info.meta)
    remote = origin.host if origin is not None and not origin.on_this_host else None
    live = info.owner_alive and remote is None
    finish = None if live else info.finish
    root = sync_root() if root is None else root
    synced, unimported = _sync_journal_status(info, root, in_root, origin)
    spec = listed_spec(info.meta)  # once: a listing of thousands of runs reads each
    if spec is None and synced is not None:
        # A copy's own spec damaged (a bad disk, a copy gone wrong) while its
        # sync journal's, which ships it, reads: that one says its sinks
        # (read as none, ``show`` listed an evaluation's for any run).
        spec = synced.spec
    pending = synced.pending if synced is not None else pending_per_sink(info, spec)
    total = sum(v for v in pending.values() if isinstance(v, int))
    meta = synced.info.meta if synced is not None else info.meta
    if live:
        state = "running"
    elif meta.get("finalized") and total == 0 and not unimported:
        state = "shipped"
    elif spec is not None and spec.mode == "offline" and not meta.get("platform"):
        state = "offline"
    elif finish is not None:
        state = "finished"
    elif remote is not None:
        state = "unknown"
    else:
        state = "crashed"
    status = RunStatus(
        info=info,
        state=state,
        finish=finish,
        pending=pending,
        elsewhere=remote if finish is None else None,
        synced=synced,
        unimported=unimported,
    )
    status.__dict__["spec"] = spec  # the cached property, read already
    return status


def _sync_journal_status(
    info: JournalInfo, root: Path, in_root: Collection[str] | None, origin: Origin | None
) -> tuple[RunStatus | None, int]:
    """A copy's sync journal, described, and how many of the copy's entries
    it has yet to import; (None, 0) for a journal shipped where it is.
    ``origin``: the journal's (``origin_of``)."""
    if not info.meta or not is_copy(info.path, info.meta, root, in_root=in_root, origin=origin):
        return None, 0
    name = sync_name(info.path, info.meta)  # (None: its local id names no folder)
    if name is None or (in_root is not None and name not in in_root):
        # No sync journal (the root's names were listed once): nothing to
        # check or ``stat`` (a listing of thousands of copies checked the
        # root's folders again for each, a fifth of its time), nor a path
        # to make (``sync_path``'s join, a listing's cost per copy).
        return None, 0
    path = root / name
    try:
        check_sync_root(root)  # (a root another user could write into holds none of ours)
    except JournalError:
        return None, 0
    if not path.is_dir():
        return None, 0
    synced = describe(journal_info(path, tally=True), root)
    source = synced.info.meta.get(K_SOURCE_PATH)
    upto = source.get("imported_upto") if isinstance(source, dict) else None
    imported = upto if isinstance(upto, int) else 0
    return synced, max(0, info.last_seq - imported)


def statuses(runs_dir: Path, *, rows: bool = False) -> list[RunStatus]:
    """``describe`` of every journal under ``runs_dir``. ``rows``: the
    caller reads no meta value of a status's journal but those ``describe``
    reads (``list_journals``' ``rows``: ``primeruns ls``)."""
    root = sync_root()
    listed = list_journals(runs_dir, tally=True, rows=rows)
    in_root = sync_names(root)  # after the listing: a sync journal made meanwhile is seen
    return [describe(info, root, in_root) for info in listed]


# What ``export --kind`` names, and the entry kinds each means.
KIND_NAMES: dict[str, frozenset[EntryKind]] = {
    "episodes": frozenset({EntryKind.EPISODE}),
    "traces": frozenset({EntryKind.TRACE}),
    "metrics": frozenset({EntryKind.METRICS}),
}


def iter_entries(
    journal: Journal,
    kinds: Collection[EntryKind],
    damage: list[Damage],
    max_entry_bytes: int | None = None,
) -> Iterator[Entry]:
    """Every intact entry of ``kinds``, ascending; damage met is appended to
    ``damage``, and so is each entry declaring more than ``max_entry_bytes``
    (not decompressed: :func:`too_large`)."""
    after = 0
    while True:
        result = journal.read(
            after,
            kinds=kinds,
            max_entries=1000,
            max_bytes=32 << 20,
            max_entry_bytes=max_entry_bytes,
        )
        damage.extend(result.damaged)
        if max_entry_bytes is not None:
            damage.extend(
                too_large(seq, size, max_entry_bytes) for seq, _, size in result.oversized
            )
        yield from result.entries
        if result.next_after <= after:
            return
        after = result.next_after


def _decoded(payload: bytes) -> Any:
    """The JSON value of an entry; ValueError for JSON nested past the
    decoder's limit too, which ``json`` raises as RecursionError (a journal is
    untrusted: a few hundred KB of brackets must be damage, not a traceback)."""
    try:
        return json.loads(payload)
    except RecursionError:
        raise ValueError("JSON nested past the decoder's limit") from None


def too_large(seq: int, size: int, limit: int) -> Damage:
    return Damage(
        seq, f"entry {seq} holds {size} bytes, over the {limit} bytes read of a row: not read"
    )


#: What a reader keeps of each row it loads (``load_rows``): the row itself
#: by default; a reader that shows a few fields of many rows keeps just those,
#: so that a row's size is paid once, while it is decoded, not kept.
Keep = Callable[[dict[str, Any]], dict[str, Any]]


def load_rows(
    journal: Journal,
    kinds: Collection[EntryKind],
    damage: list[Damage],
    *,
    max_entry_bytes: int | None = None,
    keep: Keep | None = None,
) -> list[dict[str, Any]]:
    """The JSON objects of every intact entry of ``kinds`` (what ``keep`` keeps
    of each); one declaring more than ``max_entry_bytes`` is named in
    ``damage``, not read."""
    rows = iter_rows(journal, kinds, damage, max_entry_bytes=max_entry_bytes)
    return [row for _, row in rows] if keep is None else [keep(row) for _, row in rows]


def iter_rows(
    journal: Journal,
    kinds: Collection[EntryKind],
    damage: list[Damage],
    *,
    max_entry_bytes: int | None = None,
) -> Iterator[tuple[Entry, dict[str, Any]]]:
    """``load_rows`` one at a time, each with its entry: a reader that writes
    rows out as it goes holds one chunk of entries, not the run."""
    for entry in iter_entries(journal, kinds, damage, max_entry_bytes):
        try:
            value = _decoded(entry.payload)
        except ValueError as exc:
            damage.append(Damage(entry.seq, f"entry {entry.seq}: not JSON: {exc}"))
            continue
        if isinstance(value, dict):
            yield entry, value


def sample_rows(
    journal: Journal,
    kind: EntryKind,
    most: int,
    damage: list[Damage],
    seqs: Sequence[int] | None = None,
    *,
    max_entry_bytes: int | None = None,
    keep: Keep | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """At most ``most`` (at least 2) JSON objects of ``kind``, and how many
    entries of it the journal holds (by header). Up to ``most`` entries every
    one is read (``load_rows``); past that, ``most`` evenly spaced over them,
    the first and last always, so what is read is bounded whatever the run's
    length. An unreadable sampled entry is passed over (the damage scan
    names it) and said in ``damage``. ``seqs``: the kind's seqs when a scan
    found them already. ``max_entry_bytes`` and ``keep`` as ``load_rows``."""
    seqs = seqs_of(journal, kind) if seqs is None else seqs
    total = len(seqs)
    if total <= most:
        return load_rows(journal, {kind}, damage, max_entry_bytes=max_entry_bytes, keep=keep), total
    rows: list[dict[str, Any]] = []
    for seq in sorted({seqs[round(i * (total - 1) / (most - 1))] for i in range(most)}):
        try:
            if max_entry_bytes is None:
                entry = journal.get(seq)
            else:
                read = journal.read(
                    seq - 1, kinds={kind}, max_entries=1, max_entry_bytes=max_entry_bytes
                )
                if read.oversized and read.oversized[0][0] == seq:
                    damage.append(too_large(seq, read.oversized[0][2], max_entry_bytes))
                    continue
                entry = next((e for e in read.entries if e.seq == seq), None)
            value = _decoded(entry.payload) if entry is not None else None
        except (JournalCorruptError, ValueError) as exc:
            damage.append(Damage(seq, f"entry {seq}: unreadable: {exc}"))
            continue
        if isinstance(value, dict):
            rows.append(value if keep is None else keep(value))
    return rows, total


#: Distinct metrics :class:`CurveFields` keeps the values of.
MAX_CURVES = 1_000


class CurveFields:
    """What ``metric_curves`` draws of a row, kept as the row is read (a
    ``Keep``): its step and its numbers, of at most ``MAX_CURVES`` distinct
    metrics (names past them are left out). A journal is untrusted: 20 rows of
    a 128 MiB string each, packed into 412 KB on disk, held 2.9 GB in ``show``
    when kept whole, and a row of thousands of names costs a curve each."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, value in row.items():
            if key.startswith("_") or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if key != "step" and key not in self.names:
                if len(self.names) >= MAX_CURVES:
                    continue
                self.names.add(key)
            kept[key] = value
        return kept


def _as_float(value: float) -> float:
    """``value`` as a float; an integer past the floats (JSON has no bound on
    digits) as the infinity of its sign, not an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def metric_curves(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per numeric metric, its ``(step, value)`` points in step order."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for index, row in enumerate(rows):
        step = row.get("step")
        # A step that is no finite number (``Infinity``, ``NaN``: JSON as
        # Python reads it) has no integer: the row is drawn at its place.
        at = index
        if isinstance(step, int) and not isinstance(step, bool):
            at = step
        elif isinstance(step, float) and math.isfinite(step):
            at = int(step)
        for key, value in row.items():
            if key == "step" or key.startswith("_") or isinstance(value, bool):
                continue
            if isinstance(value, int | float):
                curves.setdefault(key, []).append((at, _as_float(value)))
    for points in curves.values():
        points.sort(key=lambda p: p[0])
    return curves
