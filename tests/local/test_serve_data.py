"""Where ``primeruns serve`` stores what it is sent: said at start, with or
without ``--data`` (without it, a folder used to appear in the current
directory without a word)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import procs


def _first_lines(cwd: Path, *argv: str) -> list[str]:
    proc = procs.start(
        [sys.executable, "-m", "primeruns.local", "--port", "0", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    return lines


def test_serve_says_where_it_stores_what_it_is_sent(tmp_path: Path) -> None:
    here = tmp_path / "cwd"
    here.mkdir()
    listening, where = _first_lines(here)
    assert re.search(r"listening on http://127\.0\.0\.1:\d+", listening), listening
    default = here.resolve() / "primeruns-local-data"
    assert default.is_dir()
    assert f"storing what it is sent in {default}" in where, where
    assert "--data DIR" in where  # how to choose another place
    chosen = tmp_path.resolve() / "chosen"
    _, where = _first_lines(here, "--data", str(chosen))
    assert f"in {chosen}" in where and "default" not in where, where
