"""The CPU a forward read of a journal costs per entry: ``Journal.read`` from the start to the end.

Every reader of a journal goes through it: each sink of the uplink, ``sync``
and ``replay``, ``show``, ``export``, the offline dashboard. Two offline runs
are written once (with this tree): an evaluation of 20,000 gsm8k episodes
(``dashboard_memory.write_run``) and a training run of 100,000 10-scalar
metrics rows. Each is then read whole in a fresh process, in batches as a
sink reads (``Journal.read``'s defaults: 1,000 entries, 8 MiB), and the
process's CPU time over the reads alone is divided by the entries read.

Run ``python tools/bench/journal_read.py [--before TREE] [--repeat N]`` from
the repository root; with ``--before`` the two trees alternate, round by
round, on the same journals (the journal format is the same). Timings belong
here, not in tests; the host is shared, so compare medians of rounds.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import ROOT, Table, metrics_row
from childrun import child_json
from dashboard_memory import write_run

_EPISODES = 20_000
_ROWS = 100_000
# The metrics run: offline, so nothing leaves the machine.
_TRAINING: dict[str, Any] = {
    "name": "read-bench",
    "model": "m",
    "kind": "train",
    "team_id": "bench-team",
    "mode": "offline",
}


def write_metrics(runs: Path, rows: int) -> str:
    """An offline training run of ``rows`` metrics rows under ``runs``; its local id."""
    import primeruns as pr

    spec = pr.TrainingSpec(max_steps=rows)
    run = pr.init(**_TRAINING, training=spec, runs_dir=str(runs))
    for step in range(rows):
        run.log_metrics(metrics_row(step), step=step)
    run.finish()
    assert run.journal_path is not None
    return run.journal_path.name


def child(path: Path) -> dict[str, object]:
    """Read the journal at ``path`` whole; CPU seconds and entries read."""
    import primeruns
    from primeruns.journal import Journal

    journal = Journal.open(path, owner=False)
    try:
        started = time.process_time()
        after, entries, payload = 0, 0, 0
        while True:
            result = journal.read(after)
            entries += len(result.entries)
            payload += sum(len(e.payload) for e in result.entries)
            if result.next_after == after:
                break
            after = result.next_after
        cpu = time.process_time() - started
    finally:
        journal.close()
    return {"package": primeruns.__file__, "cpu": cpu, "entries": entries, "payload": payload}


def run(repeat: int, quick: bool, before: Path | None) -> list[Table]:
    scale = 10 if quick else 1
    table = Table(
        "Journal: a forward read's CPU per entry (journal_read.py)",
        ["journal", "code", "µs/entry (median)", "rounds", "ratio"],
    )
    trees = [("this tree", ROOT)] + ([] if before is None else [("--before tree", before)])
    with benchlib.isolated_env(None) as scratch:
        runs = scratch / "runs"
        runs.mkdir(mode=0o700)
        journals = [
            (f"{_EPISODES // scale} gsm8k episodes", write_run(runs, _EPISODES // scale)),
            (f"{_ROWS // scale} metrics rows", write_metrics(runs, _ROWS // scale)),
        ]
        for label, local_id in journals:
            per_entry: dict[str, list[float]] = {name: [] for name, _ in trees}
            for _ in range(repeat):
                for name, tree in trees:  # alternating, round by round
                    got = child_json(
                        __file__, tree, ["--child", str(runs / local_id)], f"reading {label}"
                    )
                    per_entry[name].append(got["cpu"] / max(got["entries"], 1) * 1e6)
            base = statistics.median(per_entry[trees[-1][0]])
            for name, _ in trees:
                median = statistics.median(per_entry[name])
                rounds = ", ".join(f"{v:.1f}" for v in per_entry[name])
                table.add(label, name, f"{median:.1f}", rounds, f"{median / base:.2f}")
    table.notes.append("ratio: to the --before tree's median (to this tree's without one)")
    return [table]


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(Path(sys.argv[2]))))
        return 0
    args = benchlib.parse_args(__doc__, before=True)
    benchlib.print_tables(run(args.repeat or 3, args.quick, args.before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
