"""The uplink is a well-behaved daemon (issue #28): it never holds the
producer's standard output or error. A caller that runs a training script
with ``subprocess.run(..., capture_output=True)`` (or pipes it into ``tee``)
reads to end of file; before, it waited for the uplink's close-out, since the
uplink inherited both pipes. The uplink's log goes to ``uplink.log`` beside
the journal from its start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import rel_torture as rt

from primeruns.local import LocalPlatform

# Logs, freezes its own uplink once it has begun shipping (so the uplink
# lingers for as long as the test wants, not for a timed while), finishes
# with a short timeout and exits. (finish() kills an uplink it sees stopped:
# not here, where the stop stands for an uplink still at work.)
_SCRIPT = """
import os, signal, sys, time
import primeruns as pr
import primeruns.supervisor
primeruns.supervisor._STOPPED_FOR_S = float("inf")
run = pr.init(environments=["gsm8k"], model="m", runs_dir=sys.argv[1])
run.log_episodes([{"id": "e1", "traces": []}])
uplink = run._supervisor.uplink
for _ in range(6000):  # polling a condition, bounded (60 s)
    if uplink.begun():
        break
    time.sleep(0.01)
pid = uplink.pid
with open(sys.argv[2], "w") as f:
    f.write(str(pid))
print(run.journal_path, flush=True)
print("to stderr", file=sys.stderr, flush=True)
os.kill(pid, signal.SIGSTOP)
run.finish(timeout=0.2)
"""


def test_a_caller_reading_the_producers_pipes_gets_eof_when_the_producer_exits(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    pid_file = tmp_path / "uplink.pid"
    with rt.sdk_env(shared_platform.url, home):
        env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "runs"), str(pid_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        # communicate() returns at end of file on both pipes: with the uplink
        # holding them, it waits for the (stopped) uplink, i.e. forever.
        out, err = proc.communicate(timeout=90)
        os.kill(int(pid_file.read_text()), 0)  # still there (stopped) at end of file
        assert b"to stderr" in err
        assert (Path(out.decode().strip()) / "uplink.log").exists()
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()
        if pid_file.exists():
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(int(pid_file.read_text()), sig)
                except ProcessLookupError:
                    break
