"""Review of ``ship.startup`` (an evaluation ships from threads while its
uplink process starts, then hands over): the races found, each as a test.

Over real loopback HTTP, with the uplink process held in its start-up
(``held_uplink_starts``) so that the threads phase lasts as long as a test
needs it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import module_platform
import pytest
import workloads
from sdk_helpers import API_KEY, held_uplink_starts, point_at, wait_for
from threads_first_helpers import eval_run as _eval_run
from threads_first_helpers import in_flight as _in_flight
from threads_first_helpers import landed_once
from threads_first_helpers import stored_once as _completed_once
from threads_first_helpers import threads_first as _threads_first

from primeruns.ship.factory import sink_kinds

_server, local_platform = module_platform.fixtures()


def test_threads_whose_serve_died_are_not_told_to_stand_down_while_their_shippers_ship(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``UplinkThreads._serve`` logs an unexpected error and ends, but the
    shippers ``Uplink.start`` started go on. ``Uplink.stand_down`` then
    still answers True (the close-out never began), ``UplinkThreads.stand_down``
    joins a thread already gone, and the process is told to go: two uplinks
    ship the same journal at once."""
    from primeruns.ship import uplink as uplink_module

    real = uplink_module.Uplink.register_in_background
    failed: list[bool] = []

    def boom(self: Any) -> None:
        if not failed:  # once: the threads that replace these register as ever
            failed.append(True)
            raise RuntimeError("an unexpected error in serve (injected)")
        real(self)

    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    # In this process only: the uplink process's serve is untouched.
    monkeypatch.setattr(uplink_module.Uplink, "register_in_background", boom)
    try:
        run = _eval_run(local_platform.url, runs)
        first = _threads_first(run)
        threads = first._threads
        wait_for(lambda: not threads._thread.is_alive(), what="the threads' serve to die")
        run.log_episodes(workloads.gsm8k(10))
        gate.touch()
        wait_for(lambda: first._state not in ("threads", "handing"), timeout=60, what="handover")
        still = [s.name for s in threads.uplink.shippers if s.alive]
        handed = first._state
    finally:
        gate.touch()
    run.finish(timeout=30)
    assert not (handed == "process" and still), (
        f"the process was told to go while the threads' shippers {still} still ship"
    )
    assert _completed_once(local_platform.run(run.id), 10)


def test_a_finish_during_a_handover_returns_within_its_timeout_and_grace(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow platform: a threads' shipper has a request in flight when the
    process reports ready. ``_hand_over`` stands the threads down, which
    waits for that request (up to 60 s for the platform, 300 s for an
    upload); ``finish(timeout=1)`` meanwhile waits in ``ThreadsFirst.claim_back``
    for the handover with no bound, so it returns only once the request
    does, far past its timeout plus the close-out grace (10 s)."""
    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    try:
        run = _eval_run(local_platform.url, runs)
        first = _threads_first(run)
        journal = run._recorder.journal
        assert journal is not None
        names = list(sink_kinds("eval"))
        local_platform.set_faults(latency_ms=25_000)
        run.log_episodes(workloads.gsm8k(5))
        wait_for(
            lambda: any(journal.cursor(n).inflight is not None for n in names),
            what="a batch in flight from the threads",
        )
        gate.touch()
        wait_for(lambda: first._state == "handing", timeout=60, what="the handover to begin")
        run.finish(timeout=1)
        # It returned within its timeout and grace (1 + 10 s), before the
        # threads' 25 s request it used to wait for: still standing down.
        assert first._state == "handing"
    finally:
        gate.touch()
        local_platform.set_faults(latency_ms=0)
    # The handover completes behind it, and whichever end ships then ships
    # nothing twice (what the 1 s budget left stays in the journal).
    wait_for(lambda: first._state != "handing", timeout=120, what="the handover to end")
    if first._state == "process":
        assert first._process.wait_exit(120)
    stored = local_platform.run(run.id)
    traces, samples = stored["traces"], stored["samples"]
    assert traces["episodes"] == traces["distinct_episodes"] <= 5, traces
    assert samples["rows"] == samples["distinct"] <= 5, samples


_EXIT_WITHOUT_FINISH = """
import sys
sys.path.insert(0, {tests!r})
import workloads
import primeruns as pr
run = pr.init(environments=["gsm8k"], model="m", api_key={key!r}, base_url={url!r},
              runs_dir={runs!r})
run.log_episodes(workloads.gsm8k({n}))
print(run.id, run._supervisor.uplink._state, flush=True)
"""


def test_an_exit_without_finish_in_the_threads_phase_hands_over_and_lands_once(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """atexit (``grace=False``) while the threads ship: ``closing`` hands
    over at once, and the process closes the run out after the interpreter
    is gone, every episode landed once."""
    import subprocess

    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    n = 40
    code = _EXIT_WITHOUT_FINISH.format(
        tests=str(Path(__file__).resolve().parents[1]),
        key=API_KEY,
        url=local_platform.url,
        runs=str(runs),
        n=n,
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    run_id, state = done.stdout.split()
    stored = wait_for(
        lambda: (s := local_platform.run(run_id))["status"] != "RUNNING" and s,
        timeout=60,
        what="the run closed out",
    )
    assert state == "threads", state  # the exit came in the threads phase
    assert landed_once(stored, n), stored["traces"]
    samples = stored["samples"]
    assert samples["rows"] == samples["distinct"] == n, samples


def test_an_uplink_process_killed_during_the_stand_down_is_replaced_and_nothing_is_lost(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process reported ready, then was SIGKILLed while the threads
    stood down: the handover still tells the dead process to go (nobody
    ships until a flush or the finish notices, ``replace_if_dead``); then
    threads ship, and every episode lands once."""
    import os
    import signal

    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    try:
        run = _eval_run(local_platform.url, runs)
        first = _threads_first(run)
        local_platform.set_faults(latency_ms=4000)
        run.log_episodes(workloads.gsm8k(5))
        wait_for(lambda: _in_flight(run), what="a batch in flight from the threads")
        gate.touch()
        wait_for(lambda: first._state == "handing", timeout=60, what="the handover to begin")
        os.kill(first._process.pid, signal.SIGKILL)
        local_platform.set_faults(latency_ms=0)
        wait_for(lambda: first._state != "handing", timeout=60, what="the handover to end")
        run.log_episodes(workloads.gsm8k(10)[5:])
        # Shipped on with no flush() to notice: threads in this process.
        shipped_on = True
        try:
            wait_for(
                lambda: local_platform.run(run.id)["traces"]["episodes"] >= 10,
                timeout=20,
                what="the episodes logged after the handover to ship",
            )
        except AssertionError:
            shipped_on = False
        assert run.flush(timeout=60)
        run.finish(timeout=60)
    finally:
        gate.touch()
        local_platform.set_faults(latency_ms=0)
    assert _completed_once(local_platform.run(run.id), 10)
    assert shipped_on, "handed over to a dead process: nothing shipped until a flush"


_KILLED_IN_HANDOVER = """
import os, sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
import sdk_helpers, workloads
import primeruns as pr
import primeruns.ship.link as link
import primeruns.ship.startup as startup
stand_in, gate = sdk_helpers.gated_interpreter(Path({tmp!r}))
link.sys = sdk_helpers.GatedSys(stand_in)
startup._WARM_AFTER_S = startup._CATCH_UP_S = 0.0  # hand over with the batches in flight
run = pr.init(environments=["gsm8k"], model="m", api_key={key!r}, base_url={url!r},
              runs_dir={runs!r})
first = run._supervisor.uplink
print("run", run.id, flush=True)
sys.stdin.readline()  # the platform is slow now
run.log_episodes(workloads.gsm8k({n}))
journal = run._recorder.journal
sdk_helpers.wait_for(
    lambda: any(journal.cursor(s).inflight is not None for s in ("traces", "eval_samples")),
    timeout=60, what="a batch in flight",
)
gate.touch()
sdk_helpers.wait_for(lambda: first._state != "threads", timeout=60, what="the handover")
print(first._state, flush=True)
sys.stdin.readline()  # until the signal
"""


@pytest.mark.parametrize("signum", ["SIGKILL", "SIGTERM"])
def test_a_producer_killed_during_the_stand_down_is_shipped_once_and_closed_as_crashed(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: str
) -> None:
    """SIGKILL: the process sees its producer die and ships from the
    offsets. SIGTERM: the producer's handler finishes the run (cancelled)
    while the threads stand down, then dies of the signal."""
    import os
    import signal
    import subprocess

    import procs

    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    n = 20
    code = _KILLED_IN_HANDOVER.format(
        tests=str(Path(__file__).resolve().parents[1]),
        tmp=str(tmp_path),
        key=API_KEY,
        url=local_platform.url,
        runs=str(runs),
        n=n,
    )
    proc = procs.start(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        run_id = proc.stdout.readline().split()[1]
        local_platform.set_faults(latency_ms=3000)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "handing"
        if signum == "SIGTERM":
            # Its handler runs in the main thread, which goes on from that
            # line into a read of stdin: a signal landing on the way in is
            # handled when the read ends, i.e. never. Sent once it is in there.
            procs.wait_until_asleep(proc.pid)
        os.kill(proc.pid, getattr(signal, signum))  # the producer alone
        proc.wait(timeout=120)
    finally:
        local_platform.set_faults(latency_ms=0)
    stored = wait_for(
        lambda: (s := local_platform.run(run_id))["status"] != "RUNNING" and s,
        timeout=90,
        what="the uplink process to close the run",
    )
    if signum == "SIGKILL":
        assert stored["status"] == "FAILED" and "crash" in (stored["error_message"] or "")
    else:
        assert "SIGTERM" in (stored["error_message"] or ""), stored
    assert landed_once(stored, n), stored["traces"]
    samples = stored["samples"]
    assert samples["rows"] == samples["distinct"] == n, samples


@pytest.mark.parametrize("latency_ms", [0, 6000])
def test_a_journal_deleted_in_the_threads_phase_is_rehomed_and_lands_once(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, latency_ms: int
) -> None:
    """``stop_for_move`` begins the handover (the threads hand over to a
    process that is not even ready, which is then killed), the journal is
    re-created at a later append and a new uplink ships it. With a slow
    platform, the log calls go on while the threads' request is in flight:
    none waits for it (the first version waited inside a log call)."""
    import shutil

    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    episodes = workloads.gsm8k(2000)
    logged, mid_handover = 20, 0
    try:
        run = _eval_run(local_platform.url, runs)
        first = _threads_first(run)
        local_platform.set_faults(latency_ms=latency_ms)
        run.log_episodes(episodes[:logged])
        if latency_ms:
            wait_for(lambda: _in_flight(run), what="a batch in flight from the threads")
        shutil.rmtree(runs)
        assert run.journal_path is not None

        def moved() -> bool:
            nonlocal logged, mid_handover
            run.log_episodes([episodes[logged]])
            logged += 1
            mid_handover += first._state == "handing"
            assert run._supervisor is not None
            return run._supervisor.uplink is not first

        wait_for(moved, timeout=120, what="the journal's move")
        assert run.journal_path.exists()
        local_platform.set_faults(latency_ms=0)
        run.log_episodes(episodes[logged : logged + 20])
        logged += 20
        run.finish(timeout=60)
    finally:
        gate.touch()
        local_platform.set_faults(latency_ms=0)
    assert _completed_once(local_platform.run(run.id), logged)
    if latency_ms:
        assert mid_handover > 0  # log calls returned while the threads stood down


def test_a_sink_the_threads_retired_does_not_make_a_flush_after_the_handover_give_up(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform fails in the first seconds: the threads retire the
    evaluation's sinks and record that standing in the journal. The
    process then takes over and ships every sink again (a fresh shipper is
    active), but the recorded standing still says retired until one of
    its own changes: ``flush()`` reads it and gives up at once."""
    from primeruns.ship import ledger

    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    try:
        run = _eval_run(local_platform.url, runs)
        first = _threads_first(run)
        journal = run._recorder.journal
        assert journal is not None
        local_platform.set_faults(retryable_rate=1.0, statuses=[503], retry_after=0.01)
        run.log_episodes(workloads.gsm8k(5))
        wait_for(
            lambda: all(ledger.read_standing(journal, n).retired for n in sink_kinds("eval")),
            timeout=60,
            what="the threads to retire the sinks",
        )
        local_platform.set_faults(retryable_rate=0.0)
        gate.touch()
        wait_for(lambda: first._state == "process", timeout=60, what="the handover")
        wait_for(first.begun, timeout=60, what="the process to take the claim")
        run.log_episodes(workloads.gsm8k(10)[5:])
        flushed = run.flush(timeout=30)
        run.finish(timeout=30)
    finally:
        gate.touch()
        local_platform.set_faults(retryable_rate=0.0)
    assert _completed_once(local_platform.run(run.id), 10)
    assert flushed, "flush() gave up on the threads' stale standing while the process shipped"


def test_flushes_across_the_handover_each_return_true_and_nothing_lands_twice(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Log and flush from init() on, with a flush on another thread too,
    while the process starts and takes over: every flush returns True
    (progress marks change epoch at the handover; none is missed)."""
    import threading

    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    local_platform.set_faults(latency_ms=30)
    episodes = workloads.gsm8k(120)
    results: list[tuple[str, bool]] = []
    try:
        run = _eval_run(local_platform.url, runs)
        first = _threads_first(run)
        states = set()

        def other() -> None:
            for _ in range(15):
                results.append(("other", run.flush(timeout=30)))

        helper = threading.Thread(target=other)
        helper.start()
        for i in range(0, 120, 4):
            run.log_episodes(episodes[i : i + 4])
            results.append((first._state, run.flush(timeout=30)))
            states.add(first._state)
        helper.join()
        run.finish(timeout=30)
    finally:
        local_platform.set_faults(latency_ms=0)
    assert all(ok for _, ok in results), results
    assert _completed_once(local_platform.run(run.id), 120)
    assert "process" in states, states  # the handover came while it logged


def test_a_stand_down_that_raises_keeps_the_process_waiting_and_the_threads_shipping(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Uplink.stand_down`` reads the journal (the binding): on a journal
    closed under it (an exit that waited no time) it raises. The handover
    must then neither stay half-way (HANDING for ever) nor claim the process
    back (at an exit, it is what ships the rest once this producer is gone)."""
    from primeruns.exceptions import JournalError
    from primeruns.ship import uplink as uplink_module

    real = uplink_module.Uplink.stand_down
    raised: list[bool] = []

    def stand_down(self: Any) -> bool:
        if not raised:
            raised.append(True)
            raise JournalError("journal is closed (injected)")
        return bool(real(self))

    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setattr(uplink_module.Uplink, "stand_down", stand_down)
    try:
        run = _eval_run(local_platform.url, runs)
        first = _threads_first(run)
        run.log_episodes(workloads.gsm8k(5))
        gate.touch()
        wait_for(lambda: raised, timeout=60, what="the stand-down to raise")
        wait_for(lambda: first._state != "handing", timeout=10, what="the handover to end")
        state = first._state
        kept = first._process.alive() and not first._process.begun()
        run.log_episodes(workloads.gsm8k(10)[5:])
        run.finish(timeout=30)
    finally:
        gate.touch()
    assert state == "threads" and kept, (state, kept)
    assert _completed_once(local_platform.run(run.id), 10)


def test_an_exit_in_the_threads_phase_waits_for_the_process_to_close_the_run_out(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """atexit (``_at_exit``: ``wait_closeout(grace=False)``) while the
    threads ship and the process is still starting: ``closing`` hands over
    and the exit waits (up to its ``wait``) for the process's close-out. A
    handover started in the background with the state still ``threads``
    lets ``wait_exit`` wait on the threads instead, which end at once: the
    exit then returns with the run not closed out."""
    import threading

    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    try:
        run = _eval_run(local_platform.url, runs)
        first = _threads_first(run)
        run.log_episodes(workloads.gsm8k(5))

        def let_go_once_handing() -> None:
            # The process starts only once the exit has begun the handover.
            wait_for(lambda: first._state != "threads", timeout=60, what="the handover")
            gate.touch()

        threading.Thread(target=let_go_once_handing, daemon=True).start()
        run._at_exit(time.monotonic() + 30)
        status = local_platform.run(run.id)["status"]
    finally:
        gate.touch()
    assert status != "RUNNING", "the exit returned with the run not closed out"
    stored = wait_for(
        lambda: (s := local_platform.run(run.id))["status"] != "RUNNING" and s, timeout=60
    )
    assert landed_once(stored, 5)
