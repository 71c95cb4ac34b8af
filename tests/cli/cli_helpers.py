"""Helpers for the CLI tests: run ``primeruns`` in-process or as a real
subprocess, kill a producer mid-run, and damage one journal entry on disk."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import pytest
import workloads
import zstandard
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.cli import main
from primeruns.journal.frames import FLAG_ZSTD, HEADER_SIZE, _assemble, peek_header

TESTS = Path(__file__).resolve().parents[1]


def named_offline_eval(runs: Path, name: str, episodes: int = 1) -> Path:
    """The journal of a finished offline evaluation ``name`` of ``episodes`` gsm8k episodes."""
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs, name=name)
    run.log_episodes(list(workloads.gsm8k(episodes)))
    run.finish()
    assert run.journal_path is not None
    return run.journal_path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``primeruns ARGV`` in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_subprocess(
    *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "primeruns", *argv],
        capture_output=True,
        text=True,
        env=env or dict(os.environ),
        timeout=120,
    )


def _corrupt_entry(journal: Path, seq: int, offsets: Callable[[int], range]) -> None:
    """Flip the bytes at ``offsets(len(value))`` of entry ``seq``'s stored value.

    Leaf pages are copied on write, so stale copies of the value may sit in
    freed pages too: every copy is corrupted, as rot of the whole file would.
    """
    env = lmdb.open(str(journal), readonly=True, lock=False, max_dbs=8, subdir=True)
    try:
        entries = env.open_db(b"entries", create=False)
        with env.begin(db=entries) as txn:
            value = txn.get(struct.pack(">Q", seq))
    finally:
        env.close()
    assert value is not None and len(value) > 40, "entry too small to corrupt usefully"
    data_path = journal / "data.mdb"
    data = bytearray(data_path.read_bytes())
    at = data.find(value)
    assert at >= 0, "entry value not found on disk"
    while at >= 0:
        for i in offsets(len(value)):
            data[at + i] ^= 0xFF
        at = data.find(value, at + 1)
    data_path.write_bytes(bytes(data))


def break_entry_header(journal: Path, seq: int) -> None:
    """Make entry ``seq``'s header unreadable (its frame version byte is flipped)."""
    _corrupt_entry(journal, seq, lambda size: range(0, 1))


def flip_entry_bytes(journal: Path, seq: int) -> None:
    """Corrupt entry ``seq`` in place: flip bytes inside its stored value."""
    _corrupt_entry(journal, seq, lambda size: range(size // 2, size // 2 + 4))


def write_entry_corrupt(journal: Path, seq: int) -> None:
    """Make entry ``seq`` a frame written corrupt: its zstd stream cannot be
    decompressed (a reserved block type after the zstd frame's header) but
    its checksum, computed over what is stored, holds. Only decompressing
    finds it (``frames.check_frame``)."""
    env = lmdb.open(str(journal), max_dbs=8, subdir=True)
    try:
        entries = env.open_db(b"entries", create=False)
        key = struct.pack(">Q", seq)
        with env.begin(db=entries, write=True) as txn:
            value = txn.get(key)
            assert value is not None, f"no entry {seq}"
            head = peek_header(value)
            assert head.flags & FLAG_ZSTD, "entry not compressed: nothing to write corrupt"
            stored = bytearray(value[HEADER_SIZE:])
            at = zstandard.frame_header_size(bytes(stored))
            stored[at : at + 3] = b"\xff\xff\xff"
            frame = _assemble(head.kind, head.flags, head.dict_id, head.raw_len, bytes(stored), seq)
            txn.put(key, frame)
    finally:
        env.close()


def landed_once(stored: dict[str, Any], n: int) -> bool:
    traces = stored["traces"]
    return bool(traces["episodes"] == traces["distinct_episodes"] == n)


#: This machine's port 9: nothing ever answers (a journal may name it).
UNREACHABLE = "http://127.0.0.1:9/api/v1"


def offline_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline run's journal copied to a login folder of the user's (what
    ``sync`` imports into a sync journal), with this environment's key set."""
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(
        environments=["gsm8k"], model="m", mode="offline", runs_dir=runs, base_url=UNREACHABLE
    )
    run.finish()
    assert run.journal_path is not None
    login = tmp_path / "login"
    login.mkdir(mode=0o700)
    copy = login / run.journal_path.name
    shutil.copytree(run.journal_path, copy)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    return copy
