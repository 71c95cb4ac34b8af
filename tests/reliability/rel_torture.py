"""Seeded torture trials shared by the bounded CI tests and ``tools/torture``.

One trial = one run put through one kind of abuse, then checked against the
promise: the platform holds every record the journal holds, each exactly once,
the journal holds every record whose ``log_*`` call returned, and the run is
closed out with the right status. A trial returns a :class:`Trial` row instead
of asserting, so a long campaign can count; ``Trial.problems`` names every
broken promise (empty means the trial passed) and always carries the seed.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import procs
import rel_helpers as rh

import primeruns as pr
from primeruns.journal import EntryKind
from primeruns.local import LocalPlatform
from primeruns.platform import resolve_settings
from primeruns.ship.backlog import ship_journal

KEY = "test-key-0123456789"
KILL_PHASES = ("append", "request", "finish", "replay")
CHAOS_KINDS = ("retryable", "ambiguous", "latency", "down", "storm429", "mixed")


@dataclass
class Trial:
    """One trial's outcome: a row of the reliability table."""

    family: str
    seed: int
    variant: str
    records: int = 0
    faults: int = 0
    lost: int = 0
    duplicates: int = 0
    crashes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not (self.lost or self.duplicates or self.crashes)

    def fail(self, what: str) -> None:
        self.problems.append(f"[{self.family} seed={self.seed} {self.variant}] {what}")


@contextmanager
def sdk_env(url: str, home: Path) -> Iterator[None]:
    """Point this process's SDK at ``url`` with the test key, restoring the environment."""
    saved = dict(os.environ)
    for k in [k for k in os.environ if k.startswith("PRIME_")]:
        del os.environ[k]
    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        HOME=str(home),
        PRIME_API_KEY=KEY,
        PRIME_TRACES_URL=url,
        PRIME_RUNS_RETRY_BASE_S="0.02",
    )
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _settings(url: str) -> Any:
    from dataclasses import replace

    return replace(resolve_settings(api_key=KEY, base_url=url), traces_url=url)


def check_run(
    trial: Trial,
    lp: LocalPlatform,
    journal: Path,
    acked: list[str],
    acked_steps: list[int],
    *,
    max_unacked: int,
    expect_status: str | None,
) -> None:
    """Compare platform, journal and acknowledgements; record every mismatch."""
    episodes = [r["id"] for r in rh.journal_records(journal, EntryKind.EPISODE)]
    steps = [int(r["step"]) for r in rh.journal_records(journal, EntryKind.METRICS)]
    finishes = rh.journal_records(journal, EntryKind.FINISH)
    trial.records += len(episodes) + len(steps)
    missing_in_journal = set(acked) - set(episodes)
    if missing_in_journal or set(acked_steps) - set(steps):
        trial.lost += len(missing_in_journal) + len(set(acked_steps) - set(steps))
        trial.fail(f"acknowledged but not journaled: {sorted(missing_in_journal)[:3]}")
    if len(episodes) - len(acked) > max_unacked:
        trial.fail(f"{len(episodes) - len(acked)} journaled records were never acknowledged")
    run_id = rh.bound_run_id(journal)
    if run_id is None:
        trial.fail("the journal was never bound to a platform run")
        trial.lost += len(episodes)
        return
    stored = rh.platform_episode_ids(lp.data_dir, run_id)
    lost = set(episodes) - set(stored)
    extra = set(stored) - set(episodes)
    dups = sum(c - 1 for c in stored.values() if c > 1)
    if lost:
        trial.lost += len(lost)
        trial.fail(f"{len(lost)} journaled episodes never reached the platform")
    if extra:
        trial.fail(f"{len(extra)} episodes on the platform that were never journaled")
    if dups:
        trial.duplicates += dups
        trial.fail(f"{dups} duplicate episodes on the platform")
    stored_steps = rh.platform_metric_steps(lp.data_dir, run_id)
    if set(steps) - set(stored_steps):
        trial.lost += len(set(steps) - set(stored_steps))
        trial.fail("journaled metrics rows never reached the platform")
    status = lp.run(run_id)["status"]
    if expect_status is None:
        expect_status = "COMPLETED" if finishes else "FAILED"
    if status != expect_status:
        trial.fail(f"platform status {status}, expected {expect_status}")


def replay(trial: Trial, path: Path, url: str, home: Path) -> None:
    """``primeruns replay`` in-process; a raised exception counts as a crash."""
    with sdk_env(url, home):
        try:
            report = ship_journal(path, settings=_settings(url), timeout=120)
        except Exception as exc:  # the thing being measured: nothing may escape
            trial.crashes += 1
            trial.fail(f"replay raised {type(exc).__name__}: {exc}")
            return
    if not report.ok or report.damaged:
        trial.fail(f"replay not ok: pending={report.pending} errors={report.errors[:2]}")


def kill_trial(seed: int, work: Path, lp: LocalPlatform) -> Trial:
    """SIGKILL a producer at a seeded point (during an append, while requests are
    in flight, during finish, or kill ``primeruns replay`` itself), then replay."""
    rng = random.Random(seed)
    phase = KILL_PHASES[seed % len(KILL_PHASES)]
    kind = "train" if rng.random() < 0.4 else "eval"
    n = rng.randint(15, 40) if kind == "train" else rng.randint(30, 150)
    trial = Trial("kill", seed, f"{phase}/{kind}")
    runs = work / f"runs-{seed}"
    env = rh.isolated_env(work / f"home-{seed}", {"PRIME_TRACES_URL": lp.url})
    lp.set_faults(latency_ms=40 if phase in ("request", "finish", "replay") else 0, seed=seed)
    try:
        if phase == "finish":
            # Kill somewhere inside finish(): after the last log call returned.
            killed = rh.run_and_kill(
                runs,
                kind=kind,
                n=n,
                base_url=lp.url,
                kill_after_lines=n + (n if kind == "train" else 0) + 1,
                kill_delay_s=rng.uniform(0.0, 0.4),
                env=env,
            )
            unacked = 0
        else:
            lines = rng.randrange(1, n)
            killed = rh.run_and_kill(
                runs, kind=kind, n=n, base_url=lp.url, kill_after_lines=lines, env=env
            )
            unacked = 7
        trial.faults += 1
        if phase == "replay":
            _kill_replay(killed.journal, env, rng)
            trial.faults += 1
    finally:
        lp.set_faults(latency_ms=0)
    if not killed.finished:
        replay(trial, killed.journal, lp.url, work / f"home-{seed}")
    check_run(
        trial,
        lp,
        killed.journal,
        killed.episodes,
        killed.steps,
        max_unacked=unacked,
        expect_status=None,
    )
    return trial


def _kill_replay(path: Path, env: dict[str, str], rng: random.Random) -> None:
    proc = procs.start(
        [sys.executable, "-m", "primeruns", "replay", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        proc.wait(timeout=rng.uniform(0.3, 1.5))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def set_retry_after(lp: LocalPlatform, seconds: float) -> None:
    lp.set_faults(retry_after=seconds)


def chaos_trial(
    seed: int, work: Path, lp: LocalPlatform, n: int = 60, *, calm_finish: bool = False
) -> Trial:
    """One in-process run under a seeded network fault; then exactly-once is checked.

    Kinds: retryable (429/503/502), ambiguous (committed, response lost),
    latency spikes, the platform down a while and back, a 429 storm with a
    long Retry-After, and all of them mixed. ``calm_finish`` lifts the faults
    just before ``finish()``: the bounded CI tests use it because the close-out
    under faults hits a known defect by chance (Lifecycle gives finalize only
    5 attempts and then marks the run finalized anyway); that defect has its
    own deterministic xfail test, and the torture tool keeps the faults on.
    """
    rng = random.Random(seed)
    what = CHAOS_KINDS[seed % len(CHAOS_KINDS)]
    kind = "train" if rng.random() < 0.3 else "eval"
    trial = Trial("chaos", seed, f"{what}/{kind}")
    import workloads

    records = workloads.agentic(min(n, 40)) if kind == "train" else workloads.gsm8k(n)
    faults = {
        "retryable": {"retryable_rate": 0.5},
        "ambiguous": {"ambiguous_rate": 0.4},
        "latency": {"latency_ms": rng.choice((100, 300))},
        "down": {},
        "storm429": {"retryable_rate": 0.9},
        "mixed": {"retryable_rate": 0.3, "ambiguous_rate": 0.2, "latency_ms": 30},
    }[what]
    home = work / f"chaos-home-{seed}"
    acked: list[str] = []
    steps: list[int] = []
    # The server's fault counter is cumulative (and restarts with the server):
    # count this trial's faults as deltas.
    base = [_faults_count(lp)]

    def take() -> None:
        now = _faults_count(lp)
        trial.faults += max(0, now - base[0])
        base[0] = now

    with sdk_env(lp.url, home):
        if what == "storm429":
            set_retry_after(lp, 1.5)
        lp.set_faults(seed=seed, **faults)  # type: ignore[arg-type]
        try:
            common: dict[str, Any] = {
                "api_key": KEY,
                "base_url": lp.url,
                "runs_dir": work / "chaos-runs",
            }
            if kind == "train":
                run = pr.init(kind="train", model="m", team_id="team-a", **common)
            else:
                run = pr.init(environments=["gsm8k"], model="m", **common)
            down_at = rng.randrange(1, len(records)) if what == "down" else -1
            for i in range(0, len(records), 5):
                if i // 5 == down_at // 5 and what == "down":
                    take()
                    lp.stop()
                    trial.faults += 1
                batch = records[i : i + 5]
                try:
                    run.log_episodes(batch)
                    acked.extend(r["id"] for r in batch)
                    if kind == "train":
                        run.log_metrics({"loss": 1.0 / (i + 1)}, step=i)
                        steps.append(i)
                except Exception as exc:  # the loop must never notice
                    trial.crashes += 1
                    trial.fail(f"log call raised {type(exc).__name__}: {exc}")
            if what == "down":
                lp.start()
                base[0] = _faults_count(lp)
            if calm_finish:
                # Let the faults bite first: until one was injected, or all shipped.
                deadline = time.monotonic() + 30
                while (
                    _faults_count(lp) <= base[0]
                    and time.monotonic() < deadline
                    and not run.flush(timeout=0.2)
                ):
                    pass
            if what == "storm429" or calm_finish:
                lp.set_faults(retryable_rate=0.0, ambiguous_rate=0.0, latency_ms=0, seed=seed)
            run.finish(timeout=120)
        except Exception as exc:
            trial.crashes += 1
            trial.fail(f"run raised {type(exc).__name__}: {exc}")
            return trial
        finally:
            if lp.returncode is not None:
                lp.start()
                base[0] = _faults_count(lp)
            take()
            lp.set_faults(retryable_rate=0.0, ambiguous_rate=0.0, latency_ms=0)
            set_retry_after(lp, 0.1)
    assert run.journal_path is not None
    if run.dropped_records or run.failed_records:
        trial.fail(f"dropped={run.dropped_records} failed={run.failed_records}")
    check_run(trial, lp, run.journal_path, acked, steps, max_unacked=0, expect_status="COMPLETED")
    return trial


def _faults_count(lp: LocalPlatform) -> int:
    """Faults the server injected so far (0 if it does not count them)."""
    try:
        return int(httpx.get(f"{lp.url}/_local/faults", timeout=10).json().get("injected", 0))
    except (httpx.HTTPError, ValueError):
        return 0


def summarize(trials: list[Trial]) -> dict[str, int]:
    return dict(
        trials=len(trials),
        records=sum(t.records for t in trials),
        faults=sum(t.faults for t in trials),
        lost=sum(t.lost for t in trials),
        duplicates=sum(t.duplicates for t in trials),
        crashes=sum(t.crashes for t in trials),
        failed=sum(not t.ok for t in trials),
    )


def eval_run(base_url: str, runs_dir: Path) -> pr.Run:
    """An online evaluation run on the gsm8k environment, the campaign's usual subject."""
    return pr.init(
        environments=["gsm8k"], model="m", api_key=KEY, base_url=base_url, runs_dir=runs_dir
    )
