"""A stateful property test of one live run against the local platform.

Hypothesis drives a run through any interleaving of what happens to users:
logging from one or several threads, the platform starting to fail (retryable
refusals, 500s, committed requests whose answers are lost) or going down and
coming back, and ``flush()`` calls that may time out. At the end the platform
is healthy again and the run finishes; the oracle is the matrix's: every record
whose call returned is stored exactly once in each sink that applies, and the
run is COMPLETED. A failing interleaving is shrunk to a short one.
"""

from __future__ import annotations

import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rel_helpers as rh
import rel_machines as rm
import rel_torture as rt
import workloads
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

import primeruns as pr
from primeruns.local import LocalPlatform

POOL = workloads.gsm8k(2000)  # ids renewed past the bundled 300: all distinct


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    lp = LocalPlatform(tmp_path_factory.mktemp("stateful")).start()
    try:
        yield lp
    finally:
        lp.stop()


class LiveRun(rm.Outages):
    def __init__(self) -> None:
        super().__init__()
        self.work = Path(tempfile.mkdtemp(prefix="primeruns-stateful-"))
        self.env = rt.sdk_env(self.lp.url, self.work / "home")
        self.env.__enter__()
        self.logged: list[str] = []
        self.next = 0
        self.run: pr.Run | None = None

    @initialize(kind=st.sampled_from(["eval", "train"]))
    def start(self, kind: str) -> None:
        self.kind = kind
        common: dict[str, Any] = {"api_key": rt.KEY, "base_url": self.lp.url}
        common["runs_dir"] = self.work / "runs"
        if kind == "train":
            self.run = pr.init(kind="train", model="m", team_id="team-a", **common)
        else:
            self.run = pr.init(environments=["gsm8k"], model="m", **common)
        self.steps: list[int] = []

    def _take(self, n: int) -> list[dict[str, Any]]:
        batch = POOL[self.next : self.next + n]
        self.next += n
        return batch

    @rule(n=st.integers(1, 12))
    def log_episodes(self, n: int) -> None:
        assert self.run is not None
        batch = self._take(n)
        self.run.log_episodes(batch)
        self.logged += [e["id"] for e in batch]

    @rule(threads=st.integers(2, 6), each=st.integers(1, 6))
    def log_from_threads(self, threads: int, each: int) -> None:
        assert self.run is not None
        batches = [self._take(each) for _ in range(threads)]
        run = self.run
        workers = [threading.Thread(target=run.log_episodes, args=(b,)) for b in batches]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        self.logged += [e["id"] for b in batches for e in b]

    @precondition(lambda self: self.kind == "train")
    @rule()
    def log_metrics(self) -> None:
        assert self.run is not None
        step = len(self.steps)
        self.run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        self.steps.append(step)

    @precondition(lambda self: not self.down)
    @rule(
        what=st.sampled_from(["retryable", "500", "ambiguous", "none"]),
        rate=st.sampled_from([0.2, 0.5]),
    )
    def faults(self, what: str, rate: float) -> None:
        if what == "ambiguous":
            self.lp.set_faults(ambiguous_rate=rate, retryable_rate=0.0)
        elif what == "none":
            self.lp.set_faults(ambiguous_rate=0.0, retryable_rate=0.0)
        else:
            statuses = [500] if what == "500" else [429, 503, 502]
            self.lp.set_faults(retryable_rate=rate, ambiguous_rate=0.0, statuses=statuses)

    @rule(timeout=st.sampled_from([0.0, 0.2, 2.0]))
    def flush(self, timeout: float) -> None:
        assert self.run is not None
        self.run.flush(timeout=timeout)  # may time out: it must not raise

    def teardown(self) -> None:
        try:
            if self.down:
                self.lp.start()
            self.lp.set_faults(retryable_rate=0.0, ambiguous_rate=0.0, statuses=[429, 503, 502])
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
        stored = self.lp.run(run.id)
        assert stored["status"] == "COMPLETED"
        assert rh.platform_episode_ids(self.lp.data_dir, run.id) == Counter(self.logged)
        if self.kind == "eval":
            assert stored["samples"]["rows"] == stored["samples"]["distinct"] == len(self.logged)
        else:
            assert rh.platform_metric_steps(self.lp.data_dir, run.id) == Counter(self.steps)


def test_a_live_run_survives_any_interleaving(platform: LocalPlatform) -> None:
    rm.explore(LiveRun, platform, max_examples=8, stateful_step_count=10, derandomize=True)


@pytest.mark.slow
# Hundreds of cycles by design: longer than the suite's 300 s hang guard
# on a busy 2-core machine, so a guard of its own.
@pytest.mark.timeout(1800)
def test_a_live_run_survives_any_interleaving_long(platform: LocalPlatform) -> None:
    rm.explore(LiveRun, platform, max_examples=80, stateful_step_count=25)
