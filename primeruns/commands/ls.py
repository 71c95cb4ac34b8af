"""``primeruns ls``: every journal under the runs directory, one line each.

Read-only and lock-free, so it works while runs are live; a journal that
cannot be read is listed as damaged rather than failing the listing. Each
line says how the run ended (its outcome) apart from where its shipping
stands, what it logged in the user's units, and what it lost.

The journals of one run (forked children, joined workers, ranks: see
``run_groups``) are listed together, the others indented under the run's
head, each on its own line: each is shipped, shown and collected by its own
id. ``--json`` says the same with ``run_of`` and ``journals``.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..reports import RunStatus, statuses
from .common import (
    EXIT_OK,
    CommandError,
    add_json,
    add_runs_dir,
    inert_errors,
    no_cyclic_gc,
    runs_dir_of,
)
from .console import emit_json, inert_text, make_console
from .run_groups import RunGroup, group_runs, role_of

__all__ = ["add_parser", "as_json", "grouped_json"]

# Journals with damage named under the table, at most.
_DAMAGED_NAMED = 5


def as_json(status: RunStatus) -> dict[str, Any]:
    info, spec = status.info, status.spec
    return {
        "local_id": info.local_id,
        "path": str(info.path),
        "run_id": status.platform.get("run_id"),
        "url": status.platform.get("url"),
        "kind": spec.kind if spec is not None else None,
        "name": spec.name if spec is not None else None,
        "mode": spec.mode if spec is not None else None,
        "outcome": status.outcome,
        "shipping": status.shipping,
        "state": status.state,
        "counts": status.counts,
        # Seqs a power cut's lost appends took are no entries (``journal.skipped``).
        "entries": info.entries,
        "missing_entries": info.missing_entries,
        "pending": status.pending,
        # Its spec cannot be read: its sinks are unknown (``pending`` counts
        # under reports.UNKNOWN_SINKS), and sync/replay need --spec FILE.
        "spec_damaged": status.spec_damaged,
        "losses": status.losses,
        "size_bytes": info.size_bytes,
        "modified": info.modified,
        "age_s": round(status.age_s, 1),
        "owner": info.owner if info.owner_alive else None,
        # Its producer's machine, when that is another one and the run has no
        # finish entry: whether it still runs cannot be told from here.
        "elsewhere": status.elsewhere,
        "synced_through": str(status.synced.info.path) if status.synced else None,
        "damage": [d.what for d in info.damage],
        # Its part in a run made of several journals (run_groups): a forked
        # child, the primary, a rank; None for a journal that is a run alone.
        "role": role_of(status),
    }


def grouped_json(groups: list[RunGroup]) -> list[dict[str, Any]]:
    """Every journal as ``as_json`` says it, grouped by run: a run's head,
    then its other journals. The head names them (``journals``) with the
    run's totals; each other names its head (``run_of``)."""
    out = []
    for group in groups:
        head = as_json(group.head)
        head["run_of"] = None
        head["journals"] = [s.info.local_id for s in group.others]
        head["run_totals"] = group.totals() if group.others else None
        out.append(head)
        for status in group.others:
            doc = as_json(status)
            doc.update(run_of=group.head.info.local_id, journals=[], run_totals=None)
            out.append(doc)
    return out


def run_ls(args: argparse.Namespace) -> int:
    """List every run journal: ids, kind, name, outcome (running, completed,
    failed, crashed), shipping (shipped, N pending, offline, not closed out),
    what it logged, losses, size and age. Safe while runs are live."""
    with no_cyclic_gc():
        return _ls(args)


def _ls(args: argparse.Namespace) -> int:
    runs_dir = runs_dir_of(args)
    if args.runs_dir is not None and not runs_dir.is_dir():
        # A typo is a usage error, not "no runs" (the default runs dir is
        # absent until a first run, and listing it then is not an error).
        raise CommandError(f"--runs-dir {runs_dir}: no such folder")
    # Each journal's meta as its listing row keeps it: ls reads no other value.
    groups = group_runs(statuses(runs_dir, rows=True))
    if args.json:
        emit_json(grouped_json(groups))
        return EXIT_OK
    console = make_console()
    if not groups:
        console.print(inert_text(f"no runs under {runs_dir}"))
        return EXIT_OK
    found: list[RunStatus] = []
    nested: set[int] = set()  # the rows listed under their run's head
    for group in groups:
        found.append(group.head)
        nested.update(range(len(found), len(found) + len(group.others)))
        found.extend(group.others)
    from .ls_table import draw  # rich: for a table only (not ``--json``)

    draw(found, console, nested)
    if len(groups) == len(found):
        console.print(inert_text(f"{len(found)} run(s) under {runs_dir}", style="dim"))
    else:
        said = f"{len(groups)} run(s), {len(found)} journals, under {runs_dir}"
        console.print(inert_text(said, style="dim"))
    damaged = [
        status.info.local_id
        for status in found
        if status.info.damage and status.info.not_opened is None
    ]
    if damaged:
        # The table has no room for what each lost; a line says which to look at.
        said = (
            f"{len(damaged)} journal(s) with damage: {_named(damaged)} "
            "(primeruns show ID says what)"
        )
        console.print(inert_text(said, style="yellow"))
    not_opened = [status.info.local_id for status in found if status.info.not_opened]
    if not_opened:
        # Not damage: a link (never followed), another user's folder.
        said = (
            f"{len(not_opened)} not opened, left alone: {_named(not_opened)} "
            "(a link, or not yours: primeruns ls --json says why)"
        )
        console.print(inert_text(said, style="yellow"))
    lost_spec = [status.info.local_id for status in found if status.spec_damaged]
    if lost_spec:
        # Read with the defaults, its records were counted against an
        # evaluation's sinks; what ships it is the run's spec, from the user.
        said = (
            f"{len(lost_spec)} journal(s) whose spec is damaged: {_named(lost_spec)} "
            "(primeruns sync --spec FILE ID, or replay --spec FILE ID, ships it with the "
            "run's spec: a JSON object of kind, name, model, environments, ...)"
        )
        console.print(inert_text(said, style="yellow"))
    return EXIT_OK


def _named(ids: list[str]) -> str:
    """The first few of ``ids``, for a line under the table."""
    return ", ".join(ids[:_DAMAGED_NAMED]) + (", ..." if len(ids) > _DAMAGED_NAMED else "")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "ls", help="list run journals and their state", description=run_ls.__doc__
    )
    add_runs_dir(parser)
    add_json(parser, "a JSON array of the runs")
    parser.set_defaults(handler=inert_errors(run_ls))
