"""``primeruns demo`` (the README's main command) passes end to end, says
where to look, and leaves nothing behind: its temporary directory is
removed and its platform stopped, also when it is told to stop by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import procs
from cli_helpers import cli_subprocess


def test_demo_passes_every_check_says_where_to_look_and_cleans_up_on_sigterm(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME")}
    env["HOME"] = str(tmp_path / "home")
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    report = tmp_path / "report.json"
    proc = procs.start(
        [sys.executable, "-m", "primeruns", "demo", "--keep-serving", "--json-report", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines = []
    for line in proc.stdout:  # until it serves: the checks are done by then
        lines.append(line)
        if line.startswith("serving "):
            break
    serving = lines[-1]
    out = "".join(lines)
    assert "all checks passed" in out, out + proc.stderr.read()
    checks = json.loads(report.read_text())
    assert checks and all(c["ok"] for c in checks)
    assert any("FAILED with a crash reason" in c["what"] for c in checks)
    assert "demo-" not in out.replace("demo-gsm8k", "").replace("demo-train", "").replace(
        "primeruns-demo-", ""
    )

    # While it serves, the journals it points at are there to look at.
    runs = next(line.split("--runs-dir ", 1)[1].strip() for line in lines if " ls " in line)
    assert Path(runs).is_relative_to(tmp_path / "tmp")
    listed = cli_subprocess("ls", "--runs-dir", runs, "--json", env=env)
    rows = json.loads(listed.stdout)
    assert sorted(r["shipping"] for r in rows) == ["shipped"] * 3
    assert sorted(r["outcome"] for r in rows) == ["completed", "completed", "crashed"]
    origin = urlsplit(serving.split()[1])

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0  # the checks passed; SIGTERM only ends the serving
    proc.stdout.close()
    proc.stderr.close()
    assert list((tmp_path / "tmp").iterdir()) == []  # its temporary directory is gone
    with socket.socket() as probe:  # and so is its platform
        assert probe.connect_ex((origin.hostname or "", origin.port or 0)) != 0
