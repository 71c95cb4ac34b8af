"""A spool's torn tail (what a power cut leaves under ``durability="process"``)
is damage that ``show``, ``sync`` and ``replay`` report, with how many bytes
and entries it held, once the machine rebooted since the journal's last
writer; after a crash of the writing process alone it is expected (a call
that never returned) and is no damage."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from sdk_helpers import API_KEY, kill_producer, point_at
from spooled import killed_segment

from primeruns.journal import EntryKind, Journal, spool, torn

# An append header saying 3 entries in 300 bytes, and 100 bytes of them.
TORN = spool.APPEND.pack(b"PS", 1, 3, 300) + b"x" * 100


def _crashed_with_a_torn_tail(runs: Path) -> Path:
    journal, _ = kill_producer([str(runs), "eval", "10"], 11)
    [(_, newest)] = spool.list_segments(journal)[-1:]
    with open(journal / newest, "ab") as segment:
        segment.write(TORN)
    return journal


def _rebooted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torn, "boot_id", lambda: "a boot since the writer's")


def _says_torn(text: str) -> bool:
    return f"a torn tail of {len(TORN)} bytes (an append of 3 entries)" in text


def test_a_torn_tail_after_a_reboot_is_damage_to_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = _crashed_with_a_torn_tail(point_at(monkeypatch, tmp_path, None))
    code, out, _ = cli(capsys, "show", str(journal))
    assert code == 0 and "torn tail" not in out  # the writer crashed, the machine did not
    _rebooted(monkeypatch)
    code, out, _ = cli(capsys, "show", str(journal))
    assert code == 4 and _says_torn(out), out


@pytest.mark.parametrize("command", ["sync", "replay"])
def test_a_torn_tail_after_a_reboot_is_damage_to_sync_and_replay(
    command: str,
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    journal = _crashed_with_a_torn_tail(runs)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    monkeypatch.setenv("PRIME_API_BASE_URL", local_platform.url)
    _rebooted(monkeypatch)
    target = ["--runs-dir", str(runs)] if command == "sync" else [str(journal)]
    code, out, err = cli(capsys, command, *target)
    assert code == 4 and _says_torn(out + err), out + err
    assert API_KEY not in out + err
    assert os.path.isdir(journal)


def test_a_torn_tail_of_a_journal_written_with_fsync_is_no_damage_after_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``durability="fsync"`` every append is synced before its call
    returns: a tail a power cut tore is a call that never returned, never
    one a caller was told was kept. ``show`` called it damage and lost, and
    exited 4, as for a journal written without."""
    runs = point_at(monkeypatch, tmp_path, None)
    journal = Journal.create(runs, local_id="fsynced", durability="fsync")
    journal._mover.stop()
    for n in range(3):
        journal.append(EntryKind.EPISODE, [b'{"n":%d}' % n])
    segment, data, _ = killed_segment(journal)
    segment.write_bytes(bytes(data) + TORN)
    _rebooted(monkeypatch)
    code, out, _ = cli(capsys, "show", str(segment.parent))
    assert code == 0 and "torn tail" not in out, out
