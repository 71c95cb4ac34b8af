"""Where ``primeruns serve`` stores what it is sent: said at start, with or
without ``--data`` (without it, a folder used to appear in the current
directory without a word)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import procs
import pytest


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


NOBODY = 65534


@pytest.mark.parametrize("planted", ["open folder", "link"])
def test_serve_refuses_a_data_folder_another_user_could_have_planted(
    tmp_path: Path, planted: str
) -> None:
    """``serve`` run in a shared scratch folder stores into
    ``./primeruns-local-data``: another user may have made it first, open to
    all (they then read every sample and trace the platform stored) or as a
    link to where they like. Refused at start, naming the folder; nothing
    is stored in it."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.chmod(scratch, 0o1777)
    data = scratch / "primeruns-local-data"
    if planted == "link":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        os.symlink(elsewhere, data)
    else:
        data.mkdir()
        os.chmod(data, 0o777)
    if os.geteuid() == 0:
        os.lchown(data, NOBODY, NOBODY)
    proc = subprocess.run(
        [sys.executable, "-m", "primeruns.local", "--port", "0"],
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(data) in proc.stderr
    assert "listening" not in proc.stdout
    assert not (data / "platform.sqlite3").exists()


def test_every_folder_serve_creates_for_its_data_is_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    data = tmp_path / "a" / "b" / "data"
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from primeruns.local.storage import Database\n"
        "os.umask(0)\n"
        "Database(Path(sys.argv[1])).close()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(data)], check=True, timeout=60)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", data):
        assert os.stat(folder).st_mode & 0o777 == 0o700, folder
    assert os.stat(data / "platform.sqlite3").st_mode & 0o777 == 0o600
