"""Ranks share a run (issue #29): four processes attached to one run by id,
as torchrun or SLURM starts them, each with its ``RANK``.

The oracle, over {evaluation, training} x {no fault, a non-primary
SIGKILLed, the primary SIGKILLed with its uplink and then replayed}:

- every record whose ``log_*`` call returned lands exactly once in every
  sink (Prime Traces, the evaluation sample table or the training Parquet
  objects, whose sample ids never collide within a step);
- only the primary (rank 0) closes the run, once, with its status: the
  others' ``finish()`` leaves it open, a killed non-primary never closes
  it, and a killed primary of an attached run closes nothing (its launcher
  owns a crashed run's status);
- the primary closes it only once the others' records are on the platform
  (with a non-primary killed, the primary finishes first, while the others
  still log);
- each step's metrics row holds the keys every rank logged for that step.

The default variant takes two cases (each kind, each fault); ``-m slow`` runs
the rest of the matrix.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import procs
import pyarrow.parquet as pq
import pytest
import rel_helpers as rh
import rel_torture as rt

from primeruns.journal import EntryKind
from primeruns.local import LocalPlatform
from primeruns.local.objects import object_path

_TEAM = "team-ranks"
_RANKS = 4
_STEPS = {"eval": 6, "train": 11}  # training: Parquet rows at steps 0 and 10
_SCRIPT = rh.HERE / "rel_rank.py"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    lp = LocalPlatform(tmp_path_factory.mktemp("ranks-platform"), train_teams=[_TEAM])
    lp.start()
    try:
        yield lp
    finally:
        lp.stop()


def _create(lp: LocalPlatform, kind: str) -> str:
    """The run, created as a launcher does before it starts the ranks."""
    headers = {"Authorization": f"Bearer {rt.KEY}"}
    if kind == "train":
        body = {"base_model": "m", "max_steps": 100, "environments": [], "team_id": _TEAM}
        made = httpx.post(f"{lp.url}/api/v1/rft/external-runs", json=body, headers=headers)
        return str(made.json()["run"]["id"])
    env = httpx.post(
        f"{lp.url}/api/v1/environmentshub/resolve", json={"name": "gsm8k"}, headers=headers
    ).json()["data"]["id"]
    body = {"name": "ranks", "environments": [{"id": env}], "tags": []}
    made = httpx.post(f"{lp.url}/api/v1/evaluations/", json=body, headers=headers)
    return str(made.json()["evaluation_id"])


@dataclass
class Rank:
    """One rank's process and what it said: every line is a call that returned."""

    rank: int
    proc: subprocess.Popen[str]
    journal: Path | None = None
    episodes: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    said: list[str] = field(default_factory=list)

    def read_until(self, word: str | None, lines: int | None = None) -> None:
        """Read its lines until it says ``word`` (or ``lines`` more of them)."""
        assert self.proc.stdout is not None
        read = 0
        while lines is None or read < lines:
            line = self.proc.stdout.readline()
            if not line:
                return
            read += 1
            said, _, value = line.strip().partition(" ")
            self.said.append(said)
            if said == "journal":
                self.journal = Path(value)
            elif said == "episode":
                self.episodes.append(value)
            elif said == "metrics":
                self.steps.append(int(value))
            if said == word:
                return

    def release(self) -> None:
        """Let it finish its run."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("finish\n")
        self.proc.stdin.flush()

    def wait_finished(self) -> None:
        self.read_until("finished")
        assert "finished" in self.said, f"rank {self.rank} did not finish: {self.said[-3:]}"
        assert self.proc.wait(timeout=180) == 0


def _start(lp: LocalPlatform, tmp: Path, run_id: str, kind: str) -> list[Rank]:
    ranks = []
    for r in range(_RANKS):
        env = rh.isolated_env(tmp / "home", {"PRIME_TRACES_URL": lp.url, "RANK": str(r)})
        args = [str(tmp / "runs"), lp.url, run_id, kind, str(r), str(_STEPS[kind])]
        proc = procs.start(
            [sys.executable, str(_SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        ranks.append(Rank(r, proc))
    for rank in ranks:
        rank.read_until("journal")
        assert rank.journal is not None, f"rank {rank.rank} did not start"
    return ranks


def _status(lp: LocalPlatform, run_id: str) -> str:
    return str(lp.run(run_id)["status"])


def _journaled(ranks: list[Rank], kind: EntryKind) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for rank in ranks:
        assert rank.journal is not None
        out += rh.journal_records(rank.journal, kind)
    return out


def _rows(lp: LocalPlatform, sql: str, run_id: str) -> list[Any]:
    conn = sqlite3.connect(f"file:{lp.data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute(sql, (run_id,))]
    finally:
        conn.close()


def _check_landed_once(lp: LocalPlatform, run_id: str, kind: str, ranks: list[Rank]) -> None:
    """Every record whose call returned is in every sink exactly once (and
    nothing else is: what landed was journaled)."""
    acked = Counter(e for rank in ranks for e in rank.episodes)
    assert max(acked.values()) == 1, "the test's ranks must log distinct episodes"
    journaled = _journaled(ranks, EntryKind.EPISODE)
    journaled_ids = {str(e["id"]) for e in journaled}
    assert set(acked) <= journaled_ids

    traces = rh.platform_episode_ids(lp.data_dir, run_id)
    assert set(acked) <= set(traces), f"{len(set(acked) - set(traces))} episodes never landed"
    assert set(traces) <= journaled_ids
    assert max(traces.values()) == 1, "an episode landed twice in Prime Traces"

    if kind == "eval":
        samples = Counter(
            str(s)
            for s in _rows(lp, "SELECT sample_id FROM eval_samples WHERE eval_id = ?", run_id)
        )
        assert set(acked) <= set(samples) <= journaled_ids
        assert max(samples.values()) == 1, "a sample row landed twice"
        return
    # Training: one Parquet row per episode of a step on the cadence, sample
    # ids unique within each step across every rank's objects.
    stored: dict[str, Any] = lp.run(run_id)
    keys = [o["key"] for o in stored["parquet_objects"]]
    assert len(set(keys)) == len(keys)
    by_step: dict[int, list[int]] = {}
    rows: Counter[int] = Counter()
    for obj in stored["parquet_objects"]:
        table = pq.read_table(object_path(lp.data_dir / "objects", obj["key"]))
        by_step.setdefault(obj["step"], []).extend(table.column("sample_id").to_pylist())
        rows[obj["step"]] += table.num_rows
    wanted = Counter(int(e["run"]["work"]["step"]) for e in journaled)
    for step, ids in by_step.items():
        assert len(ids) == len(set(ids)), f"sample ids collide at step {step}"
    assert rows == Counter({s: n for s, n in wanted.items() if s % 10 == 0})


def _check_metrics(lp: LocalPlatform, run_id: str, ranks: list[Rank]) -> None:
    """Each step's row holds the key of every rank whose call for it returned."""
    bodies = [
        json.loads(b) for b in _rows(lp, "SELECT body FROM train_metrics WHERE run_id = ?", run_id)
    ]
    by_step = {int(b["step"]): b for b in bodies}
    assert len(by_step) == len(bodies), "two rows for one step"
    for rank in ranks:
        for step in rank.steps:
            row = by_step.get(step, {})
            assert f"loss_r{rank.rank}" in row, f"rank {rank.rank}'s key lost at step {step}: {row}"
            assert row.get("lr") == 0.1


def _closed_at(lp: LocalPlatform, run_id: str, kind: str) -> float:
    sql = {
        "train": "SELECT completed_at FROM train_runs WHERE id = ?",
        "eval": "SELECT finalized_at FROM evaluations WHERE id = ?",
    }[kind]
    [closed] = _rows(lp, sql, run_id)
    return float(closed)


def _last_landed(lp: LocalPlatform, run_id: str) -> float:
    """When the platform stored the run's last episode, metrics row or Parquet object."""
    return max(
        float(t)
        for sql in (
            "SELECT ingested_at FROM episodes WHERE run_id = ?",
            "SELECT received_at FROM train_metrics WHERE run_id = ?",
            "SELECT confirmed_at FROM objects WHERE run_id = ? AND confirmed_at IS NOT NULL",
        )
        for t in _rows(lp, sql, run_id)
    )


def _replay(lp: LocalPlatform, tmp: Path, journal: Path) -> None:
    env = rh.isolated_env(tmp / "home", {"PRIME_TRACES_URL": lp.url, "PRIME_API_KEY": rt.KEY})
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", "replay", str(journal)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _trial(lp: LocalPlatform, tmp: Path, kind: str, fault: str) -> None:
    run_id = _create(lp, kind)
    ranks = _start(lp, tmp, run_id, kind)
    primary, others = ranks[0], ranks[1:]
    victim = {"none": None, "secondary": ranks[2], "primary": primary}[fault]
    for rank in ranks:
        if rank is victim:
            rank.read_until(None, lines=_STEPS[kind])  # killed half way
            if rank is primary:
                procs.kill_job(rank.proc)  # the job dies, uplink and all: replay has work
            else:
                os.kill(rank.proc.pid, signal.SIGKILL)  # out of memory: its uplink ships on
            rank.read_until(None)  # what it said before it died
            rank.proc.wait(timeout=60)
        else:
            rank.read_until("logged")
    living = [r for r in others if r is not victim]
    if fault == "secondary":
        # The primary finishes first, while the others still log (and the
        # killed one's uplink ships): it closes the run once they are done.
        primary.release()
        for rank in living:
            rank.release()
            rank.wait_finished()
        primary.wait_finished()
        assert _status(lp, run_id) == "COMPLETED"
        assert _closed_at(lp, run_id, kind) >= _last_landed(lp, run_id)
    else:
        for rank in living:
            rank.release()
            rank.wait_finished()
        # The others finished (and their uplinks closed their journals out):
        # the run is still open, whatever they did.
        assert _status(lp, run_id) == "RUNNING"
        assert primary.journal is not None
        if victim is primary:
            _replay(lp, tmp, primary.journal)
            # An attached run that crashed: its launcher's to close.
            assert _status(lp, run_id) == "RUNNING"
        else:
            primary.release()
            primary.wait_finished()
            assert _status(lp, run_id) == "COMPLETED"
    _check_landed_once(lp, run_id, kind, ranks)
    if kind == "train":
        _check_metrics(lp, run_id, ranks)


# Each fault once, each kind once: the non-primaries finish first in every case.
_FAST = [("train", "secondary"), ("eval", "primary")]
_ALL = [(k, f) for k in ("eval", "train") for f in ("none", "secondary", "primary")]


@pytest.mark.parametrize(("kind", "fault"), _FAST)
def test_four_ranks_attached_by_id_land_every_record_once_and_the_primary_closes_the_run(
    platform: LocalPlatform, tmp_path: Path, kind: str, fault: str
) -> None:
    _trial(platform, tmp_path, kind, fault)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "fault"), [c for c in _ALL if c not in _FAST])
def test_four_ranks_attached_by_id_the_rest_of_the_matrix(
    platform: LocalPlatform, tmp_path: Path, kind: str, fault: str
) -> None:
    _trial(platform, tmp_path, kind, fault)
