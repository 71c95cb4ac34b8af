"""A stateful property test of a long training run: faults aimed at each
request of its lifecycle in turn, the platform down and back, and its
uplink process killed under it.

``test_rel_stateful.py`` drives a run through faults of every request at
once and checks Prime Traces and the metrics; this one aims each fault at
one route (the metrics, the Parquet object's presign, PUT or confirm, Prime
Traces), draws it among the platform's failures (a 500, a retryable refusal,
a committed request whose answer is lost, a gateway's 200 that proves
nothing, passed on or not), logs a second row for some steps (the platform
keeps one row per step, which must hold both), and kills the uplink process
alone between steps (an out-of-memory kill, a cleanup of stray processes),
the loop going on. Two oracles. While the run lives: once the platform is
healthy, what the loop logs on reaches it with no flush() (``healed``; a
sink paused for strikes waits ``PRIME_RUNS_PAUSE_S``, 1 s here). At the
end, the run finished: every episode once in Prime Traces, every metrics
row once with every key of its step, each step on the sample cadence in
Parquet objects holding exactly its episodes with their sample ids apart,
nothing counted lost, the run COMPLETED.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import rel_helpers as rh
import rel_machines as rm
import rel_torture as rt
import workloads
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from sdk_helpers import wait_for

import primeruns as pr
from primeruns.local import LocalPlatform
from primeruns.local.objects import object_path

_TEAM = "team-long"
_CADENCE = 10  # every 10th step's episodes go to the Parquet sample table
POOL = workloads.agentic(3000)  # ids renewed past the bundled 90: all distinct
ROUTES = (
    "/api/v1/rft/metrics",
    "/api/v1/rft/samples/presign",
    "/storage/",
    "/api/v1/rft/samples/confirm",
    "/api/v1/traces",
)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    lp = LocalPlatform(tmp_path_factory.mktemp("long-training"), train_teams=[_TEAM]).start()
    try:
        yield lp
    finally:
        lp.stop()


def _at_step(episode: dict[str, Any], step: int) -> dict[str, Any]:
    """The episode as logged at training step ``step`` (its traces too)."""
    for record in (episode, *(episode.get("traces") or [])):
        work = (record.get("run") or {}).get("work")
        if isinstance(work, dict):
            work["step"] = step
    return episode


class LongTraining(rm.Outages):
    def __init__(self) -> None:
        super().__init__()
        self.work = Path(tempfile.mkdtemp(prefix="primeruns-long-"))
        self.env = rt.sdk_env(self.lp.url, self.work / "home")
        self.env.__enter__()
        os.environ["PRIME_RUNS_PAUSE_S"] = "1"  # (restored with the environment)
        self.next = 0
        self.step = 0
        self.by_step: dict[int, list[str]] = {}
        self.rewarded: set[int] = set()
        self.run: pr.Run | None = None

    @initialize()
    def start(self) -> None:
        self.run = pr.init(
            kind="train",
            model="m",
            team_id=_TEAM,
            api_key=rt.KEY,
            base_url=self.lp.url,
            runs_dir=self.work / "runs",
        )

    @rule(
        episodes=st.integers(0, 4),
        steps=st.sampled_from([1, 1, 3, _CADENCE]),
        rows=st.sampled_from([1, 2]),
    )
    def train(self, episodes: int, steps: int, rows: int) -> None:
        """``steps`` steps of ``episodes`` episodes and ``rows`` metrics rows
        each (a second row of a step gives another key: the platform keeps
        one row per step, which must hold both)."""
        assert self.run is not None
        for _ in range(steps):
            batch = [_at_step(e, self.step) for e in POOL[self.next : self.next + episodes]]
            self.next += episodes
            if batch:
                self.run.log_episodes(batch)
            self.run.log_metrics({"loss": 1.0 / (self.step + 1)}, step=self.step)
            if rows == 2:
                self.run.log_metrics({"reward": float(self.step)}, step=self.step)
                self.rewarded.add(self.step)
            self.by_step[self.step] = [e["id"] for e in batch]
            self.step += 1

    @precondition(lambda self: not self.down)
    @rule(
        route=st.sampled_from(ROUTES),
        what=st.sampled_from(["500", "retryable", "ambiguous", "bogus", "none"]),
        rate=st.sampled_from([0.3, 1.0]),
    )
    def faults(self, route: str, what: str, rate: float) -> None:
        off: dict[str, Any] = {"retryable_rate": 0.0, "ambiguous_rate": 0.0, "bogus_rate": 0.0}
        if what == "bogus" and route == "/storage/":
            # A PUT's 200 says nothing in any case: a confirm finding no
            # bytes makes the sink PUT once more, and a second swallowed PUT
            # counts the object's samples as refused (not this test's subject).
            what = "ambiguous"
        if what in ("500", "retryable"):
            statuses = [500] if what == "500" else [429, 503, 502]
            off.update(retryable_rate=rate, statuses=statuses)
        elif what != "none":
            off[f"{what}_rate"] = rate
        self.lp.set_faults(routes=[route], **off)

    @rule()
    def healed(self) -> None:
        """The platform healthy again, the loop logging on (a step each look,
        no flush()): what it logs reaches the platform while it runs, a live
        curve, whatever came before (a sink paused for strikes sleeps
        ``PRIME_RUNS_PAUSE_S``, shortened here)."""
        self._heal()
        first = self.step
        steps = rh.platform_metric_steps

        def landed() -> bool:
            self.train(episodes=0, steps=1, rows=1)
            return first in steps(self.lp.data_dir, self.run_id)

        wait_for(landed, timeout=60, what=f"step {first}'s row to land while the loop logs")

    @precondition(lambda self: self.run is not None)
    @rule(then_healed=st.booleans())
    def kill_uplink(self, then_healed: bool) -> None:
        """SIGKILL the uplink process alone; ``then_healed``: and see what the
        loop logs on land (``healed``) right after."""
        assert self.run is not None and self.run._supervisor is not None
        pid = getattr(self.run._supervisor.uplink, "pid", None)
        if isinstance(pid, int):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if then_healed:
            self.healed()

    @rule(timeout=st.sampled_from([0.0, 0.5]))
    def flush(self, timeout: float) -> None:
        assert self.run is not None
        self.run.flush(timeout=timeout)  # may time out: it must not raise

    def _heal(self) -> None:
        if self.down:
            self.lp.start()
            self.down = False
        self.lp.set_faults(retryable_rate=0.0, ambiguous_rate=0.0, bogus_rate=0.0, routes=[])

    @property
    def run_id(self) -> str:
        assert self.run is not None and self.run.id is not None
        return self.run.id

    def teardown(self) -> None:
        try:
            self._heal()
            if self.run is None:
                return
            self.run.finish(timeout=120)
            self._check(self.run)
        finally:
            self.env.__exit__(None, None, None)

    def _check(self, run: pr.Run) -> None:
        assert run.status is pr.RunStatus.COMPLETED, run.errors
        assert run.failed_records == {} and run.dropped_records == 0, run.failed_records
        assert run.id is not None
        stored: dict[str, Any] = self.lp.run(run.id)
        assert stored["status"] == "COMPLETED"
        logged = Counter(i for ids in self.by_step.values() for i in ids)
        assert rh.platform_episode_ids(self.lp.data_dir, run.id) == logged
        assert rh.platform_metric_steps(self.lp.data_dir, run.id) == Counter(list(self.by_step))
        keys = {step: set(row) for step, row in _metric_rows(self.lp.data_dir, run.id).items()}
        for step in self.by_step:
            wanted_keys = {"loss", "reward"} if step in self.rewarded else {"loss"}
            assert wanted_keys <= keys[step], f"step {step}'s row: {keys[step]}"
        rows: dict[int, list[int]] = {}
        for obj in stored["parquet_objects"]:
            table = pq.read_table(object_path(self.lp.data_dir / "objects", obj["key"]))
            rows.setdefault(obj["step"], []).extend(table.column("sample_id").to_pylist())
        for step, ids in rows.items():
            assert len(ids) == len(set(ids)), f"sample ids collide at step {step}"
        wanted = {s: len(ids) for s, ids in self.by_step.items() if ids and s % _CADENCE == 0}
        assert {s: len(ids) for s, ids in rows.items()} == wanted


def _metric_rows(data_dir: Path, run_id: str) -> dict[int, dict[str, Any]]:
    """Each step's metrics row as the local platform keeps it."""
    conn = sqlite3.connect(f"file:{data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        found = conn.execute("SELECT step, body FROM train_metrics WHERE run_id = ?", (run_id,))
        return {int(step): json.loads(body) for step, body in found}
    finally:
        conn.close()


def test_a_long_training_run_survives_faults_at_each_request_and_its_uplinks_death(
    platform: LocalPlatform,
) -> None:
    rm.explore(LongTraining, platform, max_examples=5, stateful_step_count=10, derandomize=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_long_training_run_survives_faults_at_each_request_and_its_uplinks_death_long(
    platform: LocalPlatform,
) -> None:
    rm.explore(LongTraining, platform, max_examples=80, stateful_step_count=30)
