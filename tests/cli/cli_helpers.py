"""Helpers for the CLI tests: run ``primeruns`` in-process or as a real
subprocess, kill a producer mid-run, and damage one journal entry on disk."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest

from primeruns.cli import main

TESTS = Path(__file__).resolve().parents[1]


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


def _stored_value(journal: Path, seq: int) -> bytes:
    env = lmdb.open(str(journal), readonly=True, lock=False, max_dbs=8, subdir=True)
    try:
        entries = env.open_db(b"entries", create=False)
        with env.begin(db=entries) as txn:
            value = txn.get(struct.pack(">Q", seq))
    finally:
        env.close()
    assert value is not None and len(value) > 40, "entry too small to corrupt usefully"
    return bytes(value)


def break_entry_header(journal: Path, seq: int) -> None:
    """Make entry ``seq``'s header unreadable (an unknown frame version), every copy."""
    value = _stored_value(journal, seq)
    data_path = journal / "data.mdb"
    data = bytearray(data_path.read_bytes())
    at = data.find(value)
    assert at >= 0, "entry value not found on disk"
    while at >= 0:
        data[at] = 0xEE
        at = data.find(value, at + 1)
    data_path.write_bytes(bytes(data))


def flip_entry_bytes(journal: Path, seq: int) -> None:
    """Corrupt entry ``seq`` in place: flip bytes inside its stored value."""
    value = _stored_value(journal, seq)
    data_path = journal / "data.mdb"
    data = bytearray(data_path.read_bytes())
    # Leaf pages are copied on write, so stale copies of the value may sit in
    # freed pages too: corrupt every copy, as rot of the whole file would.
    at = data.find(value)
    assert at >= 0, "entry value not found on disk"
    while at >= 0:
        middle = at + len(value) // 2
        for i in range(middle, middle + 4):
            data[i] ^= 0xFF
        at = data.find(value, at + 1)
    data_path.write_bytes(bytes(data))


def landed_once(stored: dict[str, Any], n: int) -> bool:
    traces = stored["traces"]
    return bool(traces["episodes"] == traces["distinct_episodes"] == n)
