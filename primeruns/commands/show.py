"""``primeruns show RUN``: one run in detail, so a user can look rather than read.

The spec, the lifecycle (local and platform ids, outcome, where shipping
stands), what was logged and what each sink still has to ship in the user's
units, losses with their reasons, the damage a scan found, the summary, and
one sparkline per metric over the training steps. The same facts are one
JSON document with ``--json``. Sparklines are drawn here: rich has none.

What it reads is bounded by what it prints, not by the run's length: counts
come from entry headers, the last summary and finish from the headers then
one entry each (within 4 MiB: a journal is untrusted, and a larger one is
named as damage, not decoded), the curves from at most ``CURVE_ROWS`` metric rows (evenly
spaced over the run when it has more), each within ``MAX_ROW_BYTES`` and kept
only as far as its curves draw it, and damage from every entry's
checksum without decompressing any (a frame written corrupt, which no
checksum can see, is what ``--full`` still decodes every entry for).

A run made of several journals (forked children, joined workers, ranks:
``run_groups``) is shown whole: after the journal's own detail, each of the
run's journals in one line (its part, outcome, shipping, what it logged)
and the run's totals; their summaries are read, never the journals.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from array import array
from typing import Any

from rich.console import Console
from rich.text import Text

from .. import jsonbound
from ..journal import Damage, Entry, EntryKind, Journal, journal_info
from ..journal.listing import MAX_FINISH_BYTES
from ..reports import (
    UNIT_LABELS,
    UNKNOWN_SINKS,
    CurveFields,
    RunStatus,
    describe,
    load_rows,
    metric_curves,
    sample_rows,
)
from ..ship.factory import sink_kinds
from ..ship.uplink import CRASH_ERROR, ending_of
from .common import (
    EXIT_DAMAGED,
    EXIT_OK,
    add_json,
    add_runs_dir,
    inert_errors,
    resolve_run,
    runs_dir_of,
)
from .console import (
    emit_json,
    human_age,
    human_bytes,
    inert,
    inert_text,
    make_console,
    outcome_text,
    shipping_text,
)
from .ls import as_json
from .run_groups import RunGroup, group_of, role_of
from .sparkline import sparkline

__all__ = ["add_parser"]

_MAX_DAMAGE_LINES = 10
#: Metric rows read for the curves (and their min, max and last): every row
#: up to this many, else this many evenly spaced, first and last included.
#: Forty times the default sparkline width: each character still averages
#: dozens of rows.
CURVE_ROWS = 2_000
#: The largest metric row read (the dashboard's bound): one declaring more is
#: named as damage, not decompressed. Of each row read, only what its curves
#: draw is kept (``CurveFields``).
MAX_ROW_BYTES = 1 << 20


def _sinks(status: RunStatus) -> list[dict[str, Any]]:
    """Per sink: what it ships, how much of it is acknowledged, or why it is
    off. None for a journal whose spec is damaged: which sinks the run has
    is the spec's to say (read with the defaults, an evaluation's were
    listed as the run's, each with its records pending); its ``pending``
    says what is left, under ``reports.UNKNOWN_SINKS``, as ``ls`` does."""
    if status.spec_damaged:
        return []
    info = status.info
    logged = info.after.get(0)
    out = []
    for sink, kinds in sink_kinds(status.kind).items():
        off = info.meta.get(f"sink_off.{sink}")
        total = sum(logged[int(k)] for k in kinds) if logged else 0
        pending = status.pending.get(sink, 0)
        left = pending if isinstance(pending, int) else 0
        out.append(
            {
                "sink": sink,
                "ships": sorted(UNIT_LABELS[k] for k in kinds if k in UNIT_LABELS),
                "records": total,
                "acknowledged": max(0, total - left),
                "pending": left,
                "off": str(off) if off else None,
                "acknowledged_entry": int(info.cursors.get(sink, 0)),
            }
        )
    return out


def _run_json(group: RunGroup) -> dict[str, Any] | None:
    """The whole run, when it is more than this journal: each journal, and totals."""
    if not group.others:
        return None
    return {
        "head": group.head.info.local_id,
        "journals": [
            {
                "local_id": s.info.local_id,
                "path": str(s.info.path),
                "role": role_of(s),
                "outcome": s.outcome,
                "shipping": s.shipping,
                "counts": s.counts,
                "lost": s.losses_total,
            }
            for s in group.journals
        ],
        "totals": group.totals(),
    }


def _curves_json(curves: dict[str, list[tuple[int, float]]]) -> dict[str, Any]:
    def num(value: float) -> float | str:
        return value if math.isfinite(value) else str(value)

    out: dict[str, Any] = {}
    for key, points in sorted(curves.items()):
        finite = [v for _, v in points if math.isfinite(v)]
        out[key] = {
            "points": len(points),
            "steps": [points[0][0], points[-1][0]],
            "min": min(finite) if finite else None,
            "max": max(finite) if finite else None,
            "last": num(points[-1][1]),
        }
    return out


def _document(
    status: RunStatus,
    journal: Journal,
    metrics: list[dict[str, Any]],
    total: int,
    damage: list[Damage],
    group: RunGroup,
) -> dict[str, Any]:
    final_status, error, summary = _ending(journal, damage)
    document = as_json(status)
    document.update(
        {
            "spec": status.spec.to_json() if status.spec is not None else {},
            "finish": None
            if status.outcome in ("running", "unknown")
            else {"status": final_status, "error": error},
            "closed_out": status.finalized,
            "sinks": _sinks(status),
            "summary": summary,
            "metrics": _curves_json(metric_curves(metrics)),
            "metric_rows": {"total": total, "read": len(metrics)},
            "run": _run_json(group),
        }
    )
    document["damage"] = [d.what for d in damage]
    return document


def _ending(journal: Journal, damage: list[Damage]) -> tuple[str, str | None, dict[str, Any]]:
    """``(status, error, summary)`` as ``terminal_state`` has them for the
    close-out, from the newest intact finish or summary entry (a summary: a
    crash), found from the log's end, each decoded within
    ``MAX_FINISH_BYTES``: a journal is untrusted input, and a 128 MiB summary
    packed by zstd into a few KB took ``show`` to 400 MB. One past that bound,
    or not a JSON object, is named in ``damage`` and not shown; a damaged one
    is passed over (the scan names it), as ``terminal_state`` passes it."""
    for seq, number, _ in journal.newest((EntryKind.FINISH, EntryKind.SUMMARY)):
        kind = EntryKind(number)
        name = kind.name.lower()
        read = journal.read(seq - 1, kinds={kind}, max_entries=1, max_entry_bytes=MAX_FINISH_BYTES)
        record: dict[str, Any] | None = None
        if read.oversized and read.oversized[0][0] == seq:
            size = read.oversized[0][2]
            damage.append(
                Damage(
                    seq,
                    f"{journal.path}: entry {seq} ({name}) holds {size} bytes, over the "
                    f"{MAX_FINISH_BYTES} bytes shown of it: not read",
                )
            )
        else:
            entry = next((e for e in read.entries if e.seq == seq), None)
            if entry is None:
                continue  # damaged: the one before it stands
            record = _record(journal, entry, name, damage)
        if kind == EntryKind.FINISH:
            if record is None:  # not shown, yet the run finished (as ``ls`` says)
                return "finished", "its finish record is not read", {}
            return ending_of(record)
        return "crashed", CRASH_ERROR, record or {}
    return "crashed", CRASH_ERROR, {}


def _record(
    journal: Journal, entry: Entry, name: str, damage: list[Damage]
) -> dict[str, Any] | None:
    """``entry`` as a JSON object read within ``MAX_FINISH_BYTES``; None (the
    damage named) when it is not one."""
    try:
        record = jsonbound.loads(entry.payload, MAX_FINISH_BYTES)
    except ValueError as exc:
        damage.append(
            Damage(entry.seq, f"{journal.path}: entry {entry.seq} ({name}) unreadable: {exc}")
        )
        return None
    if not isinstance(record, dict):
        damage.append(
            Damage(entry.seq, f"{journal.path}: entry {entry.seq} ({name}) is not an object")
        )
        return None
    return record


def _field(console: Console, label: str, value: Any) -> None:
    """One ``label value`` line; a ``Text`` value is shown as built, any other
    made inert (most come from the journal)."""
    if value in (None, "", [], {}):
        return
    line = Text(f"  {inert(label):<14} ")
    if isinstance(value, Text):
        line.append_text(value)
    else:
        line.append(inert(value if isinstance(value, str) else json.dumps(value, sort_keys=True)))
    console.print(line)


def _section(console: Console, title: str, style: str = "bold") -> None:
    console.print()
    console.print(Text(title, style=style))


def _fmt_num(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _render(
    console: Console, status: RunStatus, doc: dict[str, Any], rows: list[dict[str, Any]], width: int
) -> None:
    info = status.info
    head = Text(f"run {inert(info.local_id)}", style="bold")
    head.append("  (")
    head.append_text(outcome_text(status.outcome))
    head.append(", ")
    head.append_text(shipping_text(status.shipping))
    head.append(")")
    console.print(head)
    _field(console, "journal", str(info.path))
    size = f"{human_bytes(info.size_bytes)}, {info.entries} entries"
    if info.missing_entries:
        size += f", {info.missing_entries} missing"
    _field(console, "size", size)
    _field(console, "modified", f"{human_age(status.age_s)} ago")
    if status.elsewhere is not None:
        _field(console, "owner", f"{info.owner or status.elsewhere} (state unknown from here)")
    elif info.owner_alive:
        _field(console, "owner", f"{info.owner} (running)")
    if status.synced is not None:
        _field(console, "synced through", str(status.synced.info.path))

    spec = status.spec
    _section(console, "spec")
    if spec is not None:
        _field(console, "kind", spec.kind)
        _field(console, "name", spec.name)
        _field(console, "model", spec.model)
        _field(console, "framework", spec.framework)
        _field(console, "dataset", spec.dataset)
        _field(console, "mode", spec.mode)
        _field(console, "attach_id", spec.attach_id)
        envs = [e.id or e.name or e.to_json() for e in spec.environments]
        _field(console, "environments", ", ".join(str(e) for e in envs))
        _field(console, "tags", ", ".join(spec.tags))
        _field(console, "config", dict(spec.config))
        _field(console, "platform", spec.base_url)
    elif status.spec_damaged:
        console.print(Text("  damaged: it cannot be read", style="yellow"))

    _section(console, "lifecycle")
    _field(console, "run id", status.platform.get("run_id") or "(not registered)")
    _field(console, "url", status.platform.get("url"))
    _field(console, "outcome", outcome_text(status.outcome))
    finish = doc["finish"]
    if finish and finish["error"]:
        _field(console, "error", finish["error"])
    fin = status.finalized
    if fin:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(fin.get("at") or 0)))
        _field(console, "closed out", f"{fin.get('status')} at {at}")
    elif status.opened_offline and not status.platform:
        _field(console, "closed out", "not yet: offline (primeruns sync ships and closes it)")
    else:
        _field(console, "closed out", "not yet (primeruns replay ships and closes it)")

    _section(console, "logged")
    for name, count in status.counts.items():
        if count:
            _field(console, name, str(count))
    _section(console, "sinks")
    if status.spec_damaged:
        left = status.pending.get(UNKNOWN_SINKS, 0)
        line = Text(f"{left} records pending", style="yellow" if left else "green")
        _field(console, UNKNOWN_SINKS, line)
        if left or not status.finalized:  # (``ls`` says "spec damaged" alike)
            console.print(
                inert_text(
                    f"  primeruns sync --spec FILE {info.local_id}, or replay --spec FILE "
                    f"{info.local_id}, ships it with the run's spec: a JSON object of kind, "
                    "name, model, environments, ..."
                )
            )
    for sink in doc["sinks"]:
        units = " and ".join(sink["ships"]) or "records"
        if sink["off"]:
            line = inert_text(f"off: {sink['off']}", style="dim")
        else:
            text = f"{sink['acknowledged']}/{sink['records']} {units} acknowledged"
            if sink["pending"]:
                text += f", {sink['pending']} pending"
            line = Text(text, style="yellow" if sink["pending"] else "green")
        _field(console, sink["sink"], line)
    for sink, loss in status.losses.items():
        console.print(inert_text(f"  lost {loss['count']} for {sink}", style="red"))
        for reason in loss["reasons"]:
            console.print(inert_text(f"      - {reason}"))

    _render_run(console, status, doc["run"])

    damage = doc["damage"]
    if damage:
        _section(console, f"damage ({len(damage)})", "bold red")
        for what in damage[:_MAX_DAMAGE_LINES]:
            console.print(inert_text(f"  {what}"))
        if len(damage) > _MAX_DAMAGE_LINES:
            console.print(Text(f"  ... and {len(damage) - _MAX_DAMAGE_LINES} more"))

    if doc["summary"]:
        _section(console, "summary")
        for key, value in doc["summary"].items():
            _field(console, str(key), value)

    curves = metric_curves(rows)
    if curves:
        total = doc["metric_rows"]["total"]
        if len(rows) < total:
            _section(console, f"metrics ({total} rows; curves of {len(rows)} evenly spaced)")
        else:
            _section(console, f"metrics ({len(rows)} rows)")
        # The names are padded to the longest; the sparkline keeps --width
        # (it once took the names' width instead, and --width did nothing).
        name_width = max(len(inert(k)) for k in curves)
        for key, points in sorted(curves.items()):
            values = [v for _, v in points]
            finite = [v for v in values if math.isfinite(v)] or [math.nan]
            line = Text(f"  {inert(key):<{name_width}}  ")
            line.append(sparkline(values, width=width), style="green")
            line.append(
                f"  min {_fmt_num(min(finite))}  max {_fmt_num(max(finite))}  "
                f"last {_fmt_num(values[-1])}  (steps {points[0][0]}..{points[-1][0]})"
            )
            console.print(line)


def _render_run(console: Console, status: RunStatus, run: dict[str, Any] | None) -> None:
    """The run's journals, one line each, and its totals."""
    if run is None:
        return
    _section(console, f"the run's journals ({len(run['journals'])})")
    for journal in run["journals"]:
        mark = "*" if journal["local_id"] == status.info.local_id else " "
        line = inert_text(f" {mark}{journal['local_id']}  {journal['role'] or '-'}  ")
        line.append_text(outcome_text(journal["outcome"]))
        line.append(", ")
        line.append_text(shipping_text(journal["shipping"]))
        logged = ", ".join(f"{n} {name}" for name, n in journal["counts"].items() if n)
        line.append(f"  {logged or 'nothing logged'}")
        if journal["lost"]:
            line.append(f", {journal['lost']} lost", style="red")
        console.print(line)
    totals = run["totals"]
    logged = ", ".join(f"{n} {name}" for name, n in totals["counts"].items() if n)
    said = f"  total: {logged or 'nothing logged'}"
    if totals["lost"]:
        said += f", {totals['lost']} lost"
    if totals["pending"]:
        said += f", {totals['pending']} pending"
    console.print(Text(said, style="bold"))


def run_show(args: argparse.Namespace) -> int:
    """Show one run in detail: spec, lifecycle (outcome, shipping), what was
    logged and what each sink still has to ship, losses with reasons, damage,
    summary, and metric curves as sparklines. Exit 4 if the journal is damaged."""
    path = resolve_run(args.run, runs_dir_of(args))
    status = describe(journal_info(path, verify=args.full, tally=True))
    damage: list[Damage] = list(status.info.damage)
    with Journal.open(path, owner=False) as journal:
        met: list[Damage] = []
        bounds: dict[str, Any] = {"max_entry_bytes": MAX_ROW_BYTES, "keep": CurveFields()}
        if args.full:
            rows = load_rows(journal, {EntryKind.METRICS}, met, **bounds)
            total = len(rows)
        else:
            scan = journal.checksums()
            met.extend(scan.damage)
            found = scan.seqs.get(EntryKind.METRICS, array("q"))
            rows, total = sample_rows(journal, EntryKind.METRICS, CURVE_ROWS, met, found, **bounds)
        # Damage found twice (a scan, then a read) is named once.
        _merge(damage, met)
        doc = _document(status, journal, rows, total, damage, group_of(status))
    if args.json:
        emit_json(doc)
    else:
        _render(make_console(), status, doc, rows, args.width)
    return EXIT_DAMAGED if damage else EXIT_OK


def _merge(damage: list[Damage], more: list[Damage]) -> None:
    """Append to ``damage`` what of ``more`` it does not name yet (by seq, else by text)."""
    known = {d.seq for d in damage if d.seq is not None} | {d.what for d in damage}
    for found in more:
        if found.seq not in known and found.what not in known:
            damage.append(found)
            known.add(found.what)
            if found.seq is not None:
                known.add(found.seq)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("show", help="show one run in detail", description=run_show.__doc__)
    parser.add_argument("run", metavar="RUN", help="a journal directory or a local run id")
    add_runs_dir(parser)
    add_json(parser, "the run")
    parser.add_argument(
        "--width", type=int, default=48, help="sparkline width in characters (default 48)"
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help=(
            "decode every entry to check it and draw the curves from every metric row "
            f"(slower on a long run; by default each entry's checksum is checked and "
            f"at most {CURVE_ROWS} evenly spaced rows are read)"
        ),
    )
    parser.set_defaults(handler=inert_errors(run_show))
