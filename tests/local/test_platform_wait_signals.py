"""``LocalPlatform.wait()`` (``primeruns demo --keep-serving`` waits in it)
ends on a signal whose handler CPython only flagged.

CPython runs a Python signal handler at the main thread's next check. A
signal landing as the main thread goes into a wait (after that check, before
the system call), or one the kernel handed to another thread, leaves the
handler flagged and the wait uncut: waited whole, the serving demo never
ended on that Ctrl-C or SIGTERM. Here a thread of the script takes the
SIGTERM itself (``procs.signal_once_waiting_in``), which leaves exactly that
state.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import procs

_TESTS = Path(procs.__file__).resolve().parent
_SCRIPT = r"""
import signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])  # the tests' folder, for procs
import procs
from primeruns.local.handle import LocalPlatform

class Stopped(Exception):
    pass

def stop(signum, frame):
    raise Stopped

signal.signal(signal.SIGTERM, stop)
platform = LocalPlatform(Path(sys.argv[1]))
platform.start()

# Once the main thread is in the platform's wait, a SIGTERM only flagged:
# the state a signal landing on the wait's way in leaves. Whenever it lands,
# a wait in slices ends.
procs.signal_once_waiting_in(LocalPlatform.wait.__code__)
print("waiting", flush=True)
try:
    platform.wait()
except Stopped:
    print("stopped", flush=True)
finally:
    platform.stop()
"""


def test_a_signal_flagged_while_the_main_thread_waits_for_the_platform_ends_the_wait(
    tmp_path: Path,
) -> None:
    proc = procs.start(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "platform"), str(_TESTS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == "waiting", proc.stderr.read()
    # A bound on a hang: waited whole, the wait lasts as long as the server.
    out, err = proc.communicate(timeout=60)
    assert out.strip() == "stopped", err[-2000:]
    assert proc.returncode == 0, err[-2000:]
