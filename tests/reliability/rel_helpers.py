"""Helpers for the reliability suite: what the platform holds (by identity,
not just counts), what a journal holds, and a producer subprocess that can be
SIGKILLed at a chosen point while reporting exactly which ``log_*`` calls
returned.

The suite's claim is "exactly the records whose log_* call returned": counts
alone cannot prove that (one lost plus one duplicated record keeps a count
right), so the platform's SQLite file is read directly for the episode ids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import procs
from sdk_helpers import platform_episode_ids as platform_episode_ids  # re-exported
from sdk_helpers import platform_metric_steps as platform_metric_steps

from primeruns.journal import EntryKind, Journal

HERE = Path(__file__).resolve().parent
PRODUCER = HERE / "rel_producer.py"


def journal_records(path: Path, kind: EntryKind) -> list[dict[str, Any]]:
    """Every intact record of ``kind`` in the journal at ``path`` (read-only)."""
    journal = Journal.open(path, owner=False)
    try:
        result = journal.read(0, kinds={kind}, max_entries=10**7, max_bytes=1 << 40)
        return [json.loads(e.payload) for e in result.entries]
    finally:
        journal.close()


def bound_run_id(path: Path, home: Path | None = None) -> str | None:
    """The platform run id a journal was bound to, if it ever registered:
    in its own meta, or, for a journal a command shipped, in the sync journal
    under ``home`` (by default ``home`` next to the journal, as most of these
    tests lay out)."""
    journal = Journal.open(path, owner=False)
    try:
        bound = journal.get_meta("platform") or {}
        local_id = journal.local_id
    finally:
        journal.close()
    if bound.get("run_id") or path.parent is None:
        return bound.get("run_id")
    tail = Path(".local", "state", "prime-runs", "synced", local_id)
    if home is not None:
        found = [home / tail]
    else:
        # Every command ships through a sync journal under its HOME; these
        # tests keep each HOME beside the runs directory, in one work folder.
        found = [path.parent / "home" / tail, *path.parent.parent.glob(f"**/{tail}")]
    synced = next((p for p in found if p.is_dir()), None)
    if synced is None:
        return None
    with Journal.open(synced, owner=False) as sync:
        run_id = (sync.get_meta("platform") or {}).get("run_id")
        return str(run_id) if run_id else None


@dataclass
class Killed:
    """What a killed producer reported before it died."""

    journal: Path
    episodes: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    logged_all: bool = False
    finished: bool = False


def run_and_kill(
    runs_dir: Path,
    *,
    kind: str,
    n: int,
    base_url: str | None,
    kill_after_lines: int | None,
    env: dict[str, str],
    kill_delay_s: float = 0.0,
) -> Killed:
    """Start the producer, SIGKILL it after ``kill_after_lines`` acknowledgement
    lines (plus ``kill_delay_s``; None: let it finish), and collect every line it
    flushed, including those written between the last read and the kill."""
    args = [sys.executable, str(PRODUCER), str(runs_dir), kind, str(n), base_url or ""]
    proc = procs.start(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if not first.startswith("journal "):
        proc.kill()
        proc.wait()
        raise AssertionError(f"producer did not start: {first!r}")
    lines: list[str] = []
    if kill_after_lines is not None:
        for _ in range(kill_after_lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        if kill_delay_s:
            # Not hiding a race: the kill point itself is what is being randomised.
            time.sleep(kill_delay_s)
        procs.kill_job(proc)  # the job dies, uplink and all
    # Read the rest through the same buffered reader: communicate(timeout=)
    # reads the raw pipe and would skip what readline() already buffered.
    rest = proc.stdout.read()
    proc.stdout.close()
    proc.wait(timeout=300)
    lines.extend(line.strip() for line in rest.splitlines() if line.strip())
    out = Killed(journal=Path(first.split(" ", 1)[1]))
    for line in lines:
        word, _, value = line.partition(" ")
        if word == "episode":
            out.episodes.append(value)
        elif word == "metrics":
            out.steps.append(int(value))
        elif word == "logged":
            out.logged_all = True
        elif word == "finished":
            out.finished = True
    return out


def isolated_env(tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child environment with no PRIME_* settings of this machine and a fresh HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    env["PRIME_RUNS_RETRY_BASE_S"] = "0.02"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    env.update(extra or {})
    return env


def run_script(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by a fresh interpreter, its runs directory under
    ``tmp_path`` (then ``args``); it must exit with 0."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "runs"), *args],
        capture_output=True,
        text=True,
        env=isolated_env(tmp_path),
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done
