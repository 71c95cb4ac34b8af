"""Network chaos (issue #8 §2) against ``primeruns serve``: retryable failures,
ambiguous ones (committed, response lost), latency spikes, the platform down a
while and back, a 429 storm with a long Retry-After, all of them mixed, and a
slow-loris response. Every run ends exactly once, and the loop never notices.

Longer campaign: ``python tools/torture/chaos_torture.py --trials 60 --seed 0``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import rel_helpers as rh
import rel_torture as rt
import workloads

import primeruns as pr
from primeruns.local import LocalPlatform


@pytest.fixture(autouse=True)
def _data() -> None:
    workloads.gsm8k(1)


@pytest.mark.parametrize("seed", range(len(rt.CHAOS_KINDS)), ids=list(rt.CHAOS_KINDS))
def test_chaos_run_is_exactly_once(seed: int, shared_platform: LocalPlatform, tmp_path: Path) -> None:
    trial = rt.chaos_trial(seed, tmp_path, shared_platform, n=40)
    assert trial.ok, trial.problems
    if rt.CHAOS_KINDS[seed] in ("retryable", "ambiguous", "storm429", "mixed"):
        assert trial.faults > 0  # the faults really were injected


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 30))
def test_chaos_long(seed: int, shared_platform: LocalPlatform, tmp_path: Path) -> None:
    trial = rt.chaos_trial(seed, tmp_path, shared_platform, n=150)
    assert trial.ok, trial.problems


def test_slow_loris_never_blocks_the_loop_and_finish_keeps_its_deadline(
    make_local_platform: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every response trickles one byte a second: a per-read timeout never
    fires, so only finish()'s deadline bounds the run. What did not ship stays
    in the journal, and a replay once the platform is healthy ships it once."""
    lp: LocalPlatform = make_local_platform()  # type: ignore[operator]
    home = tmp_path / "home"
    episodes = workloads.gsm8k(30)
    with rt.sdk_env(lp.url, home):
        run = pr.init(
            environments=["gsm8k"], model="m", api_key=rt.KEY, base_url=lp.url,
            runs_dir=tmp_path / "runs",
        )
        lp.set_faults(slowloris_rate=1.0, slowloris_interval_s=0.5)
        for i in range(0, len(episodes), 5):
            run.log_episodes(episodes[i : i + 5])  # never waits on the network
        done = threading.Event()

        def finish() -> None:
            run.finish(timeout=3)
            done.set()

        thread = threading.Thread(target=finish, daemon=True)
        thread.start()
        # finish() has a 3 s budget plus bounded stop waits; 60 s is "hung".
        assert done.wait(60), "finish() did not return: a slow-loris response held it"
        assert lp.set_faults(slowloris_rate=0.0)["injected"] > 0
    assert run.journal_path is not None
    trial = rt.Trial("chaos", 0, "slowloris")
    lp.stop()  # drops the trickling connections: nothing of the first process survives
    lp.start()
    rt.replay(trial, run.journal_path, lp.url, home)
    rt.check_run(trial, lp, run.journal_path, [e["id"] for e in episodes], [], max_unacked=0,
                 expect_status="COMPLETED")
    assert trial.ok, trial.problems
    assert rh.bound_run_id(run.journal_path) == run.id
