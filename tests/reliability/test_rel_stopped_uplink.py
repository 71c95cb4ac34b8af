"""An uplink process stopped (SIGSTOP) while its producer finishes.

Before, ``finish()`` waited out its timeout plus the grace for a process
that could not move, then returned with the run still RUNNING on the
platform and the records logged during the stop unshipped; resumed later,
that uplink found its budget spent and closed the run as COMPLETED without
them (only ``primeruns replay`` shipped them). Now the producer sees the
stop, kills that process (its offsets are in the journal, as after any kill)
and ships the rest from threads within the finish's budget.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import one_run_oracle as oracle
import rel_torture as rt
import workloads
from sdk_helpers import platform_episode_ids, wait_for

from primeruns.local import LocalPlatform


def test_an_uplink_stopped_through_the_finish_is_replaced_and_the_run_closed(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    lp = shared_platform
    episodes = workloads.gsm8k(40)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        uplink = run._supervisor.uplink  # type: ignore[union-attr]
        wait_for(uplink.begun, timeout=60, what="the uplink process to begin")
        pid = uplink.pid
        assert pid is not None
        run.log_episodes(episodes[:20])
        os.kill(pid, signal.SIGSTOP)
        try:
            run.log_episodes(episodes[20:])
            run.finish(timeout=20)
            closed = oracle.status(lp, run.id)  # as finish() left it
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert closed == "COMPLETED", (closed, run.errors)
    stored = platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == {e["id"] for e in episodes}, (len(stored), run.errors)
    assert max(stored.values()) == 1
