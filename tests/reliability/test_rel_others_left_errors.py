"""A run closed while another process of it had not shipped: what its caller reads.

The process that closes a run (its creator, a ranks' primary) waits for the
run's other processes on its host within ``finish()``'s budget; one still
logging past it is left, its journal kept for ``primeruns replay``. That
was said in a log line only: a caller reading ``run.errors`` after
``finish()`` (a launcher checking its ranks, a notebook with logging off)
saw none, as if every process had shipped into the run it closed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import procs
import pytest
import rel_helpers as rh
import rel_torture as rt

from primeruns.local import LocalPlatform

# The run's creator: logs, says the run's id, finishes when told, within a
# short budget, then prints what run.errors holds.
_CREATOR = """
import sys
import workloads
import primeruns as pr

runs, url, key = sys.argv[1:4]
run = pr.init(environments=["gsm8k"], model="m", api_key=key, base_url=url, runs_dir=runs)
run.log_episodes(workloads.gsm8k(5))
print(run.id, flush=True)
sys.stdin.readline()
run.finish(timeout=3)
print("errors", " | ".join(run.errors), flush=True)
"""

# Another process of the run: attaches, logs, and waits for the test.
_ATTACHER = """
import sys
import workloads
import primeruns as pr

runs, url, key, run_id = sys.argv[1:5]
run = pr.init(id=run_id, model="m", api_key=key, base_url=url, runs_dir=runs)
run.log_episodes(workloads.gsm8k(10)[5:])
print("logged", run.journal_path, flush=True)
sys.stdin.readline()
run.finish(timeout=60)
"""


def _started(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return procs.start(
        argv,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("uplink", ["threads", "process"])
def test_a_run_closed_while_another_process_had_not_shipped_says_so_in_run_errors(
    shared_platform: LocalPlatform, tmp_path: Path, uplink: str
) -> None:
    """The creator finishes while an attached process still logs: its
    run.errors names that process's journal and the replay that ships it.
    On main it held nothing (the warning went to the log only)."""
    lp = shared_platform
    runs = tmp_path / "runs"
    extra = {"PRIME_TRACES_URL": lp.url}
    if uplink == "threads":
        extra["PRIME_RUNS_UPLINK"] = "threads"
    env = rh.isolated_env(tmp_path, extra)
    creator = _started([sys.executable, "-c", _CREATOR, str(runs), lp.url, rt.KEY], env)
    assert creator.stdin is not None and creator.stdout is not None
    run_id = creator.stdout.readline().strip()
    assert run_id, creator.communicate(timeout=60)[1][-2000:]
    attacher = _started([sys.executable, "-c", _ATTACHER, str(runs), lp.url, rt.KEY, run_id], env)
    assert attacher.stdin is not None and attacher.stdout is not None
    word, journal = attacher.stdout.readline().split(" ", 1)
    assert word == "logged"
    try:
        out, err = creator.communicate("finish\n", timeout=120)
    finally:
        attacher.communicate("finish\n", timeout=120)
    assert creator.returncode == 0, err[-2000:]
    said = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    errors = said.get("errors", "")
    assert "1 other process(es) of it had not shipped everything" in errors, errors
    assert journal.strip() in errors and "primeruns replay" in errors, errors
