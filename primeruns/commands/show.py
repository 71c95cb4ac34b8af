"""``primeruns show RUN``: one run in detail, so a user can look rather than read.

The spec, the lifecycle (local and platform ids, state, finish status),
per-sink progress with losses and their reasons, the damage a scan found,
the summary, and one sparkline per metric over the training steps.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from ..journal import Damage, EntryKind, Journal, list_journals
from ..ship.uplink import terminal_state
from .common import EXIT_DAMAGED, EXIT_OK, add_runs_dir, describe, resolve_run, runs_dir_of
from .entries import load_rows
from .fmt import Style, human_age, human_bytes
from .sparkline import sparkline

__all__ = ["add_parser", "metric_curves"]

_MAX_DAMAGE_LINES = 10


def metric_curves(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per numeric metric, its ``(step, value)`` points in step order."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for index, row in enumerate(rows):
        step = row.get("step")
        at = int(step) if isinstance(step, int | float) and not isinstance(step, bool) else index
        for key, value in row.items():
            if key == "step" or key.startswith("_") or isinstance(value, bool):
                continue
            if isinstance(value, int | float):
                curves.setdefault(key, []).append((at, float(value)))
    for points in curves.values():
        points.sort(key=lambda p: p[0])
    return curves


def _fmt_num(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _section(style: Style, title: str) -> None:
    print()
    print(style.bold(title))


def _field(label: str, value: Any) -> None:
    if value not in (None, "", [], {}):
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        print(f"  {label:<14} {text}")


def run_show(args: argparse.Namespace) -> int:
    """Show one run in detail: spec, lifecycle, per-sink progress and losses
    with reasons, damage, summary, and metric curves as sparklines."""
    style = Style(sys.stdout)
    path = resolve_run(args.run, runs_dir_of(args))
    infos = [i for i in list_journals(path.parent, verify=True) if i.path == path]
    if not infos:
        from .common import CommandError

        raise CommandError(f"{path} is not a prime-runs journal")
    status = describe(infos[0])
    info = status.info
    spec = status.spec
    with Journal.open(path, owner=False) as journal:
        final_status, error, summary = terminal_state(journal)
        damage: list[Damage] = []
        metrics = load_rows(journal, {EntryKind.METRICS}, damage)

    print(style.bold(f"run {info.local_id}") + f"  ({style.state(status.state)})")
    _field("journal", str(info.path))
    _field("size", f"{human_bytes(info.size_bytes)}, {info.last_seq} entries")
    _field("modified", f"{human_age(status.age_s)} ago")
    if info.owner_alive:
        _field("owner", f"{info.owner} (running)")

    _section(style, "spec")
    for key in ("kind", "name", "model", "framework", "dataset", "mode", "attach_id"):
        _field(key, spec.get(key))
    envs = [e.get("id") or e.get("name") or e for e in spec.get("environments") or []]
    _field("environments", ", ".join(str(e) for e in envs))
    _field("tags", ", ".join(spec.get("tags") or []))
    _field("config", spec.get("config"))
    _field("platform", spec.get("base_url"))

    _section(style, "lifecycle")
    _field("run id", status.platform.get("run_id") or "(not registered)")
    _field("url", status.platform.get("url"))
    if info.owner_alive:
        _field("status", "running")
    else:
        shown = "crashed (no finish entry)" if final_status == "crashed" else final_status
        _field("status", shown)
        _field("error", error)
    fin = status.finalized
    if fin:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(fin.get("at") or 0)))
        _field("closed out", f"{fin.get('status')} at {at}")
    else:
        _field("closed out", "not yet (primeruns replay / sync ships and closes it)")

    _section(style, "sinks")
    for sink, pending in status.pending.items():
        acked = info.cursors.get(sink, 0)
        off = info.meta.get(f"sink_off.{sink}")
        text = f"off: {off}" if off else f"acked {acked}/{info.last_seq}, pending {pending}"
        if not off and pending == 0:
            text = style.green(text)
        elif not off:
            text = style.yellow(text)
        print(f"  {sink:<14} {text}")
    for sink, loss in info.losses.items():
        count = int(loss.get("count", 0))
        print(f"  {style.red('lost')} {count} for {sink}")
        for reason in loss.get("reasons") or []:
            print(f"      - {reason}")

    all_damage = list(info.damage) + [d for d in damage if d not in info.damage]
    if all_damage:
        _section(style, style.red(f"damage ({len(all_damage)})"))
        for d in all_damage[:_MAX_DAMAGE_LINES]:
            print(f"  {d.what}")
        if len(all_damage) > _MAX_DAMAGE_LINES:
            print(f"  ... and {len(all_damage) - _MAX_DAMAGE_LINES} more")

    if summary:
        _section(style, "summary")
        for key, value in summary.items():
            _field(str(key), value)

    curves = metric_curves(metrics)
    if curves:
        _section(style, f"metrics ({len(metrics)} rows)")
        width = max(len(k) for k in curves)
        for key, points in sorted(curves.items()):
            values = [v for _, v in points]
            finite = [v for v in values if math.isfinite(v)] or [math.nan]
            line = sparkline(values, width=args.width)
            print(
                f"  {key:<{width}}  {style.green(line)}  "
                f"min {_fmt_num(min(finite))}  max {_fmt_num(max(finite))}  "
                f"last {_fmt_num(values[-1])}  (steps {points[0][0]}..{points[-1][0]})"
            )
    return EXIT_DAMAGED if all_damage else EXIT_OK


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("show", help="show one run in detail", description=run_show.__doc__)
    parser.add_argument("run", metavar="RUN", help="a journal directory or a local run id")
    add_runs_dir(parser)
    parser.add_argument(
        "--width", type=int, default=48, help="sparkline width in characters (default 48)"
    )
    parser.set_defaults(handler=run_show)
