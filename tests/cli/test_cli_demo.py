"""``primeruns demo`` (the README's main command) passes end to end, says
where to look, and leaves nothing behind: its temporary directory is
removed and its platform stopped, also when it is told to stop by SIGTERM."""

from __future__ import annotations

import json
import os
import select
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

    # The demo goes on from that line into its wait for the platform, in
    # slices of a second (``LocalPlatform.wait``): a SIGTERM landing on a
    # slice's way in is handled at its end.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0  # the checks passed; SIGTERM only ends the serving
    proc.stdout.close()
    proc.stderr.close()
    assert list((tmp_path / "tmp").iterdir()) == []  # its temporary directory is gone
    with socket.socket() as probe:  # and so is its platform
        assert probe.connect_ex((origin.hostname or "", origin.port or 0)) != 0


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry.name))
    return found


def _exits_within(pid: int, timeout: float) -> bool:
    """Whether ``pid`` ends within ``timeout`` (waited on through a pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def test_sigterm_mid_demo_stops_everything_it_started(tmp_path: Path) -> None:
    """Told to stop while the killed producer's uplink still ships: the
    platform, the producer and that uplink all end, and the directory goes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME")}
    env["HOME"] = str(tmp_path / "home")
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    proc = procs.start(
        [sys.executable, "-m", "primeruns", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if "waiting for the uplink" in line:
            break
    else:
        raise AssertionError("the demo never reached its crash step: " + proc.stderr.read())
    started = _processes_mentioning(str(tmp_path / "tmp"))
    assert started  # at least the platform, serving from the demo's directory
    # From that line the main thread waits for the uplink in slices of a
    # second: a SIGTERM landing on a slice's way in is handled at its end.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert "terminated; its platform is stopped" in err and "Traceback" not in err, err
    assert all(_exits_within(pid, 15.0) for pid in started), _processes_mentioning(str(tmp_path))
    assert list((tmp_path / "tmp").iterdir()) == []
