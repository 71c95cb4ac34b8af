"""``primeruns replay`` and ``primeruns sync``: ship journals on disk to the platform.

Both are thin commands over :func:`primeruns.ship.backlog.ship_journal`, the same
shippers a live run uses: take ownership (refused, naming the owner, while it
lives), register the run if it never was, ship every unacknowledged record,
and close the run out (as crashed when it has no finish entry). ``replay`` is
for crashed or interrupted online runs, ``sync`` for offline ones; either
takes explicit runs. Exit codes: 0 everything shipped and closed out, 1 not
(the reason is printed), 2 no such run, 3 the owner lives, 4 the journal is
damaged (what was intact was shipped, the rest is reported).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from ..exceptions import JournalCorruptError, JournalError, JournalLockedError
from ..journal import Journal, journal_info
from ..journal.listing import finishes, journal_dirs
from ..journal.meta import K_LOCAL_ID
from ..journal.origin import Origin
from ..platform import Settings, resolve_settings
from ..reports import RunStatus, describe, statuses, unit_of
from ..settings import resolve_sdk_settings
from ..ship import resident
from ..ship.backlog import ShipReport, is_copy, needs_sync, ship_journal, spec_from_file
from ..ship.copies import check_sync_root
from ..ship.factory import sink_kinds
from ..ship.family import K_FORK_PARENT, children_of, finds_its_run
from ..ship.mirror import fingerprint, snapshot, sync_root
from ..ship.policy import RetryPolicy
from ..ship.standby import pause
from ..ship.uplink import journal_settings
from ..spec import RunSpec, SpecError
from . import close_order
from .close_order import Listed
from .common import (
    EXIT_DAMAGED,
    EXIT_FAILED,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    add_json,
    add_runs_dir,
    inert_errors,
    resolve_run,
    runs_dir_of,
    seconds_arg,
    timeout_arg,
)
from .console import emit_json, human_bytes, inert, inert_text, make_console
from .progress import ShipProgress

__all__ = ["add_parser", "describe_plan", "replay_one"]

_MAX_DAMAGE_LINES = 5
Fingerprint = tuple[tuple[str, int, int], ...]


def _status_of(path: Path) -> RunStatus:
    return describe(journal_info(path, tally=True))


def shipping_plan(status: RunStatus, settings: Settings) -> dict[str, tuple[int, str]]:
    """Per sink that will ship (not off, not opted out), the records it has
    left to ship and what they are."""
    plan: dict[str, tuple[int, str]] = {}
    for sink, kinds in sink_kinds(status.kind).items():
        pending = status.pending.get(sink)
        if not isinstance(pending, int) or (sink == "traces" and settings.traces_opt_out):
            continue
        plan[sink] = (pending, unit_of(kinds, status.counts))
    return plan


def describe_plan(status: RunStatus, held: str | None = None) -> list[str]:
    """What shipping this journal would do, in plain sentences (``--dry-run``).
    ``held``: why its run's close-out would wait (``_held_by``)."""
    lines: list[str] = []
    if status.state == "running" and status.synced is None:
        return [f"refused: owned by {status.info.owner}, which is still running"]
    if not status.platform:
        lines.append("would register the run on the platform (it never was)")
    pending = {k: v for k, v in status.pending.items() if isinstance(v, int) and v > 0}
    if pending:
        parts = ", ".join(f"{v} to {k}" for k, v in pending.items())
        lines.append(f"would ship pending records: {parts}")
    else:
        lines.append("nothing pending to ship")
    if status.finalized:
        lines.append(f"already closed out as {status.finalized.get('status')}: left as it is")
    elif held is not None:
        lines.append(f"would leave the run open: {held}")
    elif status.finish is not None:
        lines.append(f"would close it out as {status.finish.get('status')} (its finish entry)")
    else:
        lines.append("would close it out as failed: crashed (no finish entry)")
    if status.info.damage:
        lines.append(f"journal damage: {len(status.info.damage)} problem(s) (see primeruns show)")
    return lines


def report_json(report: ShipReport, code: int) -> dict[str, Any]:
    return {
        "path": str(report.path),
        "local_id": report.local_id,
        "run_id": report.run_id,
        "url": report.url,
        "status": report.status,
        "ok": report.ok,
        "exit_code": code,
        "records": report.records,
        "bytes": report.bytes,
        "pending": report.pending,
        "closed_out": report.finalized,
        "left_open": report.left_open,
        "shipped_before": report.shipped_before,
        "synced_through": str(report.via) if report.via else None,
        "losses": report.losses,
        "damage": [d.what for d in report.damaged],
        "errors": report.errors,
    }


def _exit_code(report: ShipReport) -> int:
    # Damage decides first: every command says 4 for a damaged journal.
    if report.damaged:
        return EXIT_DAMAGED
    return EXIT_OK if report.ok else EXIT_FAILED


def _report(
    report: ShipReport,
    plan: dict[str, tuple[int, str]],
    console: Console,
    *,
    registered_only: bool = False,
) -> None:
    where = inert(report.url or report.run_id or "not registered")
    if report.damaged:
        console.print(
            Text(
                f"  damaged: {len(report.damaged)} problem(s); intact entries were shipped",
                style="red",
            )
        )
        for d in report.damaged[:_MAX_DAMAGE_LINES]:
            console.print(inert_text(f"    - {d.what}"))
        if len(report.damaged) > _MAX_DAMAGE_LINES:
            console.print(Text(f"    ... and {len(report.damaged) - _MAX_DAMAGE_LINES} more"))
    for sink, loss in report.losses.items():
        reasons = "; ".join(loss.get("reasons") or []) or "no reason recorded"
        console.print(inert_text(f"  lost {loss.get('count', 0)} for {sink}: {reasons}", "yellow"))
    for error in report.errors:
        console.print(inert_text(f"  error: {error}", style="red"))
    if report.ok and registered_only:
        console.print(Text(f"  registered: {where}", style="green"))
        console.print(inert_text(f"  left open: {report.left_open}"))
        return
    if report.ok and report.shipped_before is not None:
        line = Text("  done", style="green")
        line.append(f": nothing sent: {inert(report.shipped_before)}: {where}")
        console.print(line)
        return
    if report.ok:
        line = Text("  done", style="green")
        shipped = ", ".join(f"{n} {unit} to {sink}" for sink, (n, unit) in plan.items() if n)
        if not shipped:
            shipped = (
                f"{report.records} record(s)" if report.records else "nothing was left to ship"
            )
        if report.left_open is not None:
            line.append(f": {shipped} ({human_bytes(report.bytes)}); the run is left open: {where}")
            console.print(line)
            console.print(inert_text(f"  left open because {report.left_open}", "yellow"))
            return
        line.append(
            f": {shipped} ({human_bytes(report.bytes)}); "
            f"run closed out as {inert(report.status)}: {where}"
        )
        console.print(line)
        return
    if report.pending:
        parts = inert(", ".join(f"{k} {v}" for k, v in report.pending.items()))
        line = Text(f"  incomplete: still pending {parts}", style="red")
    else:
        line = Text("  incomplete: the run could not be closed out", style="red")
    line.append(f" ({where})")
    console.print(line)
    console.print(
        Text("  the journal keeps everything not shipped: run the command again to retry")
    )


class _NotShipped(Exception):
    """Why a journal was not shipped at all, with the exit code it deserves."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def not_shipped_json(path: Path, code: int, error: str) -> dict[str, Any]:
    return {
        "path": str(path),
        "local_id": path.name,
        "ok": False,
        "exit_code": code,
        "error": error,
    }


@dataclass(frozen=True)
class ShipOptions:
    """What the command line says about shipping, the same for every run."""

    base_url: str | None = None
    timeout: float = 3600.0
    policy: RetryPolicy | None = None
    job_ended: bool = False
    spec: RunSpec | None = None


def _ship(
    path: Path,
    options: ShipOptions,
    stream: TextIO,
    register_only: bool,
    hold_close: str | None = None,
    finished_by: str | None = None,
) -> tuple[ShipReport, dict[str, tuple[int, str]]]:
    """Ship one journal (or only register its run) with progress bars on
    ``stream``; _NotShipped if it cannot start."""
    origin = Origin.read_beside(path)
    settings: Settings | None = None
    if origin is not None and not origin.is_original(path.absolute()):
        # A copy is not opened here (see ship.mirror.snapshot): its settings
        # come from its sync journal, the key from this environment.
        api_key = resolve_settings(base_url=options.base_url).api_key
        plan: dict[str, tuple[int, str]] = {}
        where = "its sync journal"
    else:
        try:
            with Journal.open(path, owner=False) as journal:
                settings = journal_settings(journal, base_url=options.base_url, spec=options.spec)
        except JournalCorruptError as exc:
            if options.spec is None and _status_of(path).spec_damaged:
                # Named alone (sync or replay of it), it said "damaged
                # journal: meta key 'spec' ... unreadable", and not what ships it.
                raise _NotShipped(
                    f"its spec cannot be read (damaged in the journal {path}); primeruns show "
                    f"{path} says what is left of it; with the run's spec in a file, --spec "
                    "FILE ships it (a JSON object: kind, name, model, environments, ...)",
                    EXIT_DAMAGED,
                ) from None
            raise _NotShipped(f"damaged journal: {exc}", EXIT_DAMAGED) from None
        except JournalError as exc:
            raise _NotShipped(str(exc), EXIT_USAGE) from None
        api_key = settings.api_key
        plan = {} if register_only else shipping_plan(_status_of(path), settings)
        where = settings.api_root
    if not api_key:
        raise _NotShipped(
            "no API key: set PRIME_API_KEY (or api_key in ~/.prime/config.json) to ship runs",
            EXIT_USAGE,
        )
    head = inert_text(path.name, style="bold")
    head.append(f" -> {inert(where)}")
    # The head and bars are drawn once shipping begins: a refusal comes first.
    bars = ShipProgress(
        stream,
        {sink: total for sink, (total, _) in plan.items()},
        {sink: unit for sink, (_, unit) in plan.items()},
        head,
    )
    try:
        try:
            report = ship_journal(
                path,
                settings=settings,
                timeout=options.timeout,
                progress=bars,
                policy=options.policy,
                job_ended=options.job_ended,
                spec=options.spec,
                base_url=options.base_url,
                register_only=register_only,
                hold_close=hold_close,
                finished_by=finished_by,
            )
            bars.finish(report.pending)
        except BaseException:
            # The bars of a shipment that raised stop, and stopping them never
            # replaces what ended it: a Ctrl-C landing inside rich's
            # Live.start leaves it half started, and its stop then raises
            # IndexError, which would turn the interruption into a failure.
            with contextlib.suppress(Exception):
                bars.done()
            raise
    except JournalLockedError as exc:
        raise _NotShipped(f"refused: {exc}", EXIT_LOCKED) from None
    except JournalCorruptError as exc:
        raise _NotShipped(f"damaged journal: {exc}", EXIT_DAMAGED) from None
    except SpecError as exc:  # (a bound run's: its registration did not read it)
        raise _NotShipped(f"{exc}: pass the run's spec with --spec FILE", EXIT_USAGE) from None
    except JournalError as exc:
        raise _NotShipped(str(exc), EXIT_USAGE) from None
    return report, plan


def replay_one(
    path: Path,
    *,
    base_url: str | None = None,
    timeout: float = 3600.0,
    out: TextIO | None = None,
    err: TextIO | None = None,
    results: list[dict[str, Any]] | None = None,
    options: ShipOptions | None = None,
    register_only: bool = False,
    hold_close: str | None = None,
    finished_by: str | None = None,
) -> int:
    """Ship one journal and close its run out when that is right, printing
    progress and the result. ``register_only``: only register its run (its
    forked children ship next, then it, see ``_Step``). ``hold_close``:
    ship it but leave its run open, for this reason. ``finished_by``: the
    journal of its run key that finishes the run (``_Step``).

    Returns the exit code (see the module doc); never raises for a locked,
    damaged or unreachable case. With ``results`` given, the outcome is
    appended there as a JSON object, whatever it was, and only progress is
    printed (to ``err``). ``options`` (else ``base_url`` and ``timeout``):
    what the command line said.
    """
    options = options or ShipOptions(base_url=base_url, timeout=timeout)
    out = out or sys.stdout
    err = err or sys.stderr
    stream = err if results is not None else out
    try:
        report, plan = _ship(path, options, stream, register_only, hold_close, finished_by)
    except _NotShipped as exc:
        err.write(f"{inert(path)}: {inert(exc)}\n")
        if results is not None:
            results.append(not_shipped_json(path, exc.code, str(exc)))
        return exc.code
    code = _exit_code(report)
    if hold_close is not None and not report.finalized:
        code = max(code, EXIT_FAILED)  # not everything is shipped and closed out
    if results is not None:
        results.append(report_json(report, code))
    else:
        _report(report, plan, make_console(out), registered_only=register_only)
    return code


@dataclass(frozen=True)
class _Step:
    """One journal to ship, or with ``register_only`` only its run to
    register: a run whose forked children cannot find it (it was never
    registered) is registered first, its children shipped next, then the
    run itself, whose close-out closes it after every record of it landed
    (as its live ``finish()`` waits for its children)."""

    path: Path
    register_only: bool = False
    waits_for: tuple[str, ...] = ()
    """Forked children of its run passed over (still being written, say):
    its close-out waits for them."""
    finished_by: str | None = None
    """The journal of its run key that holds the run's finish entry, shipped
    after it: this one, without one, leaves the run open (``close_order``)."""


def _targets(args: argparse.Namespace, *, offline: bool) -> list[_Step]:
    """The runs named, or with ``--all`` every run that needs shipping:
    ``replay`` takes online runs where they were written, ``sync`` offline
    runs and every copy (a journal away from where it was written). Each
    journal ``--all`` passes over with something left to ship is named, and
    why, on stderr."""
    runs_dir = runs_dir_of(args)
    if args.runs:
        return _named([resolve_run(ref, runs_dir) for ref in args.runs], offline=offline)
    if not args.all and not offline:
        raise CommandError("name the runs to replay, or pass --all")
    root = sync_root()
    found = _Sorting()
    for status in statuses(runs_dir):
        why = found.add(status, root, offline=offline)
        if why:
            print(inert(f"{status.info.path.name}: skipped: {why}"), file=sys.stderr)
    if found.shipped and not args.json:
        print(
            f"{found.shipped} journal(s) already shipped and closed out: skipped", file=sys.stderr
        )
    return found.steps()


@dataclass
class _Sorting:
    """Journals sorted out for a pass of ``--all`` or ``--watch``: those it
    ships (``chosen``), forked children among them, and the children it
    passes over with something left to ship (``passed_over``, by their run's
    local id), for whose records their run's close-out waits."""

    chosen: list[Path] = field(default_factory=list)
    listed: list[RunStatus] = field(default_factory=list)  # every original looked at
    children: set[Path] = field(default_factory=set)
    passed_over: dict[str, list[str]] = field(default_factory=dict)
    shipped: int = 0  # passed over with nothing left to ship
    unopened: list[Path] = field(default_factory=list)  # copies chosen, not listed (--watch)

    def add_copy(self, path: Path) -> None:
        """Choose the copy at ``path``, not opened to list it (``_changed``)."""
        self.chosen.append(path)
        self.unopened.append(path)

    def add(self, status: RunStatus, root: Path, *, offline: bool) -> str | None:
        """Sort ``status``'s journal; why it is passed over (``_skipped``)."""
        path = status.info.path
        self.listed.append(status)
        parent = status.info.meta.get(K_FORK_PARENT)
        if parent:
            self.children.add(path)
        why = _skipped(status, root, offline=offline)
        if why is None:
            self.chosen.append(path)
        elif why and parent:
            self.passed_over.setdefault(str(parent), []).append(path.name)
        elif not why:
            self.shipped += 1
        return why

    def steps(self) -> list[_Step]:
        """The steps shipping ``chosen`` (``_ordered``), a run's naming its
        forked children passed over: its close-out waits for them."""
        ids = {s.info.path: s.info.local_id for s in self.listed}
        copies = self._copies()
        steps = [
            replace(step, waits_for=tuple(self.passed_over[ids[step.path]]))
            if not step.register_only and ids.get(step.path) in self.passed_over
            else step
            for step in _ordered(self.chosen, self.listed, self.children, copies)
        ]
        chosen = set(self.chosen)  # a finished journal shipped before closed the run already
        listed = _listed(s for s in self.listed if s.info.path in chosen)
        return _finishers_named(steps, [*listed, *copies])

    def _copies(self) -> list[Listed]:
        """The metas of the copies chosen unopened, and whether each holds
        its run's finish, where the order of this pass depends on them (it
        ships more than one journal): a copy of a rank's primary, or of the
        attempt of a run key that finished, shipped before the others would
        close the run before their records landed. Each is read from a
        private snapshot (``_read_copy``); one that cannot be read keeps its
        place."""
        if len(self.chosen) < 2:
            return []
        root = sync_root()
        out = []
        for path in self.unopened:
            read = _read_copy(path, root)
            if read is not None:
                out.append(Listed(path, *read))
        return out


def _read_copy(path: Path, root: Path) -> tuple[Mapping[str, Any], bool] | None:
    """The meta of the copy at ``path`` and whether it holds its run's
    finish, read from a private snapshot (a copy refreshed in place may be
    truncated under a reader: ``mirror.snapshot``); None when it cannot be
    read (shipping it says why)."""
    with contextlib.suppress(Exception):
        with snapshot(path, root) as taken, Journal.open(taken, owner=False) as journal:
            return journal.all_meta(), finishes(journal)
    return None


def _ordered(
    chosen: list[Path],
    listed: list[RunStatus],
    children: set[Path],
    copies: Iterable[Listed] = (),
) -> list[_Step]:
    """``--all``'s journals in the order they ship. The primary of ranks
    attached to a run by id after the others (its close-out closes the run:
    their records land first); a forked child's journal before its
    parent's, whose close-out closes the run (a parent never registered is
    registered first); a child whose parent is not shipped here, last.
    ``copies``: copies chosen that ``listed`` does not hold (``--watch``
    lists copies without opening them), forked children among them too."""
    copies = list(copies)
    closers = close_order.closers([*_listed(listed), *copies])
    metas = {s.info.path: s.info.meta for s in listed} | {c.path: c.meta for c in copies}
    children = children | {c.path for c in copies if c.meta.get(K_FORK_PARENT)}
    ids = {s.info.path: s.info.local_id for s in listed}
    ids |= {c.path: str(c.meta.get(K_LOCAL_ID)) for c in copies}
    parents = {local_id: path for path, local_id in ids.items() if path not in children}
    first: list[Path] = []  # parents to register before their children ship
    findable: set[Path] = set()  # children that find their run by the time they ship
    for path in sorted(children & set(chosen)):
        parent = parents.get(str(metas[path].get(K_FORK_PARENT)))
        if finds_its_run(path, metas[path]):
            findable.add(path)
        elif parent in chosen:
            findable.add(path)
            if parent not in first:
                first.append(parent)
    order = sorted(chosen, key=lambda p: (p in closers, _ship_order(p, children, findable)))
    return [*(_Step(p, register_only=True) for p in first), *map(_Step, order)]


def _listed(statuses: Iterable[RunStatus]) -> list[Listed]:
    return [Listed(s.info.path, s.info.meta, s.info.finish is not None) for s in statuses]


def _named(paths: list[Path], *, offline: bool) -> list[_Step]:
    """The runs named, with their forked children (``_with_children``), the
    journal that closes a run written by several of those named after the
    others, as ``--all`` orders them (``close_order``): named in any order
    (a shell's glob), the primary of ranks shipped first would close the run
    before the other ranks' records landed. A journal that cannot be read
    keeps its place (shipping it says what is wrong with it)."""
    statuses = []
    for path in dict.fromkeys(paths):
        with contextlib.suppress(Exception):
            statuses.append(_status_of(path))
    listed = _listed(statuses)
    last = close_order.closers(listed)
    ordered = sorted(paths, key=lambda p: p in last)  # stable: the rest as named
    return _finishers_named(_with_children(ordered, offline=offline), listed)


def _finishers_named(steps: list[_Step], listed: list[Listed]) -> list[_Step]:
    """``steps``, each of a run key's journal without a finish entry naming
    the journal of its key that holds one (``close_order.finished_by``)."""
    by = close_order.finished_by(listed)
    return [
        replace(step, finished_by=by[step.path])
        if step.path in by and not step.register_only
        else step
        for step in steps
    ]


def _ship_order(path: Path, children: set[Path], findable: set[Path]) -> int:
    if path not in children:
        return 1
    return 0 if path in findable else 2


def _with_children(paths: list[Path], *, offline: bool) -> list[_Step]:
    """The runs named, each with its forked children's journals that need
    shipping (``ship.family``): shipping a run ships all of it. Its children
    go before it, so that the run's close-out comes after every record of
    it; when one cannot find the run (never registered), the run is
    registered first. A child named too ships there, with its run, wherever
    it was named (named after the run, it would land in the closed run)."""
    out: list[_Step] = []
    named = {p.absolute() for p in paths}
    families = {p: children_of(p, _status_of(p).info.local_id) for p in dict.fromkeys(paths)}
    with_its_run = named & {c.absolute() for kids in families.values() for c in kids}
    taken = named - with_its_run
    root = sync_root()
    for path, kids in families.items():
        if path.absolute() in with_its_run:
            continue
        found: list[Path] = []
        lost: list[Path] = []
        passed_over: list[str] = []
        for child in kids:
            if child.absolute() in taken:
                continue
            taken.add(child.absolute())
            why = None  # one named ships whatever it holds, as any journal named does
            if child.absolute() not in named:
                why = _skipped(_status_of(child), root, offline=offline)
            if why is None:
                (found if finds_its_run(child) else lost).append(child)
            elif why:
                print(inert(f"{child.name}: skipped: {why}"), file=sys.stderr)
                passed_over.append(child.name)
        if lost:
            out.append(_Step(path, register_only=True))
        out += [*map(_Step, [*found, *lost]), _Step(path, waits_for=tuple(passed_over))]
    return out


def _skipped(status: RunStatus, root: Path, *, offline: bool) -> str | None:
    """Why ``--all`` passes over this journal: None, it ships it; "", there
    is nothing to ship; else the reason, with the command that ships it."""
    info = status.info
    if info.not_opened is not None:
        # A link, another user's folder: nothing of it was read, so nothing
        # says it needs shipping (replay took it for a crashed run and failed).
        return f"not opened: {info.not_opened}"
    original = not is_copy(info.path, info.meta, root)
    origin = Origin.read_beside(info.path)
    here = origin is None or origin.is_original(info.path.absolute())
    if not original:
        # A copy, or a journal whose run its sync journal ships already.
        if not needs_sync(info.path, info.meta, info.last_seq, root):
            return ""
        if offline or (here and not status.opened_offline):
            return None
        return "a copy of a journal written elsewhere: ship it with primeruns sync"
    if not status.needs_shipping:
        if status.state == "running":
            return f"still being written ({info.owner}): ship it once that process has ended"
        return ""
    if status.spec_damaged and not offline:
        # Not opened offline as far as can be read, but nothing ships it
        # without its spec: replay tried, and stopped on "damaged journal"
        # naming a meta key, not what ships it.
        return _spec_unreadable(info.path, "replay")
    if status.opened_offline != offline:
        if offline:
            if status.spec is None and info.damage:
                return _unreadable(info.path, info.damage[0].what)
            if status.spec_damaged:
                # Whether it ran offline is its spec's to say: not "an
                # online run", whose replay cannot ship it without one either.
                return _spec_unreadable(info.path, "sync")
            return "an online run: ship what its uplink left with primeruns replay"
        return "an offline run: ship it with primeruns sync"
    return None


def _spec_unreadable(path: Path, command: str) -> str:
    """Why a journal whose spec is damaged (``reports.spec_damaged``) is
    passed over, and what ships it (``primeruns COMMAND``): its records are
    whole, its spec is not."""
    return (
        f"its spec cannot be read (damaged in the journal {path}), so neither can "
        f"whether it ran offline; primeruns show {path} says what is left of it; "
        f"with the run's spec in a file, primeruns {command} --spec FILE {path} ships it "
        "(a JSON object: kind, name, model, environments, ...)"
    )


def _unreadable(path: Path, what: str) -> str:
    """Why a journal whose spec cannot be read is passed over: not opened
    (a link, another user's), or its files damaged, and what ships it then."""
    if what.startswith("not opened: "):
        return what
    return (
        f"cannot be read ({what}): primeruns show {path} says what is left of it; "
        f"with the run's spec in a file, primeruns sync --spec FILE {path} ships it"
    )


def _run(args: argparse.Namespace, *, offline: bool) -> int:
    # Resolved once, before any journal is touched: a bad PRIME_RUNS_* value
    # is an error naming it, not a failure of each run in turn.
    policy = RetryPolicy.from_settings(resolve_sdk_settings(runs_dir=args.runs_dir))
    # Every ship reads or makes sync journals and their records there: a root
    # another user could write into is refused once, naming it and the fix,
    # not journal by journal (``copies.check_sync_root``).
    check_sync_root(sync_root())
    resident.enable()  # this command's process ships, as the uplink's does: same allocator care
    spec = None
    if args.spec is not None:
        try:
            spec = spec_from_file(args.spec)
        except SpecError as exc:
            raise CommandError(str(exc)) from None
    options = ShipOptions(
        base_url=args.base_url,
        timeout=args.timeout,
        policy=policy,
        job_ended=args.job_ended,
        spec=spec,
    )
    if getattr(args, "watch", False):
        if args.job_ended:
            # --job-ended closes runs without a finish entry as crashed; a watch
            # syncs runs whose jobs may still be writing them.
            raise CommandError(
                "--job-ended cannot go with --watch: sync once with --job-ended after the job ends"
            )
        return _watch(args, options)
    return _pass(args, options, offline=offline)


def _pass(
    args: argparse.Namespace,
    options: ShipOptions,
    *,
    offline: bool,
    seen: dict[Path, Fingerprint] | None = None,
    told: dict[Path, str] | None = None,
) -> int:
    """One pass over the targets. ``seen`` (watching): a copy unchanged
    since the last pass is not shipped again (nothing new: no request);
    ``told``: the journals passed over that the watch named already, with why."""
    if seen is None:
        targets = _targets(args, offline=offline)
    else:
        targets = _changed(args, seen, {} if told is None else told)
    results: list[dict[str, Any]] | None = [] if args.json else None
    what = "offline runs or copies to sync" if offline else "runs to replay"
    if not targets:
        if results is not None:
            emit_json(results)
        elif seen is None:
            print(f"no {what} under {inert(runs_dir_of(args))}")
        return EXIT_OK
    console = make_console()
    worst = EXIT_OK
    unshipped: dict[str, list[str]] = {}  # a parent's local id: its children not shipped
    for step in targets:
        path = step.path
        if args.dry_run:
            if step.register_only:
                continue  # its plan is said once, with the step that ships it
            status = _status_of(path)
            plan = describe_plan(status, _held_by(step, unshipped))
            if results is not None:
                results.append({"path": str(path), "state": status.state, "plan": plan})
            else:
                line = inert_text(path.name, style="bold")
                line.append(f" ({status.state})")
                console.print(line)
                for sentence in plan:
                    console.print(inert_text(f"  {sentence}"))
            if status.info.owner_alive:
                worst = max(worst, EXIT_LOCKED)
                _note_unshipped(path, unshipped)  # it would be refused: its run held
            continue
        before = fingerprint(path)
        try:
            code = replay_one(
                path,
                results=results,
                options=options,
                register_only=step.register_only,
                hold_close=_held_by(step, unshipped),
                finished_by=step.finished_by,
            )
        except Exception as exc:  # one journal's trouble must not strand the others
            error = f"not shipped: {type(exc).__name__}: {exc}"
            print(inert(f"{path}: {error}"), file=sys.stderr)
            code = EXIT_FAILED
            if results is not None:
                results.append(not_shipped_json(path, code, error))
        if seen is not None and code == EXIT_OK and not step.register_only:
            seen[path] = before
        if code in (EXIT_FAILED, EXIT_LOCKED) and not step.register_only:
            _note_unshipped(path, unshipped)
        worst = max(worst, code)
    if results is not None:
        emit_json(results)
    return worst


def _note_unshipped(path: Path, unshipped: dict[str, list[str]]) -> None:
    """Remember ``path`` if it is a forked child (it ships before its
    parent, see ``_Step``): its parent's close-out then waits for it."""
    with contextlib.suppress(Exception):  # a journal that cannot be read is no child known
        parent = journal_info(path).meta.get(K_FORK_PARENT)
        if parent:
            unshipped.setdefault(str(parent), []).append(path.name)


def _held_by(step: _Step, unshipped: dict[str, list[str]]) -> str | None:
    """Why ``step``'s run is left open: a forked child of it passed over or
    not shipped in this pass would have its records land in a closed run (a
    live ``finish()`` waits for its children the same way). None: nothing
    holds it."""
    children = list(step.waits_for)
    if unshipped and not step.register_only:
        with contextlib.suppress(Exception):  # its own shipping says what is wrong with it
            children += unshipped.get(journal_info(step.path).local_id, [])
    if not children:
        return None
    return (
        f"its forked child {', '.join(children)} has not shipped: the run is closed "
        "once it has; run this command again then"
    )


def _changed(
    args: argparse.Namespace, seen: dict[Path, Fingerprint], told: dict[Path, str]
) -> list[_Step]:
    """Watching: the journals whose files changed since they last synced
    cleanly, judged by their files alone (a copy is not opened to list it:
    one refreshed in place could be truncated under the reader); of the
    originals here, only offline runs that need it (``replay`` ships the others).
    Each journal passed over is named with why, once a watch (``told``):
    again if it is passed over for another reason, or after it synced or
    went away. What the watch remembers is pruned to the journals there, so
    a watch of days over a directory whose runs come and go holds no more
    than the directory does; a directory that cannot be listed is named
    once, and nothing is forgotten for it."""
    if args.runs:
        return [s for s in _targets(args, offline=True) if seen.get(s.path) != fingerprint(s.path)]
    runs_dir = runs_dir_of(args)
    root = sync_root()
    found = _Sorting()
    try:
        # Listed once, here: a second listing to learn why the first found
        # nothing could succeed where it failed, and judge an empty folder.
        names = os.listdir(runs_dir)
    except OSError as exc:
        # A listing that failed for a moment (a network filesystem's hiccup)
        # is no journal gone: forgetting them all would sync every one of
        # them again next pass. Said once, until the folder lists again.
        unlisted = f"cannot be listed ({exc.strerror or exc}): looked at again next pass"
        if told.get(runs_dir) != unlisted:
            told[runs_dir] = unlisted
            print(inert(f"{runs_dir}: {unlisted}"), file=sys.stderr)
        return []
    # Another user's are never synced.
    journals, untrusted = journal_dirs(runs_dir, names=names)
    present = set(journals)
    for gone in [path for path in seen if path not in present]:
        del seen[gone]
    for gone in [path for path in told if path not in present]:
        del told[gone]
    for path in journals:
        why: str | None = None
        if path in untrusted:
            why = f"not opened: {untrusted[path]}"
        elif seen.get(path) == fingerprint(path):
            continue  # synced, and unchanged since
        else:
            origin = Origin.read_beside(path)
            try:
                if origin is not None and not origin.is_original(path.absolute()):
                    found.add_copy(path)
                else:
                    why = found.add(_status_of(path), root, offline=True)
            except (OSError, JournalError) as exc:  # gone or changed since listed
                why = f"cannot be read ({exc}): looked at again next pass"
        if why is None:
            told.pop(path, None)
        elif told.get(path) != why:
            told[path] = why
            print(inert(f"{path.name}: skipped: {why}"), file=sys.stderr)
    # Ordered as --all: a forked child before its run's close-out.
    return found.steps()


def _watch(args: argparse.Namespace, options: ShipOptions) -> int:
    """Sync again every ``--interval`` seconds until interrupted: each pass
    ships what the copies brought since the last one (see ``_pass``)."""
    seen: dict[Path, Fingerprint] = {}
    told: dict[Path, str] = {}
    print(
        f"watching {inert(runs_dir_of(args))}: syncing every {args.interval:g} s (Ctrl-C to stop)",
        file=sys.stderr,
    )
    while True:
        _pass(args, options, offline=True, seen=seen, told=told)
        pause(args.interval)


def run_replay(args: argparse.Namespace) -> int:
    """Ship every unacknowledged record of crashed or interrupted runs and close
    them out on the platform (a run without a finish entry is closed as failed,
    crashed). Refuses while a run's owner is alive. Exit 0 only when everything
    shipped and the run is closed out."""
    return _run(args, offline=False)


def run_sync(args: argparse.Namespace) -> int:
    """Register offline runs (PRIME_RUNS_MODE=offline) on the platform and ship
    them: without RUN arguments, every offline run not yet synced."""
    return _run(args, offline=True)


def _common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", metavar="RUN", nargs="*", help="journal directories or local run ids"
    )
    parser.add_argument(
        "--all", action="store_true", help="every run under --runs-dir that needs it"
    )
    add_runs_dir(parser)
    parser.add_argument("--base-url", help="ship to this platform instead of the run's own")
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would be shipped; send nothing"
    )
    add_json(parser, "a JSON array of what was done to each run")
    parser.add_argument(
        "--timeout",
        type=timeout_arg,
        default=3600.0,
        metavar="S",
        help="give up shipping a run after S seconds (default 3600)",
    )
    parser.add_argument(
        "--job-ended",
        action="store_true",
        help="the job that wrote these runs has ended: close a copied run without a "
        "finish entry as failed (crashed) instead of leaving it open",
    )
    parser.add_argument(
        "--spec",
        type=Path,
        metavar="FILE",
        help="a JSON file with the run's spec (kind, name, model, environments, ...), "
        "for a journal whose own spec was lost to damage",
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay",
        help="ship crashed runs' journals and close them out",
        description=run_replay.__doc__,
    )
    _common_args(replay)
    replay.set_defaults(handler=inert_errors(run_replay))
    sync = sub.add_parser(
        "sync", help="register and ship offline runs", description=run_sync.__doc__
    )
    _common_args(sync)
    sync.add_argument(
        "--watch",
        action="store_true",
        help="sync --all again every --interval seconds until Ctrl-C, shipping what "
        "refreshed copies bring (a run directory rsynced from compute nodes)",
    )
    sync.add_argument(
        "--interval",
        type=seconds_arg,
        default=30.0,
        metavar="S",
        help="seconds between passes of --watch (default 30)",
    )
    sync.set_defaults(handler=inert_errors(run_sync))
