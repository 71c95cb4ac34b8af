"""An evaluation's ``init()`` that fails after its uplink started, and an
uplink process that dies in its start-up (``ship.startup``, ``ship.link``).

Over real loopback HTTP. No timing assertion: orders and outcomes only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import module_platform
import procs
import pytest
import workloads
from sdk_helpers import API_KEY, GatedSys, point_at, wait_for
from threads_first_helpers import eval_run as _eval_run
from threads_first_helpers import stored_once, threads_first

import primeruns.opening as opening
from primeruns.journal import EntryKind, Journal
from primeruns.ship.link import kill_uplink
from primeruns.ship.startup import ThreadsFirst

_server, local_platform = module_platform.fixtures()


def _uplinks(but: frozenset[int] = frozenset()) -> list[int]:
    """This process's children that are uplink processes (on standby or not),
    zombies left out (killed, not reaped yet: gone too), but ``but``."""
    return [
        pid
        for pid in set(procs.children(os.getpid())) - but
        if procs.uplink_journal(pid) is not None
    ]


@pytest.mark.parametrize("when", ["on-standby", "shipping"])
def test_an_init_that_fails_after_its_uplink_started_leaves_no_uplink_behind(
    when: str,
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Ctrl-C (a notebook's interrupt) lands in ``init()`` after
    ``go_online`` started the uplink: the run handle is never returned, so
    nothing finishes the run, and the uplink process waited for its producer's
    death (on standby, or shipping once the threads handed over to it): one
    process more per failed ``init()`` of a notebook that retries. The
    journal is left closed and whole, for ``primeruns replay`` to close the
    registered run out. (``shipping``: an init() slow enough for the
    threads to have handed over first.)"""
    before = frozenset(_uplinks())  # (another test's, not this one's to judge)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    real_run = opening.Run

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        uplink = kwargs["supervisor"].uplink
        assert isinstance(uplink, ThreadsFirst)
        if when == "shipping":
            wait_for(uplink.begun, timeout=60, what="the uplink process to take over")
        else:
            assert _uplinks(before), "no uplink process on standby"
        raise KeyboardInterrupt

    monkeypatch.setattr(opening, "Run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _eval_run(local_platform.url, runs)
    monkeypatch.setattr(opening, "Run", real_run)
    try:
        wait_for(lambda: not _uplinks(before), timeout=30, what="no uplink process left")
    finally:
        for pid in _uplinks(before):  # (not left to the next test)
            kill_uplink(pid)
    (path,) = [p for p in runs.iterdir() if not p.name.startswith(".")]
    with Journal.open(path) as journal:  # whole, and held by no process any more
        run_id = journal.get_meta("platform")["run_id"]
        assert journal.read(0, kinds={EntryKind.RUN_OPEN}).entries
        assert not journal.read(0, kinds={EntryKind.FINISH}).entries
    # The platform registered the run: replay closes it out (as crashed).
    from cli_helpers import cli  # (on the path once threads_first_helpers is imported)

    assert local_platform.run(run_id)["status"] == "RUNNING"
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, out, err = cli(capsys, "replay", str(path))
    assert code == 0, out + err
    assert local_platform.run(run_id)["status"] == "FAILED"
    # A retry in the same process gets a run, and its uplink, as ever.
    run = _eval_run(local_platform.url, runs)
    run.finish(timeout=60)
    assert local_platform.run(run.id)["status"] == "COMPLETED"
    assert not _uplinks(before)


def test_an_interrupt_while_the_uplink_process_is_being_started_leaves_none_behind(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C lands inside the uplink's start, after its process was
    spawned (naming it in the journal's lock file): no handle reaches the
    supervisor, so nothing else would stop that process. It is killed
    there; the journal is left, and a retry starts a run as ever."""
    before = frozenset(_uplinks())
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    real_name = Journal.name_uplink

    def interrupted(self: Journal, pid: int) -> None:
        # A child of this process (not yet by its command line: Popen may
        # return while the kernel still sets the new program's arguments up,
        # and /proc reads them empty for that moment).
        assert pid in procs.children(os.getpid()), "the uplink process was not spawned yet"
        raise KeyboardInterrupt

    monkeypatch.setattr(Journal, "name_uplink", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _eval_run(local_platform.url, runs)
    monkeypatch.setattr(Journal, "name_uplink", real_name)
    leaked = _uplinks(before)
    for pid in leaked:  # (not left to the next test)
        kill_uplink(pid)
    assert not leaked
    run = _eval_run(local_platform.url, runs)
    run.finish(timeout=60)
    assert local_platform.run(run.id)["status"] == "COMPLETED"
    assert not _uplinks(before)


def test_an_uplink_process_that_dies_in_its_start_up_is_not_taken_for_ready(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``UplinkProcess.wait_ready`` counted its progress pipe's end of file
    as the ready report (``ProgressReader`` counts it as news) and trusted
    ``alive()`` for the rest; but a dying process's descriptors are closed
    before its parent can reap it (and a stand-in of the interpreter may
    outlive the interpreter it ran), so a process that died in its start-up
    was handed over to: the threads stood down, *go* went to a dead process,
    and nothing shipped until a ``flush()`` or ``finish()`` found it dead and
    replaced it. The stand-in here closes that end and lingers, so the
    window is wide: the threads must keep shipping, for good."""
    import logging

    import primeruns.ship.link as link

    stand_in = tmp_path / "python-dying"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        "args = sys.argv[1:]\n"
        "os.close(int(args[args.index('--progress-fd') + 1]))  # as at its death\n"
        "time.sleep(5)  # not reaped yet\n"
        "sys.exit(1)\n"
    )
    stand_in.chmod(0o700)
    monkeypatch.setattr(link, "sys", GatedSys(stand_in))
    answers: list[bool] = []
    real_wait_ready = link.UplinkProcess.wait_ready

    def wait_ready(self: link.UplinkProcess, timeout: float) -> bool:
        answers.append(real_wait_ready(self, timeout))
        return answers[-1]

    monkeypatch.setattr(link.UplinkProcess, "wait_ready", wait_ready)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _eval_run(local_platform.url, runs)
    first = threads_first(run)
    run.log_episodes(workloads.gsm8k(20))
    wait_for(lambda: first._state not in ("threads", "handing"), timeout=60, what="the outcome")
    assert first._state == "threads-only", answers
    assert True not in answers
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run.log_episodes(workloads.gsm8k(40)[20:])
        assert run.flush(timeout=60)
        run.finish(timeout=60)
    assert "exited before the run was finished" not in caplog.text  # nothing to replace
    assert stored_once(local_platform.run(run.id), 40)
