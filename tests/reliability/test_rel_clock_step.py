"""Deadlines are monotonic across the producer and its uplink (issue #28).

The wall clock steps +2 h (NTP, a VM resumed) between ``finish()`` and the
uplink reading its entry: libfaketime puts the uplink's wall clock two hours
ahead of the producer's, with the monotonic clocks left alone, as a real
step does. Before, the uplink computed its deadline as ``at + timeout -
time.time()`` across the two processes: 90 of 90 episodes unshipped, the run
COMPLETED and ``run.errors`` empty. Now every episode ships.

libfaketime is Debian's ``faketime`` package (``.ci/run`` installs it); a
developer's machine without it skips, saying so, and CI fails instead.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import rel_helpers as rh
import rel_torture as rt
import workloads
from sdk_helpers import wait_for

import primeruns as pr
from primeruns.journal import EntryKind
from primeruns.local import LocalPlatform

_LIBS = [
    Path(d) / "faketime" / "libfaketime.so.1"
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib")
]
LIBFAKETIME = next((p for p in _LIBS if p.exists()), None)

if LIBFAKETIME is None:
    if os.environ.get("CI"):
        pytest.fail(
            "CI is set but libfaketime is missing (apt-get install faketime)", pytrace=False
        )
    pytest.skip("no libfaketime: apt-get install faketime", allow_module_level=True)


def _wait_for_finish_entry(run: pr.Run) -> None:
    """Until ``finish()`` (in another thread) has journaled its entry."""
    journal = run._recorder.journal
    assert journal is not None
    for _ in range(6000):
        if journal.read(0, kinds={EntryKind.FINISH}, max_entries=1).entries:
            return
        time.sleep(0.01)  # polling a condition, bounded: not a timed assertion
    raise AssertionError("finish() never journaled its entry")


def test_a_wall_clock_step_before_the_uplink_reads_the_finish_ships_everything(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    lp = shared_platform
    episodes = workloads.gsm8k(90)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        # Only the uplink is started with this environment (the producer is
        # this process, already running on the real clock).
        os.environ.update(
            LD_PRELOAD=str(LIBFAKETIME), FAKETIME="+2h", FAKETIME_DONT_FAKE_MONOTONIC="1"
        )
        run = rt.eval_run(lp.url, tmp_path / "runs")
        for name in ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC"):
            del os.environ[name]
        uplink = run._supervisor.uplink  # type: ignore[union-attr]
        # The uplink process ships this run (threads here ship it until the
        # process is ready, on the producer's clock).
        wait_for(uplink.begun, timeout=60, what="the uplink process to begin")
        assert uplink.pid is not None
        # Hold the uplink still until the finish entry is journaled, so that
        # every episode is left for the close-out (as on a slow link).
        os.kill(uplink.pid, signal.SIGSTOP)
        finishing = None
        try:
            for i in range(0, len(episodes), 10):
                run.log_episodes(episodes[i : i + 10])
            finishing = threading.Thread(target=run.finish, kwargs={"timeout": 60})
            finishing.start()
            _wait_for_finish_entry(run)
        finally:
            os.kill(uplink.pid, signal.SIGCONT)
            if finishing is not None:
                finishing.join()
    assert run.status is pr.RunStatus.COMPLETED
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == {e["id"] for e in episodes}, (len(stored), run.errors)
    assert max(stored.values()) == 1
