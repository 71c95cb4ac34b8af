"""A worker's records that reach the platform after its run was closed
(issue #29): the local platform keeps appends to a closed run (the contract
names a status change as what a closed run refuses, §2.3 and §3.3, and says
nothing of appends), so they land there, exactly once, and the run stays
closed with the status the parent gave it. Where nothing will ship them, the parent's ``finish()``
counts them, says why, and names the command that ships them.

The children still logging after the parent's finish (their uplink ships
into the closed run) and an offline run's children shipped by ``sync`` of
the run are in ``test_rel_fork_child.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import fork_oracle as fo
import pytest
import rel_helpers as rh
import rel_torture as rt
import workloads

import primeruns as pr
from primeruns.cli import main
from primeruns.journal.lock import read_owner
from primeruns.local import LocalPlatform


def test_a_child_left_unshipped_at_the_finish_is_named_with_its_command_and_lands_once(
    shared_platform: LocalPlatform, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A forked child and its uplink die with records unshipped (SIGKILL):
    the parent's finish() names the child, what it left, why, and the
    command; that command ships them into the closed run, once, and leaves
    the run's status as the parent closed it."""
    lp = shared_platform
    episodes = workloads.gsm8k(40)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(episodes[:10])
        assert run.flush(timeout=60)
        pid = fo.fork()
        if pid == 0:  # the child: open its journal, wait, log the rest, wait to be killed
            try:
                run.log_episodes(episodes[10:11])
                os.write(ready_w, b"o")
                os.read(go_r, 1)
                run.log_episodes(episodes[11:40])
                os.write(ready_w, b"r")
                os.read(go_r, 1)
            finally:
                os._exit(1)
        assert os.read(ready_r, 1) == b"o"
        journal = next(
            p
            for p in (tmp_path / "runs").iterdir()
            if p != run.journal_path and not p.name.startswith(".")  # not .primary, .summaries
        )
        owner = read_owner(journal)
        assert owner is not None and owner.helper_pid is not None
        os.kill(owner.helper_pid, signal.SIGSTOP)  # it ships nothing more, then dies
        os.write(go_w, b"g")
        assert os.read(ready_r, 1) == b"r"
        os.kill(pid, signal.SIGKILL)
        os.kill(owner.helper_pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with caplog.at_level("WARNING", logger="primeruns"):
            run.finish(timeout=30)
        assert lp.run(run.id)["status"] == "COMPLETED"
        said = [r.getMessage() for r in caplog.records if "forked child" in r.getMessage()]
        assert len(said) == 1, caplog.text
        assert "not shipped (it has exited and no uplink ships its journal)" in said[0]
        assert f"ship them with: primeruns replay {journal}" in said[0], said[0]
        assert not fo.landed_once(lp, run.id, episodes)  # the child's were left

        assert main(["replay", str(journal)]) == 0  # the command the warning names
    fo.assert_exactly_once(lp, run, episodes)  # closed as the parent closed it, and complete


def test_a_workers_journal_synced_after_its_run_was_closed_lands_in_it_once(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """An offline evaluation is synced and closed while one of its workers'
    journals is still elsewhere (another node's copy, fetched later); synced
    later, the worker's records land in the closed run, once, and the run's
    status stays the parent's."""
    lp = shared_platform
    episodes = workloads.gsm8k(30)
    home, runs, later = tmp_path / "home", tmp_path / "runs", tmp_path / "later"
    later.mkdir()
    with rt.sdk_env(lp.url, home):
        run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
        run.log_episodes(episodes[:10])
        worker = pr.join(run.handle())
        worker.log_episodes(episodes[10:30])
        worker.finish()
        run.finish()
        assert run.journal_path is not None and worker.journal_path is not None
        shutil.move(worker.journal_path, later / worker.journal_path.name)
        assert main(["sync", "--base-url", lp.url, str(run.journal_path)]) == 0
        run_id = rh.bound_run_id(run.journal_path, home)
        assert run_id is not None and lp.run(run_id)["status"] == "COMPLETED"
        assert fo.landed_once(lp, run_id, episodes[:10])

        late = shutil.copytree(later / worker.journal_path.name, runs / "copied-back")
        assert main(["sync", "--base-url", lp.url, "--all", "--runs-dir", str(runs)]) == 0
        assert main(["sync", "--base-url", lp.url, str(late)]) == 0  # again: nothing twice
    assert fo.landed_once(lp, run_id, episodes)
    assert lp.run(run_id)["status"] == "COMPLETED"
