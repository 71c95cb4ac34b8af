"""Network chaos (issue #8 §2) against ``primeruns serve``: retryable failures,
ambiguous ones (committed, response lost), latency spikes, the platform down a
while and back, a 429 storm with a long Retry-After, all of them mixed, and a
slow-loris response. Every run ends exactly once, and the loop never notices.

Longer campaign: ``python tools/torture/chaos_torture.py --trials 60 --seed 0``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import rel_torture as rt
import workloads

from primeruns.local import LocalPlatform


@pytest.mark.parametrize("seed", range(len(rt.CHAOS_KINDS)), ids=list(rt.CHAOS_KINDS))
def test_chaos_run_is_exactly_once(
    seed: int, shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    trial = rt.chaos_trial(seed, tmp_path, shared_platform, n=40, calm_finish=True)
    assert trial.ok, trial.problems


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 30))
def test_chaos_long(seed: int, shared_platform: LocalPlatform, tmp_path: Path) -> None:
    trial = rt.chaos_trial(seed, tmp_path, shared_platform, n=150, calm_finish=True)
    assert trial.ok, trial.problems


def test_slow_loris_responses_still_ship_exactly_once(
    make_local_platform: Any, tmp_path: Path
) -> None:
    """Half the responses trickle in byte by byte (committed server-side first):
    the loop never waits, and every record lands once."""
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(40)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        lp.set_faults(slowloris_rate=0.5, slowloris_interval_s=0.004, seed=3)
        for i in range(0, len(episodes), 5):
            run.log_episodes(episodes[i : i + 5])
        run.finish(timeout=120)
        assert lp.set_faults(slowloris_rate=0.0)["injected"] > 0
    assert run.journal_path is not None
    trial = rt.Trial("chaos", 3, "slowloris")
    rt.check_run(
        trial,
        lp,
        run.journal_path,
        [e["id"] for e in episodes],
        [],
        max_unacked=0,
        expect_status="COMPLETED",
    )
    assert trial.ok, trial.problems


def test_finish_keeps_its_deadline_against_a_slow_loris_platform(
    make_local_platform: Any, tmp_path: Path
) -> None:
    """Every response trickles one byte per 0.5 s: finish(timeout=2) must still
    return promptly (what is unshipped stays in the journal for replay)."""
    lp: LocalPlatform = make_local_platform()
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(workloads.gsm8k(5))
        assert run.flush(timeout=60)
        lp.set_faults(slowloris_rate=1.0, slowloris_interval_s=0.5)
        done = threading.Event()

        def finish() -> None:
            run.finish(timeout=2)
            done.set()

        thread = threading.Thread(target=finish, daemon=True)
        thread.start()
        returned = done.wait(8)  # a 2 s budget plus bounded waits; 8 s means held
        lp.stop()  # drop the trickling connections so the thread ends either way
        thread.join(60)
    assert returned, "finish(timeout=2) was held by a slow-loris response"


def test_a_close_out_that_failed_is_retried_by_replay(
    make_local_platform: Any, tmp_path: Path
) -> None:
    """The platform goes down after every record shipped and before finish():
    the run cannot be closed out then, so a replay once it is back must do it."""
    lp: LocalPlatform = make_local_platform()
    home = tmp_path / "home"
    with rt.sdk_env(lp.url, home):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(workloads.gsm8k(5))
        assert run.flush(timeout=60)
        lp.stop()
        run.finish(timeout=2)
    lp.start()
    assert lp.run(run.id)["status"] == "RUNNING"  # the close-out really failed
    assert run.journal_path is not None
    trial = rt.Trial("chaos", 0, "down-at-finalize")
    rt.replay(trial, run.journal_path, lp.url, home)
    assert lp.run(run.id)["status"] == "COMPLETED"


def test_a_close_out_under_retryable_faults_retries_until_the_deadline(
    make_local_platform: Any, tmp_path: Path
) -> None:
    """Everything shipped; then every request fails retryably for a while.
    finish(timeout=30) has the time to outlast a short burst: the run must end
    COMPLETED, either by finish() itself or by a replay afterwards."""
    lp: LocalPlatform = make_local_platform()
    home = tmp_path / "home"
    with rt.sdk_env(lp.url, home):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(workloads.gsm8k(5))
        assert run.flush(timeout=60)
        lp.set_faults(retryable_rate=1.0, retry_after=0.05)
        done = threading.Event()

        def finish() -> None:
            run.finish(timeout=30)
            done.set()

        thread = threading.Thread(target=finish, daemon=True)
        thread.start()
        # The burst ends after finish() has had a second of failures.
        gave_up_early = done.wait(1.5)
        lp.set_faults(retryable_rate=0.0)
        thread.join(60)
    assert run.journal_path is not None
    trial = rt.Trial("chaos", 0, "burst-at-finalize")
    rt.replay(trial, run.journal_path, lp.url, home)
    assert not gave_up_early or lp.run(run.id)["status"] == "COMPLETED"
    assert lp.run(run.id)["status"] == "COMPLETED"
