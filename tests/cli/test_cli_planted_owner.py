"""``ls`` and ``gc`` of a run whose lock file names a live process of this
host that is not its writer (the file is anyone's to write: planted, or
edited): told by the journal's flock, the run is not running, and gc
deletes it as any other."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from cli_helpers import cli, named_offline_eval
from sdk_helpers import point_at

from primeruns.journal.lock import LOCK_NAME


def test_a_run_whose_lock_file_names_the_users_shell_is_neither_running_nor_kept_by_gc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, ``ls`` said "running" for as long as that process lived and
    ``gc`` kept the journal, "owner alive", for good."""
    runs = point_at(monkeypatch, tmp_path, None)
    path = named_offline_eval(runs, "planted")
    shell = os.getppid()  # a live process of this user, as a shell is
    ticks = int(Path(f"/proc/{shell}/stat").read_text().rsplit(")", 1)[1].split()[19])
    record = {"pid": shell, "host": socket.gethostname(), "started": 0.0, "proc_start": ticks}
    ns = os.stat("/proc/self/ns/pid").st_ino
    (path / LOCK_NAME).write_text(json.dumps({**record, "pid_ns": ns}))

    code, out, err = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["outcome"] == "completed" and row["owner"] is None

    code, out, err = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--force")
    assert code == 0, out + err
    assert not path.exists(), out
