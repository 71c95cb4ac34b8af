"""How a run ends when the producer does not say: exit, SIGTERM, fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import module_platform
import procs
import pytest
from sdk_helpers import point_at

import primeruns as pr
from primeruns.journal import EntryKind, Journal

SCRIPT = Path(__file__).resolve().parent / "endings_script.py"

# The runs of these tests are told apart by id: one server serves them all.
_server, local_platform = module_platform.fixtures()


def _start(runs: Path, url: str, how: str) -> subprocess.Popen[str]:
    return procs.start(
        [sys.executable, str(SCRIPT), str(runs), url, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    """The rest of the output, read through the buffered readers that
    ``_run_id`` used (``communicate`` would skip what they buffered)."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    proc.wait(timeout=timeout)
    return out, err


def _run_id(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("run "), line
    return line.split()[1]


def test_exit_without_finish_closes_the_run_as_crashed(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    proc = _start(runs, local_platform.url, "exit")
    run_id = _run_id(proc)
    _, err = _finish(proc)
    assert proc.returncode == 0, err[-2000:]
    stored = local_platform.run(run_id)
    assert stored["status"] == "FAILED"
    assert stored["error_message"].startswith("crashed: process exited without finishing")
    assert stored["traces"]["distinct_episodes"] == 3


def test_exit_without_finish_with_the_platform_down_is_bounded_and_says_so(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a script that never called finish() hung about 306 s at exit with
    the platform down, saying nothing. The exit now waits a bounded grace (30 s
    in all; 1 s here), says what it waits for, and names the replay command."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    proc = _start(runs, local_platform.url, "exit_quick")
    _run_id(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    local_platform.stop()
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.wait(timeout=60)  # the default finish_timeout is 300 s: this is the grace at work
    _, err = _finish(proc)
    assert proc.returncode == 0, err[-2000:]
    assert "closing it as crashed at exit, waiting up to 1 s" in err
    assert "primeruns replay" in err


def test_sigterm_journals_a_cancelled_finish_and_drains(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    proc = _start(runs, local_platform.url, "sigterm")
    run_id = _run_id(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    # The script waits in Event.wait(120) in its main thread. The signal must
    # reach that thread (not one of the SDK's), or it is handled only when the
    # wait ends, long after a scheduler's grace: 60 s is far beyond the
    # drain's 20 s and far below the wait. It is sent once the thread is in
    # the wait: one landing on its way in waits it out, whoever took it.
    procs.wait_until_asleep(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    _, err = _finish(proc)
    assert proc.returncode == -signal.SIGTERM, err[-2000:]  # the default handler still ran
    stored = local_platform.run(run_id)
    assert stored["status"] == "CANCELLED"
    assert "SIGTERM" in stored["error_message"]
    assert stored["samples"]["rows"] == 3


def test_a_forked_child_logs_into_the_parents_run_and_never_closes_it(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    proc = _start(runs, local_platform.url, "fork")
    run_id = _run_id(proc)
    out, err = _finish(proc)
    assert proc.returncode == 0, err[-2000:]
    assert "child dropped 0" in out
    assert "parent completed" in out
    stored = local_platform.run(run_id)
    assert stored["status"] == "COMPLETED"
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == 6
    assert stored["samples"]["rows"] == 6


def test_after_a_drain_stalled_by_a_platform_gone_mid_run_the_close_out_gets_the_short_allowance(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform went down mid-run: finish()'s drain spent the stall
    allowance showing it (records kept for replay), then the close-out's
    finalize was given a second whole allowance to fail in (120 s in all by
    default, where the vendor's SDK gave up in 45). It gets the shorter
    allowance of a platform never reached. Measured as the budget finalize
    is handed, in the uplink's threads, not as a time."""
    from primeruns.ship import lifecycle, uplink

    monkeypatch.setattr(uplink, "UNREACHED_S", 0.3)  # below the stall allowance here
    monkeypatch.setenv("PRIME_RUNS_STALL_S", "2")
    monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")
    budgets: list[float] = []
    real_finalize = lifecycle.Lifecycle.finalize

    def finalize(self: Any, *args: Any, deadline: float, **kwargs: Any) -> Any:
        budgets.append(deadline - time.monotonic())
        return real_finalize(self, *args, deadline=deadline, **kwargs)

    monkeypatch.setattr(lifecycle.Lifecycle, "finalize", finalize)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = pr.init(environments=["gsm8k"], model="m", api_key="k", base_url=local_platform.url,
                  runs_dir=runs)  # fmt: skip
    run.log_episodes([{"id": "e0", "traces": []}])
    assert run.flush(timeout=60)
    local_platform.stop()
    run.log_episodes([{"id": "e1", "traces": []}])
    run.finish(timeout=120)
    assert len(budgets) == 1 and budgets[0] <= 0.3, budgets
    assert run.status is pr.RunStatus.COMPLETED  # journaled: replay closes it on the platform


def test_a_sigterm_flagged_while_the_main_thread_flushes_against_a_stalled_platform_ends_the_run(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM that CPython only flagged for the main thread (one landing on
    a wait's way in leaves that state; here a thread of the producer takes it)
    was handled when the flush's wait ended: with the platform stalled, when
    flush() timed out (never, without a timeout), long after a scheduler's
    grace. The drain waits in slices of a second, and the run is cancelled."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    proc = _start(runs, local_platform.url, "flush_stalled")
    _run_id(proc)
    assert proc.stdout is not None
    journal_path = Path(proc.stdout.readline().split(maxsplit=1)[1].strip())
    assert proc.stdout.readline().strip() == "ready"
    local_platform.set_faults(latency_ms=90_000)  # nothing answers for the rest of the test
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    # A bound on a hang: the flush waits 110 s; the close-out 2 s and a grace.
    proc.wait(timeout=60)
    out, err = _finish(proc)
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    assert "flush returned" not in out
    local_platform.set_faults(latency_ms=0)
    procs.kill_uplinks_under(runs)
    journal = Journal.open(journal_path, owner=False)
    try:
        (finish,) = journal.read(0, kinds=[EntryKind.FINISH]).entries
    finally:
        journal.close()
    ended = json.loads(finish.payload)
    assert (ended["status"], ended["error"]) == ("cancelled", "terminated by SIGTERM")
