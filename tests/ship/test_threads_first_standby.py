"""Second review of ``ship.startup`` / ``ship.standby`` (an evaluation ships
from threads while its uplink process waits on standby, then hands over):
the defects found, each as a test.

Over real loopback HTTP. No timing assertion: orders and outcomes only.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import module_platform
import pytest
import workloads
from sdk_helpers import GatedSys, point_at, wait_for
from threads_first_helpers import eval_run as _eval_run
from threads_first_helpers import stored_once as _completed_once
from threads_first_helpers import threads_first as _threads_first

from primeruns.ship.startup import ThreadsFirst

_server, local_platform = module_platform.fixtures()


def test_an_interpreter_stand_in_that_runs_python_as_its_child_waits_for_go(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sys.executable`` may be a stand-in that runs the interpreter as its
    child instead of exec'ing it (a shell wrapper of a module system, a
    launcher). ``standby.wait`` (and ``link.await_go``) loop only ``while
    os.getppid() == producer``: the parent is the stand-in, so the loop never
    runs, ``--await-go`` is dropped as if the producer were dead, and the
    process takes the claim at once and ships beside the threads (two
    uplinks of one journal: records twice, two close-outs). Once it may
    ship, ``PipeProducerLink`` likewise took the producer for dead."""
    import primeruns.ship.link as link

    stand_in = tmp_path / "python-wrapper"
    stand_in.write_text(f'#!/bin/sh\n{shlex.quote(sys.executable)} "$@"\n')  # no exec
    stand_in.chmod(0o700)
    monkeypatch.setattr(link, "sys", GatedSys(stand_in))
    # The handover is held until the test lets it go: until then the
    # process must wait for go, whatever its parent is.
    hold = threading.Event()
    real_catch_up = ThreadsFirst._when_caught_up

    def held_catch_up(self: ThreadsFirst) -> None:
        hold.wait(120)
        real_catch_up(self)

    monkeypatch.setattr(ThreadsFirst, "_when_caught_up", held_catch_up)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    episodes = workloads.gsm8k(40)
    try:
        run = _eval_run(local_platform.url, runs)
        first = _threads_first(run)
        process = first._process
        run.log_episodes(episodes[:20])
        # Ready (it reports once warm and waits for go) or, wrongly, shipping.
        wait_for(
            lambda: process.begun() or process.progress_mark() != 0,
            timeout=60,
            what="the uplink process to report ready",
        )
        assert not process.begun(), "the uplink process took the claim before go"
        hold.set()
        wait_for(lambda: first._state not in ("threads", "handing"), timeout=60, what="handover")
        assert first._state == "process"
        run.log_episodes(episodes[20:])
        run.finish(timeout=60)
    finally:
        hold.set()
    assert _completed_once(local_platform.run(run.id), 40)


def test_a_hurry_the_uplink_reads_before_it_is_set_up_is_not_dropped(tmp_path: Path) -> None:
    """``_complete_handover`` writes *go*, then *hurry*, as two writes:
    ``standby.wait`` (or ``link.await_go``) may read the *go* alone, and the
    *hurry* is then read by ``PipeProducerLink``'s thread, which starts
    before ``uplink_main`` sets ``link.on_hurry``: it is dropped, and the
    flush() it was for waits out the shippers' linger."""
    import os

    from primeruns.journal import Journal
    from primeruns.ship.link import HURRY, PipeProducerLink

    wake_r, wake_w = os.pipe()
    progress_r, progress_w = os.pipe()
    journal = Journal.create(tmp_path / "runs")
    os.write(wake_w, HURRY)  # left behind the go by the standby
    link = PipeProducerLink(journal, wake_r, progress_w, producer=os.getppid())
    try:
        link.wait(None)  # its thread read the hurry (there is no uplink yet)
        hurried: list[bool] = []
        link.on_hurry = lambda: hurried.append(True)  # as uplink_main does, next
        assert hurried == [True]
    finally:
        os.close(wake_w)
        link._thread.join()
        for fd in (progress_r, progress_w, wake_r):
            os.close(fd)
        journal.close()


def _exists(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not reaped yet by its new parent) is gone too.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1][:1] != "Z"


def test_a_move_stops_the_uplink_itself_under_an_interpreter_stand_in_that_runs_it_as_a_child(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Supervisor.stop_for_move`` (and ``UplinkProcess.claim_back``) kill
    ``pid``: under a stand-in that runs the interpreter as its child, that
    is the stand-in, and the uplink itself lives on over the deleted
    journal's handles beside the one the move starts: once its wake pipe
    closes it closes the run out as crashed from there (two close-outs;
    records shipped after the copy's offsets, twice). The uplink is frozen
    here so that only a kill can end it."""
    import os
    import signal

    import primeruns.ship.link as link

    stand_in = tmp_path / "python-wrapper"
    stand_in.write_text(f'#!/bin/sh\n{shlex.quote(sys.executable)} "$@"\n')  # no exec
    stand_in.chmod(0o700)
    monkeypatch.setattr(link, "sys", GatedSys(stand_in))
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    episodes = workloads.gsm8k(400)
    run = _eval_run(local_platform.url, runs)
    first = _threads_first(run)
    logged = 20
    run.log_episodes(episodes[:logged])
    # (past "handing": the threads' stand-down takes a moment)
    wait_for(lambda: first._state not in ("threads", "handing"), timeout=60, what="the handover")
    assert first._state == "process" and first.pid is not None
    wait_for(first._process.begun, what="the uplink process to take the claim")
    wrapper = first.pid
    children = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    assert len(children) == 1
    uplink = int(children[0])
    os.kill(uplink, signal.SIGSTOP)
    try:
        shutil.rmtree(runs)

        def moved() -> bool:
            nonlocal logged
            run.log_episodes([episodes[logged]])
            logged += 1
            assert run._supervisor is not None
            return run._supervisor.uplink is not first

        wait_for(moved, timeout=120, what="the journal's move")
        wait_for(lambda: not _exists(uplink), what="the uplink the move stopped to be gone")
        run.finish(timeout=60)
    finally:
        if _exists(uplink):
            os.kill(uplink, signal.SIGKILL)
    stored = local_platform.run(run.id)
    assert _completed_once(stored, logged)
    # (closed out once, by the uplink of the re-created journal: its count)
    assert stored["summary"]["prime_runs"]["traces_episodes_written"] == logged
