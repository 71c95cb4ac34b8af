"""Inode exhaustion (issue #28): a filesystem out of inodes with space to
spare. The journal's records are dropped and counted as on a full disk, and
the warning names the inodes, since ``df -h`` shows plenty of room and
"byte budget or disk" sent users looking in the wrong place."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import primeruns as pr
from primeruns.exceptions import JournalError


def _cannot(why: str) -> None:
    # CI runs as root and can mount: a skip there would hide a broken test.
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run this test", pytrace=False)
    pytest.skip(why)


@pytest.fixture
def few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs with 64 inodes (root only; skipped elsewhere, failed under CI)."""
    if os.geteuid() != 0:
        _cannot("mounting a tmpfs needs root")
    target = tmp_path / "few"
    target.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=64,mode=0700", "tmpfs", str(target)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        _cannot(f"cannot mount here: {result.stderr.strip()[:200]}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def _use_every_inode(where: Path) -> None:
    """Take every free inode (again: the journal's mover frees some as it
    moves spool segments into LMDB)."""
    where.mkdir(exist_ok=True)
    for _ in range(1000):
        try:
            (where / os.urandom(8).hex()).touch()
        except OSError:
            return
    raise AssertionError("the filesystem never ran out of inodes")


def test_a_run_started_without_free_inodes_is_told_so(
    few_inodes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (few_inodes / "runs").mkdir()
    _use_every_inode(few_inodes / "filler")
    with pytest.raises(JournalError, match="no free inodes") as caught:
        pr.init(environments=["gsm8k"], mode="offline", runs_dir=few_inodes / "runs")
    assert "MiB of space still free" in str(caught.value)


def test_records_dropped_for_want_of_inodes_say_inodes_not_bytes(
    few_inodes: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drop is the spool's own: its next segment cannot be created (the
    open segment is closed, as after a write it could not take back)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=few_inodes / "runs")
    _use_every_inode(few_inodes / "filler")
    journal = run._recorder.journal
    assert journal is not None
    journal._appender._spool.close()  # the next append opens a segment
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run.log_episodes([{"id": "e1", "traces": []}])
    run.finish()
    assert run.dropped_records >= 1  # dropped and counted, nothing raised
    full = [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]
    assert full, caplog.text
    assert "no free inodes" in full[0] and "byte budget or disk" not in full[0]
