"""The oracle of issue #29's matrix (``test_rel_one_run``), and its ranks
row: four processes attached to one run by id, as torchrun or SLURM starts
them, each with its ``RANK``.

What every cell of the matrix is held to, whatever its processes:

- every record whose ``log_*`` call returned lands exactly once in every
  sink (Prime Traces, the evaluation sample table or the training Parquet
  objects, whose sample ids never collide within a step), and nothing lands
  that no journal of the run holds;
- each step's metrics row holds the key of every process whose call for it
  returned;
- the run is closed by its primary only, once, after every record landed,
  with its status (``closed_after_every_record``).

The ranks row (``ranks_trial``): only rank 0 closes the run: the others'
``finish()`` leaves it open, a killed non-primary never closes it, and a
killed primary of an attached run closes nothing (its launcher owns a
crashed run's status); with a non-primary killed, the primary finishes
first, while the others still log.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import procs
import pyarrow.parquet as pq
import rel_helpers as rh
import rel_torture as rt

from primeruns.journal import EntryKind
from primeruns.journal.store import DATA_NAME
from primeruns.local import LocalPlatform
from primeruns.local.objects import object_path

RANKS_TEAM = "team-ranks"
_RANKS = 4
STEPS = {"eval": 6, "train": 11}  # training: Parquet rows at steps 0 and 10
_SCRIPT = rh.HERE / "rel_rank.py"


def create(lp: LocalPlatform, kind: str) -> str:
    """The run, created as a launcher does before it starts the ranks."""
    headers = {"Authorization": f"Bearer {rt.KEY}"}
    if kind == "train":
        body = {"base_model": "m", "max_steps": 100, "environments": [], "team_id": RANKS_TEAM}
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
            if not line.endswith("\n"):
                # The end, or a line the kill cut as it was written ("metrics "):
                # not said whole, so not counted as said.
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


def _start(
    lp: LocalPlatform, tmp: Path, run_id: str, kind: str, launcher: str = "RANK"
) -> list[Rank]:
    """The ranks, each with ``RANK`` set to its own; ``launcher="SLURM_PROCID=0"``:
    each with that variable as it is, inherited from one srun task (rank 0
    attaches first)."""
    ranks = []
    for r in range(_RANKS):
        name, _, given = launcher.partition("=")
        env = rh.isolated_env(tmp / "home", {"PRIME_TRACES_URL": lp.url, name: given or str(r)})
        args = [str(tmp / "runs"), lp.url, run_id, kind, str(r), str(STEPS[kind])]
        proc = procs.start(
            [sys.executable, str(_SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        ranks.append(Rank(r, proc))
        if r == 0:
            ranks[0].read_until("journal")  # the first to attach the run
    for rank in ranks:
        if rank.journal is None:
            rank.read_until("journal")
        assert rank.journal is not None, f"rank {rank.rank} did not start"
    return ranks


def inherited_rank_trial(lp: LocalPlatform, tmp: Path) -> None:
    """Four processes attached to a training run that share the rank they
    inherited (``torch.multiprocessing.spawn`` in an sbatch script: each
    ``SLURM_PROCID=0``): only the first to attach closes the run, after the
    others' records; their sample ids and keys stay apart as ranks' do."""
    run_id = create(lp, "train")
    ranks = _start(lp, tmp, run_id, "train", launcher="SLURM_PROCID=0")
    for rank in ranks:
        rank.read_until("logged")
    for rank in ranks[1:]:
        rank.release()
        rank.wait_finished()
    assert status(lp, run_id) == "RUNNING", "a process that is not the first closed the run"
    ranks[0].release()
    ranks[0].wait_finished()
    closed_after_every_record(lp, run_id, "train", "COMPLETED")
    check_landed_once(lp, run_id, "train", [e for r in ranks for e in r.episodes], tmp / "runs")
    check_metrics(lp, run_id, {f"loss_r{r.rank}": r.steps for r in ranks})


def status(lp: LocalPlatform, run_id: str) -> str:
    return str(lp.run(run_id)["status"])


def journaled(runs_dir: Path, kind: EntryKind) -> list[dict[str, Any]]:
    """Every record of ``kind`` in every journal of ``runs_dir`` (one run's
    processes each keep one there)."""
    out: list[dict[str, Any]] = []
    for path in sorted(runs_dir.iterdir()):
        if not path.name.startswith(".") and (path / DATA_NAME).is_file():
            out += rh.journal_records(path, kind)
    return out


def _rows(lp: LocalPlatform, sql: str, run_id: str) -> list[Any]:
    conn = sqlite3.connect(f"file:{lp.data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute(sql, (run_id,))]
    finally:
        conn.close()


def check_landed_once(
    lp: LocalPlatform, run_id: str, kind: str, acked: list[str], runs_dir: Path
) -> None:
    """Every record whose call returned (``acked``) is in every sink exactly
    once (and nothing else is: what landed was journaled in ``runs_dir``)."""
    said = Counter(acked)
    assert max(said.values()) == 1, "the test's processes must log distinct episodes"
    episodes = journaled(runs_dir, EntryKind.EPISODE)
    journaled_ids = {str(e["id"]) for e in episodes}
    assert set(said) <= journaled_ids, f"{len(set(said) - journaled_ids)} never journaled"

    traces = rh.platform_episode_ids(lp.data_dir, run_id)
    assert set(said) <= set(traces), f"{len(set(said) - set(traces))} episodes never landed"
    assert set(traces) <= journaled_ids
    assert max(traces.values()) == 1, "an episode landed twice in Prime Traces"

    if kind == "eval":
        samples = Counter(
            str(s)
            for s in _rows(lp, "SELECT sample_id FROM eval_samples WHERE eval_id = ?", run_id)
        )
        missing = set(said) - set(samples)
        assert not missing, f"{len(missing)} episodes not in the sample table"
        assert set(samples) <= journaled_ids
        assert max(samples.values()) == 1, "a sample row landed twice"
        return
    # Training: one Parquet row per episode of a step on the cadence, sample
    # ids unique within each step across every process's objects.
    stored: dict[str, Any] = lp.run(run_id)
    keys = [o["key"] for o in stored["parquet_objects"]]
    assert len(set(keys)) == len(keys)
    by_step: dict[int, list[int]] = {}
    rows: Counter[int] = Counter()
    for obj in stored["parquet_objects"]:
        table = pq.read_table(object_path(lp.data_dir / "objects", obj["key"]))
        by_step.setdefault(obj["step"], []).extend(table.column("sample_id").to_pylist())
        rows[obj["step"]] += table.num_rows
    wanted = Counter(int(e["run"]["work"]["step"]) for e in episodes)
    for step, ids in by_step.items():
        assert len(ids) == len(set(ids)), f"sample ids collide at step {step}"
    assert rows == Counter({s: n for s, n in wanted.items() if s % 10 == 0})


def check_metrics(lp: LocalPlatform, run_id: str, keys: dict[str, list[int]]) -> None:
    """Each step's row holds each key of ``keys`` logged for it by a call
    that returned (and ``lr``, which every process logs)."""
    bodies = [
        json.loads(b) for b in _rows(lp, "SELECT body FROM train_metrics WHERE run_id = ?", run_id)
    ]
    by_step = {int(b["step"]): b for b in bodies}
    assert len(by_step) == len(bodies), "two rows for one step"
    for key, steps in keys.items():
        for step in steps:
            row = by_step.get(step, {})
            assert key in row, f"{key} lost at step {step}: {row}"
            assert row.get("lr") == 0.1


def _closed_at(lp: LocalPlatform, run_id: str, kind: str) -> float:
    """When the run was closed: a failed evaluation's status is its last update."""
    sql = {
        "train": "SELECT completed_at FROM train_runs WHERE id = ?",
        "eval": "SELECT COALESCE(finalized_at, updated_at) FROM evaluations WHERE id = ?",
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


def closed_after_every_record(lp: LocalPlatform, run_id: str, kind: str, want: str) -> None:
    """The run is ``want`` (a failed one with its reason), closed after the
    last of its records landed: its primary closed it once the others' were
    shipped."""
    stored = lp.run(run_id)
    assert stored["status"] == want, stored["status"]
    if want == "FAILED":
        reason = stored.get("error_message") or stored.get("errorMessage")
        assert reason, f"failed without a reason: {stored}"
    closed, last = _closed_at(lp, run_id, kind), _last_landed(lp, run_id)
    assert closed >= last, f"closed {last - closed:.3f} s before its last record landed"


def replay(lp: LocalPlatform, tmp: Path, journal: Path) -> None:
    """``primeruns replay`` of ``journal``, as a user runs it after a crash."""
    env = rh.isolated_env(tmp / "home", {"PRIME_TRACES_URL": lp.url, "PRIME_API_KEY": rt.KEY})
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", "replay", str(journal)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def ranks_trial(lp: LocalPlatform, tmp: Path, kind: str, fault: str) -> None:
    """Four ranks attached by id; ``fault``: ``none``, ``worker`` (rank 2
    SIGKILLed: its uplink ships on) or ``primary`` (rank 0's job SIGKILLed,
    uplink and all, then replayed)."""
    run_id = create(lp, kind)
    ranks = _start(lp, tmp, run_id, kind)
    primary, others = ranks[0], ranks[1:]
    victim = {"none": None, "worker": ranks[2], "primary": primary}[fault]
    for rank in ranks:
        if rank is victim:
            rank.read_until(None, lines=STEPS[kind])  # killed half way
            if rank is primary:
                procs.kill_job(rank.proc)  # the job dies, uplink and all: replay has work
            else:
                os.kill(rank.proc.pid, signal.SIGKILL)  # out of memory: its uplink ships on
            rank.read_until(None)  # what it said before it died
            rank.proc.wait(timeout=60)
        else:
            rank.read_until("logged")
    living = [r for r in others if r is not victim]
    if fault == "worker":
        # The primary finishes first, while the others still log (and the
        # killed one's uplink ships): it closes the run once they are done.
        primary.release()
        for rank in living:
            rank.release()
            rank.wait_finished()
        primary.wait_finished()
        closed_after_every_record(lp, run_id, kind, "COMPLETED")
    else:
        for rank in living:
            rank.release()
            rank.wait_finished()
        # The others finished (and their uplinks closed their journals out):
        # the run is still open, whatever they did.
        assert status(lp, run_id) == "RUNNING"
        assert primary.journal is not None
        if victim is primary:
            replay(lp, tmp, primary.journal)
            # An attached run that crashed: its launcher's to close.
            assert status(lp, run_id) == "RUNNING"
        else:
            primary.release()
            primary.wait_finished()
            closed_after_every_record(lp, run_id, kind, "COMPLETED")
    acked = [e for rank in ranks for e in rank.episodes]
    check_landed_once(lp, run_id, kind, acked, tmp / "runs")
    if kind == "train":
        check_metrics(lp, run_id, {f"loss_r{r.rank}": r.steps for r in ranks})
