"""A new journal's name: stamped with its creation time, never earlier than a
journal made before it in its runs directory, at a cost that does not grow
with what the directory holds."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import procs
import pytest

from primeruns.journal import Journal
from primeruns.journal.stamps import MARK_NAME


def _stamp(moment: datetime) -> str:
    return f"{moment:%Y%m%d-%H%M%S}"


def test_a_journal_is_named_without_listing_its_runs_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init() names its journal on the producer's path: a runs directory of
    100,000 past runs listed there made each init() pay for all of them
    (10 ms a run at 10,000 of them, 91 ms at 100,000)."""
    runs = tmp_path / "runs"
    Journal.create(runs).close()
    listed: list[str] = []
    listdir, scandir = os.listdir, os.scandir

    def counted_listdir(path: Any = ".") -> list[str]:
        listed.append(os.fspath(path))
        return listdir(path)

    def counted_scandir(path: Any = ".") -> Any:
        listed.append(os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "listdir", counted_listdir)
    monkeypatch.setattr(os, "scandir", counted_scandir)
    Journal.create(runs).close()
    assert os.fspath(runs) not in listed


def test_a_link_named_as_a_later_journal_does_not_stamp_new_ones(tmp_path: Path) -> None:
    """No link in a runs directory is followed: one named for a far later
    time, to a journal elsewhere, named every journal made after it as made
    then, in an order among them left to their random tails."""
    runs = tmp_path / "runs"
    elsewhere = tmp_path / "elsewhere"
    Journal.create(elsewhere, local_id="29991231-235959-aaaaaaaa").close()
    Journal.create(runs).close()
    (runs / "29991231-235959-aaaaaaaa").symlink_to(elsewhere / "29991231-235959-aaaaaaaa")
    made = Journal.create(runs)
    made.close()
    assert made.path.name[:15] <= _stamp(datetime.now(UTC))


_HOLD_MARK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # held until the test closes the pipe
"""

_INIT_OFFLINE = """
import sys
import primeruns as pr
run = pr.init(kind="train", model="m", team_id="t", mode="offline", runs_dir=sys.argv[1])
run.finish()
"""


def test_a_journal_is_made_while_another_process_holds_the_mark_forever(
    tmp_path: Path,
) -> None:
    """A process stopped (SIGSTOP) or hung on a dead file system while holding
    the runs directory's mark lock made every init() there wait for as long
    as it held it: the lock is waited for a bounded time, then the journal is
    named without it, no earlier than the mark it read."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / MARK_NAME).write_bytes(b"29990101-000000")
    holder = procs.start(
        [sys.executable, "-c", _HOLD_MARK, str(runs / MARK_NAME)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    # The timeout detects a wait with no end; it is no bound on the wait.
    subprocess.run([sys.executable, "-c", _INIT_OFFLINE, str(runs)], timeout=120, check=True)
    made = [name for name in os.listdir(runs) if not name.startswith(".")]
    assert len(made) == 1 and made[0].startswith("29990101-000000-")
    assert (runs / MARK_NAME).read_bytes() == b"29990101-000000"
    assert holder.poll() is None  # it held the lock throughout
