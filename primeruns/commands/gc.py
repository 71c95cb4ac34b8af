"""``primeruns gc``: delete old journals that have nothing left to give.

A journal is eligible when it is older than ``--older-than`` (by its last
write), its owner is gone, and it is fully shipped and closed out on the
platform, and, shipped through a sync journal, holds no entry it has not
imported. ``--force`` also deletes journals with pending records (their data
is then gone for good: each deletion says how many records nothing
received, and, for one whose sync journal keeps records it has still to
ship, that sync journal and the command that ships them: no listing of the
runs directory names it once the journal is gone). A live run is never
deleted: deletion takes the owner lock first, so even a run that started
after the listing is safe.

The sync journals that ``replay`` and ``sync`` ship through are pruned by the
same rule, but only once fully shipped and closed out, and while no journal
here, nor any it imported from elsewhere (``copies.copied_from``: the sync
root is one for every runs directory), holds entries it has not imported
(``--force`` never deletes one that
is not: its copies would have nothing to continue; the record it leaves
would refuse the rest of them). Each
leaves its record (``ship.sync_records``), so a copy synced later ships
nothing twice: one that holds nothing new is nothing to sync, and one that
does is refused, naming the fix.

The step tables in which a run's processes merge their metrics rows go with
the run's last journal (``gc_steps``), and the lock files of runs' primaries
and ranks (``<runs dir>/.primary/``) once no live process holds them
(``ranks.collect_locks``: a later attacher makes one anew), and the
markers of deleted journals in the index by run (``run_index.prune``); the working
folders a killed sync left in the sync root go too (``ship.workfolders``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from .. import run_index
from ..exceptions import JournalError, JournalLockedError
from ..journal import delete_journal
from ..journal.listing import journal_info, journal_infos
from ..journal.trust import check_dir
from ..ranks import collect_locks
from ..reports import RunStatus, statuses
from ..ship import sync_records
from ..ship.copies import K_SOURCE_PATH, check_sync_root, copied_from, sync_root
from ..ship.workfolders import sweep
from .common import EXIT_FAILED, EXIT_OK, add_json, add_runs_dir, inert_errors, runs_dir_of
from .console import emit_json, human_age, human_bytes, inert
from .gc_steps import collect_drafts, collect_tables

__all__ = ["add_parser", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``, ``"2w"`` or a number of seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; use e.g. 7d, 12h, 30m or 0")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _verdict(status: RunStatus, older_than: float, force: bool) -> str | None:
    """Why ``status`` is kept, or None if it may be deleted."""
    if status.info.not_opened is not None:
        # A link (deleted through, or for a user's own link, ``latest``, not
        # ours to remove), another user's folder: never offered, ``--force``
        # or not (its delete refused it, after a dry run offered it).
        return f"not opened: {status.info.not_opened}"
    if status.info.owner_alive:
        return f"owner alive ({status.info.owner})"
    if status.age_s < older_than:
        return f"younger than the threshold ({human_age(status.age_s)})"
    if force:
        return None
    if status.unimported:
        # Its sync journal may be shipped and closed, but these entries are
        # in no sync journal: deleted, they could be shipped from nowhere.
        return (
            f"{status.unimported} entries its sync journal has not imported "
            "(sync or replay it, or --force)"
        )
    if status.pending_total:
        most = max(v for v in status.pending.values() if isinstance(v, int))
        return f"{most} records still to ship (replay or sync it, or --force)"
    if not status.finalized:
        return "not closed out on the platform (replay or sync it, or --force)"
    return None


def _unshipped(status: RunStatus) -> int:
    """How many of the records in the journal of ``status`` no sink has
    received and no sync journal holds: lost when --force deletes it (the
    most any sink has left, as sinks ship the same episodes). A sync
    journal's own are not: gc keeps it until it shipped them."""
    if status.synced is not None:
        return status.unimported
    return max((v for v in status.pending.values() if isinstance(v, int)), default=0)


def _left_in_sync_journal(status: RunStatus) -> dict[str, Any] | None:
    """Where the records of the journal of ``status`` that its sync journal
    has still to ship are, and how many (the most any sink has left)."""
    synced = status.synced
    if synced is None or not synced.pending_total:
        return None
    most = max(v for v in synced.pending.values() if isinstance(v, int))
    return {"path": str(synced.info.path), "records": most}


def _behind(sources: Iterable[RunStatus]) -> dict[str, str]:
    """Why the sync journal of each local id that ``sources`` (journals
    listed in the runs directory) hold entries of beyond it is kept."""
    return {
        s.info.local_id: f"{s.unimported} entries of {s.info.path} not imported yet (sync it)"
        for s in sources
        if s.synced is not None and s.unimported
    }


def _held_elsewhere(synced: RunStatus, here: Collection[Path]) -> str | None:
    """Why the sync journal ``synced`` is kept for a journal it imported
    from outside the runs directory cleaned (``here``: the journals listed
    in it, judged by ``_behind``), one that holds entries it has not
    imported; None when none does. The sync root is one for every runs
    directory: pruned by a gc of another, its record would refuse them."""
    source = synced.info.meta.get(K_SOURCE_PATH)
    upto = source.get("imported_upto") if isinstance(source, dict) else None
    if not isinstance(upto, int):
        return None  # (one it cannot tell is judged as before)
    for path in copied_from(synced.info.meta):
        if path in here:
            continue
        try:
            check_dir(path, "journal directory")  # (a link is never followed)
            info = journal_info(path)
        except (JournalError, OSError):
            continue  # gone, or not ours: nothing to sync from there
        if info.local_id == synced.info.local_id and info.last_seq > upto:
            return f"{info.last_seq - upto} entries of {path} not imported yet (sync it)"
    return None


def _leave_record(status: RunStatus, root: Path) -> None:
    """Before a sync journal is deleted: what it shipped, for the copies that
    come after it (``ship.sync_records``)."""
    info = status.info
    source = info.meta.get(K_SOURCE_PATH)
    upto = source.get("imported_upto") if isinstance(source, dict) else None
    sync_records.remember(
        root,
        info.local_id,
        run_id=status.platform.get("run_id"),
        imported_upto=upto if isinstance(upto, int) else info.last_seq,
        closed=True,
        pruned=True,
    )


def run_gc(args: argparse.Namespace) -> int:
    """Delete journals older than --older-than that are fully shipped and closed
    out. Never one with pending records or entries its sync journal has not
    imported (unless --force, which says how many records each deleted held
    that nothing received, and which sync journal keeps the rest of one,
    with the replay that ships them), never a live one."""
    runs_dir = runs_dir_of(args)
    report: dict[str, list[dict[str, Any]]] = {"deleted": [], "kept": [], "failed": []}
    gone: list[bool] = []  # per journal listed: deleted (or would be, in a dry run)

    def say(line: str) -> None:
        if not args.json:  # ids, reasons and errors come from journals: inert
            print(inert(line))

    code = EXIT_OK
    root = sync_root()
    try:
        check_sync_root(root)
        trusted = True
    except JournalError as exc:
        # Sync journals are pruned only in a root of the user's own: one
        # another user could write into may hold theirs, or link elsewhere.
        print(inert(f"not pruning sync journals: {exc}"), file=sys.stderr)
        trusted = False
    apart = trusted and root.is_dir() and root.absolute() != runs_dir.absolute()
    synced = statuses(root) if apart else []
    listed = [(s, False) for s in statuses(runs_dir)] + [(s, True) for s in synced]
    verdicts = [_verdict(s, args.older_than, args.force and not pruning) for s, pruning in listed]
    # A sync journal is pruned only once no journal here holds entries it has
    # not imported: its record would then say the run shipped, and a sync of
    # that journal, or a requeue's take-over of it, would be refused.
    behind = _behind(s for s, pruning in listed if not pruning)
    verdicts = [
        why
        if why is not None or not pruning or s.info.local_id not in behind
        else behind[s.info.local_id]
        for (s, pruning), why in zip(listed, verdicts, strict=True)
    ]
    here = {s.info.path.absolute() for s, pruning in listed if not pruning}
    verdicts = [
        _held_elsewhere(s, here) if why is None and pruning else why
        for (s, pruning), why in zip(listed, verdicts, strict=True)
    ]
    # Deleting is final: a full scan first, for entries a listing does not
    # read (a damaged one is data nobody has received). All in one go: one
    # probe child for them all, and none for a journal whose summary holds
    # a scan of its files as they are.
    scanned = (
        {}
        if args.force
        else {
            i.path: i.damage
            for i in journal_infos(
                [s.info.path for (s, _), why in zip(listed, verdicts, strict=True) if why is None],
                verify=True,
            )
        }
    )
    for (status, pruning), reason in zip(listed, verdicts, strict=True):
        info = status.info
        entry = {"local_id": info.local_id, "state": status.state, "size_bytes": info.size_bytes}
        if pruning:
            entry["sync_journal"] = True
        damage = scanned.get(info.path) if reason is None else None
        if damage:
            reason = f"damaged ({damage[0].what}): replay it first, or --force"
        raced = False  # its owner started after the listing: always said
        gone.append(False)
        if reason is None and not args.dry_run:
            try:
                if pruning:
                    _leave_record(status, root)
                delete_journal(info.path)
            except JournalLockedError as exc:
                reason, raced = str(exc), True
            except (JournalError, OSError) as exc:
                report["failed"].append({**entry, "error": str(exc)})
                say(f"failed  {info.local_id}: {exc}")
                code = EXIT_FAILED
                continue
        if reason is not None:
            report["kept"].append({**entry, "reason": reason})
            if args.verbose or raced:
                say(f"keep    {info.local_id}: {reason}")
            continue
        lost = 0 if pruning else _unshipped(status)
        if lost:
            entry["lost_records"] = lost
        report["deleted"].append(entry)
        gone[-1] = True
        verb = "would delete" if args.dry_run else "deleted"
        what = "sync journal " if pruning else ""
        said = f"{verb} {what}{info.local_id} ({status.state}, {human_bytes(info.size_bytes)})"
        if lost:
            said += f": {lost} records never shipped, lost"
        behind_it = None if pruning else _left_in_sync_journal(status)
        if behind_it is not None:
            # No listing of the runs directory names it once this journal
            # is gone: said here, with the command that ships the rest.
            entry["left_in_sync_journal"] = behind_it
            said += (
                f"; its sync journal keeps {behind_it['records']} records to ship: "
                f"primeruns replay {behind_it['path']}"
            )
        say(said)
    # The sync journals merge theirs beside them (ranks.written_in): those too.
    folders = [runs_dir, *([root] if apart else [])]
    steps = collect_tables(
        folders,
        [(s, g) for (s, _), g in zip(listed, gone, strict=True)],
        older_than=args.older_than,
        dry_run=args.dry_run,
    )
    verb = "would delete" if args.dry_run else "deleted"
    for t in steps:
        if t.deleted:
            say(f"{verb} step table of run {t.run_id or '?'} ({human_bytes(t.size_bytes)})")
    tables = [
        {"file": str(t.path), "run_id": t.run_id, "size_bytes": t.size_bytes}
        for t in steps
        if t.deleted
    ]
    if args.verbose:
        for t in steps:
            if t.reason is not None:
                say(f"keep    step table of run {t.run_id or '?'}: {t.reason}")
    unfinished = collect_drafts(folders, dry_run=args.dry_run)
    if unfinished:
        say(f"{verb} {len(unfinished)} step table(s) that killed processes left unfinished")
    locks = _collect_locks(runs_dir, args.dry_run, say)
    if not args.dry_run:
        run_index.prune(runs_dir)  # the deleted journals' markers (empty files)
    if locks is None:
        code = EXIT_FAILED
    if apart and not args.dry_run:
        left = sweep(root)
        if left:
            say(f"deleted {left} working folder(s) that killed syncs left in {root}")
    freed = sum(e["size_bytes"] for e in report["deleted"])
    if args.json:
        emit_json(
            {
                "dry_run": args.dry_run,
                "freed_bytes": freed,
                **report,
                "step_tables": tables,
                "step_table_drafts": [str(p) for p in unfinished],
                "primary_locks": [str(p) for p in locks or []],
            }
        )
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(
            f"{verb} {len(report['deleted'])} journal(s), {human_bytes(freed)}; "
            f"kept {len(report['kept'])}"
        )
    return code


def _collect_locks(runs_dir: Path, dry_run: bool, say: Callable[[str], None]) -> list[Path] | None:
    """The lock files of runs' primaries and ranks (``ranks.collect_locks``)
    no live process holds: deleted, and said (None: they could not be)."""
    try:
        locks = collect_locks(runs_dir, dry_run=dry_run)
    except OSError as exc:
        say(f"failed  lock files in {runs_dir / '.primary'}: {exc}")
        return None
    if locks:
        verb = "would delete" if dry_run else "deleted"
        say(f"{verb} {len(locks)} lock file(s) no live process holds ({runs_dir / '.primary'})")
    return locks


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "gc", help="delete old, fully shipped journals", description=run_gc.__doc__
    )
    add_runs_dir(parser)
    parser.add_argument(
        "--older-than",
        type=parse_duration,
        default=parse_duration("7d"),
        metavar="AGE",
        help="only journals last written longer ago than this (default 7d; e.g. 12h, 0)",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    parser.add_argument(
        "--force",
        action="store_true",
        help="also delete journals with pending records or never closed out (data is lost)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="say why each run is kept")
    add_json(parser, "what was deleted and kept (with why)")
    parser.set_defaults(handler=inert_errors(run_gc))
