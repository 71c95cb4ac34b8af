"""``primeruns ls``: every journal under the runs directory, one line each.

Read-only and lock-free, so it works while runs are live; a journal that
cannot be read is listed as damaged rather than failing the listing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import EXIT_OK, RunStatus, add_runs_dir, runs_dir_of, statuses
from .fmt import Style, human_age, human_bytes, table

__all__ = ["add_parser", "as_json"]


def as_json(status: RunStatus) -> dict[str, Any]:
    info = status.info
    return {
        "local_id": info.local_id,
        "path": str(info.path),
        "run_id": status.platform.get("run_id"),
        "url": status.platform.get("url"),
        "kind": status.spec.get("kind"),
        "name": status.spec.get("name"),
        "mode": status.spec.get("mode"),
        "state": status.state,
        "records": info.last_seq,
        "pending": status.pending,
        "losses": {k: int(v.get("count", 0)) for k, v in info.losses.items()},
        "size_bytes": info.size_bytes,
        "modified": info.modified,
        "age_s": round(status.age_s, 1),
        "owner": info.owner if info.owner_alive else None,
        "damage": [d.what for d in info.damage],
    }


def _pending_text(status: RunStatus) -> str:
    parts = [f"{k}:{v}" for k, v in status.pending.items() if v]
    return " ".join(parts) if parts else "-"


def run_ls(args: argparse.Namespace) -> int:
    """List every run journal: ids, platform URL, kind, name, state, records,
    pending entries per sink, size on disk and age. Safe while runs are live."""
    runs_dir = runs_dir_of(args)
    found = statuses(runs_dir)
    if args.json:
        json.dump([as_json(s) for s in found], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    style = Style(sys.stdout)
    if not found:
        print(f"no runs under {runs_dir}")
        return EXIT_OK
    rows = []
    for s in found:
        state = "damaged" if s.info.damage and not s.info.meta else s.state
        rows.append(
            [
                s.info.local_id,
                str(s.platform.get("run_id") or "-"),
                str(s.spec.get("kind") or "?"),
                str(s.spec.get("name") or "-"),
                style.state(state),
                str(s.info.last_seq),
                _pending_text(s),
                human_bytes(s.info.size_bytes),
                human_age(s.age_s),
                str(s.platform.get("url") or "-"),
            ]
        )
    headers = ["LOCAL ID", "RUN ID", "KIND", "NAME", "STATE", "RECORDS", "PENDING", "SIZE"]
    print(table([*headers, "AGE", "URL"], rows, style))
    print(style.dim(f"{len(found)} run(s) under {runs_dir}"))
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "ls", help="list run journals and their state", description=run_ls.__doc__
    )
    add_runs_dir(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON array instead")
    parser.set_defaults(handler=run_ls)
