"""SIGTERM while a ``log_*`` call holds the journal's lock (issue #28).

Python runs the SIGTERM handler in the main thread between two bytecodes,
here inside the append lock of that thread's own ``log_episodes``. The
handler finishes the run as cancelled, which appends the finish entry: it
took the append lock again and the process hung (a preempted job that never
ended). Now the signal is kept until the log call returns: the call's
records are journaled, the run closes as cancelled, the handler the script
had before runs once, and the process ends.

The signal is sent from inside the lock by the process itself (the append's
write is wrapped to do it): no sleep decides where it lands.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import rel_helpers as rh

from primeruns.journal import EntryKind

_SCRIPT = """
import os, signal, sys
import primeruns as pr
from primeruns.journal.appending import Appender

seen = []
signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=sys.argv[1])
run.log_episodes([{"id": "before", "traces": []}])

write = Appender._write
def write_then_signal(self, kind, payloads, essential):
    if not essential:  # the log call's append, not the finish entry's
        assert self.lock.locked()
        os.kill(os.getpid(), signal.SIGTERM)  # handled before this line ends
    return write(self, kind, payloads, essential)
Appender._write = write_then_signal

run.log_episodes([{"id": "inside", "traces": []}])
Appender._write = write
print("status", run.status.value, "handlers", len(seen), "journal", run.journal_path, flush=True)
"""


def test_sigterm_inside_a_log_calls_lock_is_handled_when_the_call_returns(tmp_path: Path) -> None:
    env = rh.isolated_env(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,  # a deadlock ends here, as a failure
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    words = done.stdout.split()
    assert words[:4] == ["status", "cancelled", "handlers", "1"], done.stdout
    ids = [r["id"] for r in rh.journal_records(Path(words[5]), EntryKind.EPISODE)]
    assert ids == ["before", "inside"]
