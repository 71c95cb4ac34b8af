"""Deadlines are monotonic across the producer and its uplink (issue #28).

The wall clock steps +2 h (NTP, a VM resumed) between ``finish()`` and the
uplink reading its entry: libfaketime puts the uplink's wall clock two hours
ahead of the producer's, with the monotonic clocks left alone, as a real
step does. Before, the uplink computed its deadline as ``at + timeout -
time.time()`` across the two processes: 90 of 90 episodes unshipped, the run
COMPLETED and ``run.errors`` empty. Now every episode ships.

The wall clock steps back an hour between ``init()`` and a fork: the
forked child's journal is still one its parent's ``finish()`` looks at. Or
between the run's creation and another process attaching to it by id: the
creator's close-out still waits for that process before it closes the run.

libfaketime is Debian's ``faketime`` package (``.ci/run`` installs it); a
developer's machine without it skips, saying so, and CI fails instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import one_run_oracle as oracle
import procs
import pytest
import rel_helpers as rh
import rel_torture as rt
import workloads
from fork_oracle import sample_ids
from sdk_helpers import wait_for

import primeruns as pr
from primeruns.cli import main
from primeruns.journal import EntryKind, journal_info
from primeruns.journal.meta import K_FORK_PARENT
from primeruns.local import LocalPlatform

_LIBS = [
    Path(d) / "faketime" / "libfaketime.so.1"
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib")
]
LIBFAKETIME = next((p for p in _LIBS if p.exists()), None)

if LIBFAKETIME is None:
    if os.environ.get("CI"):
        pytest.fail(
            "CI is set but libfaketime is missing (apt-get install faketime)", pytrace=False
        )
    pytest.skip("no libfaketime: apt-get install faketime", allow_module_level=True)


def _wait_for_finish_entry(run: pr.Run) -> None:
    """Until ``finish()`` (in another thread) has journaled its entry."""
    journal = run._recorder.journal
    assert journal is not None
    for _ in range(6000):
        if journal.read(0, kinds={EntryKind.FINISH}, max_entries=1).entries:
            return
        time.sleep(0.01)  # polling a condition, bounded: not a timed assertion
    raise AssertionError("finish() never journaled its entry")


def test_a_wall_clock_step_before_the_uplink_reads_the_finish_ships_everything(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    lp = shared_platform
    episodes = workloads.gsm8k(90)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        # Only the uplink is started with this environment (the producer is
        # this process, already running on the real clock).
        os.environ.update(
            LD_PRELOAD=str(LIBFAKETIME), FAKETIME="+2h", FAKETIME_DONT_FAKE_MONOTONIC="1"
        )
        run = rt.eval_run(lp.url, tmp_path / "runs")
        for name in ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC"):
            del os.environ[name]
        uplink = run._supervisor.uplink  # type: ignore[union-attr]
        # The uplink process ships this run (threads here ship it until the
        # process is ready, on the producer's clock).
        wait_for(uplink.begun, timeout=60, what="the uplink process to begin")
        assert uplink.pid is not None
        # Hold the uplink still until the finish entry is journaled, so that
        # every episode is left for the close-out (as on a slow link).
        os.kill(uplink.pid, signal.SIGSTOP)
        finishing = None
        try:
            for i in range(0, len(episodes), 10):
                run.log_episodes(episodes[i : i + 10])
            finishing = threading.Thread(target=run.finish, kwargs={"timeout": 60})
            finishing.start()
            _wait_for_finish_entry(run)
        finally:
            os.kill(uplink.pid, signal.SIGCONT)
            if finishing is not None:
                finishing.join()
    assert run.status is pr.RunStatus.COMPLETED
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == {e["id"] for e in episodes}, (len(stored), run.errors)
    assert max(stored.values()) == 1


# The run's process under a shifted wall clock, its uplink in threads: its
# finalize is answered 503 once (the platform's fault injection, set here for
# that one request), so the close-out waits before it tries again.
_A_RETRY_UNDER_A_SHIFTED_CLOCK = """
import sys
import httpx
import workloads
import primeruns as pr

runs, url, key = sys.argv[1:4]
run = pr.init(environments=["gsm8k"], model="m", api_key=key, base_url=url, runs_dir=runs)
run.log_episodes(workloads.gsm8k(10))
assert run.flush(timeout=60)
finalize = f"/api/v1/evaluations/{run.id}/finalize"
faults = {"retryable_rate": 1.0, "statuses": [503], "routes": [finalize], "max_faults": 1}
httpx.post(url + "/_local/faults", json=faults).raise_for_status()
run.finish(timeout=60)
print(run.id, run.errors)
"""


def test_a_lifecycle_retry_under_a_shifted_wall_clock_closes_the_run(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A lifecycle call's retry waited with ``time.sleep``, which fails with
    EINVAL under libfaketime (Python's sleep waits for an absolute monotonic
    deadline, f5a157a): one 503 from the finalize and the close-out gave up
    with 'finalize failed: OSError: [Errno 22] Invalid argument', the run
    left RUNNING on the platform. Its waits poll now (``standby.pause``)."""
    lp = shared_platform
    env = rh.isolated_env(
        tmp_path,
        {
            "PRIME_TRACES_URL": lp.url,
            "PRIME_RUNS_UPLINK": "threads",
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME": "+2h",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        },
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _A_RETRY_UNDER_A_SHIFTED_CLOCK,
            str(tmp_path / "runs"),
            lp.url,
            rt.KEY,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run_id, errors = done.stdout.split(maxsplit=1)
    assert errors.strip() == "[]", done.stderr[-2000:]
    assert lp.run(run_id)["status"] == "COMPLETED"
    assert len(rh.platform_episode_ids(lp.data_dir, run_id)) == 10


# The run's process: its wall clock is read from the file FAKETIME_TIMESTAMP_FILE
# names, an hour ahead at init(), stepped back before it forks. Uplink in
# threads: nothing ships a child that ends with os._exit (forkchild), so the
# parent's finish() must name it and the command that ships it.
_STEPPED_BACK_BEFORE_A_FORK = """
import os, sys
from pathlib import Path
import workloads
import primeruns as pr

runs, url, clock = sys.argv[1], sys.argv[2], Path(sys.argv[3])
run = pr.init(environments=["gsm8k"], model="m", api_key=sys.argv[4], base_url=url, runs_dir=runs)
print(run.id, flush=True)
episodes = workloads.gsm8k(20)
run.log_episodes(episodes[:10])
clock.write_text("+0")  # NTP steps the clock back an hour
pid = os.fork()
if pid == 0:
    run.log_episodes(episodes[10:])
    os._exit(0)
os.waitpid(pid, 0)
run.finish(timeout=60)
"""


def test_a_child_forked_after_the_clock_stepped_back_is_one_its_parents_finish_looks_at(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Before, the child's journal was named for the stepped-back clock,
    as made an hour before its parent's: the parent's finish() passed it
    over, closed the run and said nothing of the child's ten episodes, which
    nothing ships."""
    lp = shared_platform
    assert LIBFAKETIME is not None
    clock = tmp_path / "clock"
    clock.write_text("+1h")
    env = rh.isolated_env(
        tmp_path,
        {
            "PRIME_TRACES_URL": lp.url,
            "PRIME_RUNS_UPLINK": "threads",
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(clock),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        },
    )
    runs = tmp_path / "runs"
    args = [str(runs), lp.url, str(clock), rt.KEY]
    done = subprocess.run(
        [sys.executable, "-c", _STEPPED_BACK_BEFORE_A_FORK, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = done.stdout.split()[0]
    journals = [journal_info(p) for p in runs.iterdir() if not p.name.startswith(".")]
    [child] = [info.path for info in journals if info.meta.get(K_FORK_PARENT)]
    assert f"ship them with: primeruns replay {child}" in done.stderr, done.stderr[-2000:]
    with rt.sdk_env(lp.url, tmp_path / "home"):
        assert main(["replay", str(child)]) == 0  # the command the warning names
    wanted = {e["id"]: 1 for e in workloads.gsm8k(20)}
    assert rh.platform_episode_ids(lp.data_dir, run_id) == wanted
    assert sample_ids(lp.data_dir, run_id) == wanted
    assert lp.run(run_id)["status"] == "COMPLETED"


# A process that creates the run, its clock an hour ahead of the process that
# attaches to the run by id (the clock stepped back between the two): the
# uplink in threads, so that its close-out's line reaches this process's stderr.
_CREATOR = """
import logging, sys
import workloads
import primeruns as pr

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
runs, url, key = sys.argv[1], sys.argv[2], sys.argv[3]
run = pr.init(environments=["gsm8k"], model="m", api_key=key, base_url=url, runs_dir=runs)
run.log_episodes(workloads.gsm8k(5))
print(run.id, flush=True)
sys.stdin.readline()
run.finish(timeout=120)
print("finished", flush=True)
"""

_ATTACHER = """
import sys
import workloads
import primeruns as pr

runs, url, key, run_id = sys.argv[1:5]
run = pr.init(id=run_id, model="m", api_key=key, base_url=url, runs_dir=runs)
episodes = workloads.gsm8k(20)[5:]
run.log_episodes(episodes[:5])
print("logged", flush=True)
sys.stdin.readline()
run.log_episodes(episodes[5:])
run.finish(timeout=120)
print("finished", flush=True)
"""


def test_a_process_attaching_after_the_clock_stepped_back_is_one_the_primary_waits_for(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Before, the attaching process's journal was named for the stepped-back
    clock, as made an hour before the creator's: the creator's close-out,
    which looks among the journals made since its own for the run's other
    processes, passed it over and closed the run at once, while the other
    process went on logging into it."""
    lp = shared_platform
    assert LIBFAKETIME is not None
    runs = tmp_path / "runs"
    base = {"PRIME_TRACES_URL": lp.url, "PRIME_RUNS_UPLINK": "threads"}
    ahead = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": "+1h"}
    ahead["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    creator = procs.start(
        [sys.executable, "-c", _CREATOR, str(runs), lp.url, rt.KEY],
        env=rh.isolated_env(tmp_path, {**base, **ahead}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert creator.stdin is not None and creator.stdout is not None
    assert creator.stderr is not None
    run_id = creator.stdout.readline().strip()
    assert run_id, creator.stderr.read()[-2000:]
    attacher = procs.start(
        [sys.executable, "-c", _ATTACHER, str(runs), lp.url, rt.KEY, run_id],
        env=rh.isolated_env(tmp_path, base),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert attacher.stdin is not None and attacher.stdout is not None
    assert attacher.stdout.readline().strip() == "logged"
    creator.stdin.write("finish\n")
    creator.stdin.flush()
    said = []
    for line in creator.stderr:  # until its close-out waits for the other process
        said.append(line)
        if f"waiting for 1 other process(es) of run {run_id}" in line:
            break
    else:
        raise AssertionError("the creator closed the run at once:\n" + "".join(said)[-2000:])
    attacher.stdin.write("finish\n")
    attacher.stdin.flush()
    assert attacher.stdout.readline().strip() == "finished"
    assert attacher.wait(timeout=120) == 0
    assert creator.stdout.readline().strip() == "finished"
    said += creator.stderr.readlines()
    assert creator.wait(timeout=120) == 0
    assert not [line for line in said if "other process(es) of it had not" in line], said
    wanted = {e["id"]: 1 for e in workloads.gsm8k(20)}
    assert rh.platform_episode_ids(lp.data_dir, run_id) == wanted
    oracle.closed_after_every_record(lp, run_id, "eval", "COMPLETED")
