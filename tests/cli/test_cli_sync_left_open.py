"""What ``sync`` says of a run its journal does not close.

A journal attached to a run by id (``init(kind="train", id=...)``: a rank,
a job requeued onto its launcher's run) that did not complete sends no
close-out (the run is its launcher's to close), nor does a rank that is not
the run's primary: the run stays open on the platform. ``sync`` must say so,
not that it closed the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_helpers import cli
from sdk_helpers import API_KEY, point_at

TESTS = Path(__file__).resolve().parents[1]

# A process of a training run attached by id, offline on its node: logs a
# few steps, then ends without finish() (killed: no finish entry) or finishes.
_ATTACHED = """
import os, sys
import workloads
import primeruns as pr
runs, url, run_id, end, primary = sys.argv[1:]
run = pr.init(kind="train", id=run_id, model="m", team_id="team-a", runs_dir=runs,
              base_url=url, api_key="test-key-0123456789", mode="offline",
              primary=primary == "primary")
for step, episodes in sorted(workloads.agentic_by_step(2).items())[:3]:
    run.log_episodes(episodes)
    run.log_metrics({"loss": 1.0}, step=step)
if end == "finish":
    run.finish(timeout=30)
os._exit(0)
"""


def _attached_copy(lp: Any, tmp_path: Path, end: str, primary: str) -> tuple[str, Path]:
    """(the run the launcher created, a copy of one attached process's journal)."""
    created = httpx.post(
        f"{lp.url}/api/v1/rft/external-runs",
        json={"base_model": "m", "max_steps": 3, "environments": [], "team_id": "team-a"},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    run_id = str(created.json()["run"]["id"])
    node = tmp_path / "node"
    made = subprocess.run(
        [sys.executable, "-c", _ATTACHED, str(node), lp.url, run_id, end, primary],
        env=dict(os.environ), cwd=TESTS, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0
    [journal] = [p for p in node.iterdir() if not p.name.startswith(".")]
    login = tmp_path / "login"
    login.mkdir(mode=0o700)
    shutil.copytree(journal, login / journal.name)
    return run_id, login / journal.name


@pytest.mark.parametrize(
    ("end", "primary"),
    [("killed", "primary"), ("finish", "rank")],
    ids=["attached-primary-killed", "rank-finished"],
)
def test_a_synced_journal_that_does_not_close_its_run_says_the_run_is_left_open(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    end: str,
    primary: str,
) -> None:
    """Found by an adversarial review: ``sync`` of such a journal said "run
    closed out as crashed" (or "as completed") while the platform run stayed
    RUNNING, as it should: nothing was sent to close it."""
    lp = local_platform
    point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    run_id, copy = _attached_copy(lp, tmp_path, end, primary)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code == 0, out + err
    assert lp.run(run_id)["status"] == "RUNNING"  # nothing closed it, rightly
    assert "closed out as" not in out, out
    assert "left open" in out, out
    # Synced again, the same; and --json says so too.
    code, out, err = cli(capsys, "sync", "--json", str(copy))
    assert code == 0, out + err
    [report] = json.loads(out)
    assert report["left_open"], report
    assert lp.run(run_id)["status"] == "RUNNING"
