"""The uplink process of a live run, over real loopback HTTP.

What a user depends on: the producer's death is not the run's (a SIGKILLed
producer's uplink ships what it logged and closes the run as crashed, with no
command run); while the uplink ships, ``replay`` is refused, naming it; the
API key never appears on the uplink's command line or in its environment; a
terminal's Ctrl-C cannot reach it (its own session); where no process can be
started, or the uplink dies, shipping goes on from threads in the producer
and every record still lands exactly once (an uplink killed now and then is
started again each time, one dying in a burst let go after three); a run that finishes before its
uplink process began ships from threads without waiting for it (the
threads let go of the run's step table as they end), and one whose process
began is shipped by that process alone; a producer SIGKILLed while its
threads ship such a run leaves it to ``replay``, which sends nothing twice.
The uplink process does not load what it never runs (httpx's command-line
client, the async libraries httpcore would load), which a short run's
uplink start-up paid for, while a process that only imports its module
keeps them.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import module_platform
import procs
import pytest
import workloads
from sdk_helpers import (
    API_KEY,
    GatedSys,
    gated_interpreter,
    held_uplink_starts,
    kill_producer,
    kill_the_uplink,
    platform_episode_ids,
    platform_metric_steps,
    point_at,
    wait_for,
)

import primeruns as pr
from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, Journal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_helpers import cli, landed_once

# The runs of these tests are told apart by id: one server serves them all.
_server, local_platform = module_platform.fixtures()


def _completed_once(stored: dict[str, Any], n: int) -> bool:
    """The evaluation is COMPLETED with each of its ``n`` episodes stored
    once, in Prime Traces and in the sample table."""
    samples = stored["samples"]
    return bool(
        stored["status"] == "COMPLETED"
        and landed_once(stored, n)
        and samples["rows"] == samples["distinct"] == n
    )


def _journaled_ids(path: Path) -> list[str]:
    with Journal.open(path, owner=False) as journal:
        eps = journal.read(0, kinds={EntryKind.EPISODE}, max_entries=10**6, max_bytes=1 << 34)
    return [json.loads(e.payload)["id"] for e in eps.entries]


def _eval_run(url: str, runs: Path) -> pr.Run:
    return pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, base_url=url, runs_dir=runs)


def _train_run(url: str, runs: Path) -> pr.Run:
    return pr.init(
        kind="train", model="m", team_id="team", api_key=API_KEY, base_url=url, runs_dir=runs
    )


def _finished(path: Path) -> bool:
    with Journal.open(path, owner=False) as journal:
        return bool(journal.read(0, kinds={EntryKind.FINISH}, max_entries=1).entries)


def _run_id(path: Path) -> str:
    with Journal.open(path, owner=False) as journal:
        bound = journal.get_meta("platform") or {}
    return str(bound["run_id"])


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_a_producer_killed_alone_is_shipped_and_closed_as_crashed_with_no_command(
    kind: str, local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = local_platform
    lp.set_faults(latency_ms=5)
    runs = point_at(monkeypatch, tmp_path, lp.url)
    n = 20 if kind == "train" else 80
    path, acked = kill_producer([str(runs), kind, str(n), lp.url], n // 2, whole_job=False)
    ids = _journaled_ids(path)
    logged = [line.split(" ", 1)[1] for line in acked if line.startswith("episode ")]
    assert logged and set(logged) <= set(ids)
    run_id = _run_id(path)

    stored = wait_for(
        lambda: (s := lp.run(run_id))["status"] != "RUNNING" and s,
        timeout=60,
        what="the uplink to close the run",
    )
    if _finished(path):  # it raced to its finish entry before the kill
        assert stored["status"] == "COMPLETED"
    else:
        assert stored["status"] == "FAILED"
        assert "crash" in (stored["error_message"] or "")
    assert landed_once(stored, len(ids))
    assert set(platform_episode_ids(lp.data_dir, run_id)) == set(ids)


def test_replay_is_refused_while_the_uplink_ships_and_the_run_lands_once_after(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv("PRIME_RUNS_RETRY_BASE_S", "0.05")
    lp.set_faults(statuses=[503], routes=["/api/v1/traces"], retryable_rate=1.0)
    path, _ = kill_producer([str(runs), "eval", "200", lp.url], 20, whole_job=False)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, out, err = cli(capsys, "replay", str(path))
    assert code != 0
    assert "uplink" in (out + err)
    lp.set_faults(retryable_rate=0.0)
    run_id = _run_id(path)
    stored = wait_for(
        lambda: (s := lp.run(run_id))["status"] != "RUNNING" and s,
        timeout=60,
        what="the uplink to close the run",
    )
    # A producer that raced to its finish entry before the kill ends COMPLETED.
    assert stored["status"] == ("COMPLETED" if _finished(path) else "FAILED")
    assert landed_once(stored, len(_journaled_ids(path)))


def test_the_key_is_not_on_the_uplinks_command_line_or_in_its_environment(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    key = "secret-key-that-must-not-leak-42"
    monkeypatch.setenv("PRIME_API_KEY", key)
    run = pr.init(environments=["gsm8k"], model="m", base_url=local_platform.url, runs_dir=runs)
    assert run._supervisor is not None
    uplink = run._supervisor.uplink
    # (an evaluation ships from threads here until the process is ready: ship.startup)
    wait_for(uplink.begun, timeout=60, what="the uplink process to begin")  # type: ignore[attr-defined]
    pid = uplink.pid
    assert pid is not None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert key.encode() not in cmdline
    assert key.encode() not in environ
    # Its own session: a Ctrl-C in the terminal reaches the producer, not it.
    assert os.getsid(pid) != os.getsid(0)
    run.log_episodes(workloads.gsm8k(5))
    run.finish(timeout=60)
    assert local_platform.run(run.id)["status"] == "COMPLETED"


def test_where_no_process_can_start_the_run_ships_from_threads_with_one_warning(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import primeruns.ship.link as link

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError("process creation is not allowed here")

    monkeypatch.setattr(link.subprocess, "Popen", refuse)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run = _eval_run(local_platform.url, runs)
    warnings = [r for r in caplog.records if "could not start the uplink" in r.getMessage()]
    assert len(warnings) == 1
    episodes = workloads.gsm8k(30)
    run.log_episodes(episodes)
    assert run.flush(timeout=60)
    run.finish(timeout=60)
    stored = local_platform.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert landed_once(stored, 30)


def test_an_uplink_killed_mid_run_is_started_again_and_nothing_is_lost(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _eval_run(local_platform.url, runs)
    episodes = workloads.gsm8k(60)
    run.log_episodes(episodes[:30])
    kill_the_uplink(run)
    run.log_episodes(episodes[30:])
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        assert run.flush(timeout=60)
    assert "starting it again" in caplog.text
    run.finish(timeout=60)
    assert _completed_once(local_platform.run(run.id), 60)


class _LaterClock:
    """The supervisor's clock, ``ahead`` seconds ahead of the real one (the
    rest of ``time`` as it is): minutes pass between two of its looks."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.mark.parametrize(
    ("alive_s", "found_dead_s", "a_process_again"),
    [(0.0, 0.0, False), (601.0, 0.0, True), (0.0, 601.0, False)],
    ids=["in a burst", "minutes apart", "dead at once, found minutes later"],
)
def test_an_uplink_killed_again_and_again_is_started_again_unless_it_dies_in_a_burst(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    alive_s: float,
    found_dead_s: float,
    a_process_again: bool,
) -> None:
    """A long run's uplink killed now and then (an out-of-memory killer, a
    cleanup of stray processes) is started again each time; one that dies
    again and again at once is let go after three, for threads here. Its
    life is what looks found alive: in a loop logging every 10 minutes or
    more (a large model's training step), an uplink that died at its start
    is found dead 601 s after it was started; taken for 601 s of life, a
    doomed process was started again at every step and threads never took
    over (the third case fails so on main)."""
    import primeruns.supervisor as supervisor

    clock = _LaterClock()
    monkeypatch.setattr(supervisor, "time", clock)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _eval_run(local_platform.url, runs)
    assert run._supervisor is not None
    episodes = workloads.gsm8k(50)
    for kill in range(4):
        run.log_episodes(episodes[kill * 10 : (kill + 1) * 10])
        clock.ahead += alive_s
        run._supervisor.replace_if_dead(restart=True)  # a look that finds it alive
        kill_the_uplink(run)
        clock.ahead += found_dead_s
        run._supervisor.replace_if_dead(restart=True)  # the look that finds it dead
    shipped_by = run._supervisor.uplink
    run.log_episodes(episodes[40:])
    assert run.flush(timeout=60)
    run.finish(timeout=60)
    assert _completed_once(local_platform.run(run.id), 50)
    # The fourth death: a process again after minutes of life, else threads.
    assert isinstance(getattr(shipped_by, "pid", None), int) == a_process_again


def test_a_look_at_the_uplink_that_keeps_failing_is_said_once(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The log calls' once-a-second look at the uplink, failing at every
    look (a journal that keeps failing to read): one warning, not one a
    second for the rest of the run; a new failure is said again."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _eval_run(local_platform.url, runs)
    supervisor = run._supervisor
    assert supervisor is not None
    failure = [OSError(5, "Input/output error")]

    def failing(*, restart: bool) -> None:
        raise failure[0]

    with caplog.at_level(logging.WARNING, logger="primeruns"):
        setattr(supervisor, "_replace_if_dead", failing)  # noqa: B010 (a method, shadowed)
        for _ in range(5):
            supervisor._look_at_uplink()
        failure[0] = PermissionError(13, "Permission denied")
        supervisor._look_at_uplink()
        delattr(supervisor, "_replace_if_dead")
    said = [r.getMessage() for r in caplog.records if "could not look after" in r.getMessage()]
    assert len(said) == 2 and "Input/output" in said[0] and "Permission" in said[1]
    run.finish(timeout=60)
    assert local_platform.run(run.id)["status"] == "COMPLETED"


def test_a_journal_that_refuses_a_restarted_uplink_leaves_threads_shipping_and_flush_returns(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The journal refuses the hand-over to a new uplink process (its lock
    not shared, the moving not handed over: a JournalError). Before, that
    error came out of flush() into the user's loop under the default
    on_error="warn"; now threads of this process ship on."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _eval_run(local_platform.url, runs)
    episodes = workloads.gsm8k(40)
    run.log_episodes(episodes[:20])
    kill_the_uplink(run)

    def refused(journal: Journal, *args: Any, **kwargs: Any) -> Any:
        raise JournalError(f"journal {journal.path}: its lock cannot be shared")

    monkeypatch.setattr("primeruns.ship.link.UplinkProcess", refused)
    run.log_episodes(episodes[20:])
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        assert run.flush(timeout=60)
    assert "could not start the uplink process" in caplog.text
    assert "shipping from threads in this process instead" in caplog.text
    run.finish(timeout=60)
    assert _completed_once(local_platform.run(run.id), 40)


def _producer(
    source: str, tmp_path: Path, runs: Path, url: str, **popen: Any
) -> subprocess.Popen[str]:
    """Run ``source`` as a producer script (the tests' helpers on its path),
    its standard output a pipe of text lines."""
    script = tmp_path / "producer.py"
    script.write_text(source)
    tests = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]),
    }
    return procs.start(
        [sys.executable, str(script), str(runs), url, API_KEY],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        **popen,
    )


# A training job whose uplink process is killed alone mid-run (an
# out-of-memory kill, a cleanup of stray processes), then goes on logging one
# step per line the test writes on its standard input, never calling flush().
_LOGS_ON_AFTER_ITS_UPLINK = """
import sys
import workloads
import primeruns as pr

run = pr.init(
    kind="train", model="m", team_id="team", api_key=sys.argv[3], base_url=sys.argv[2],
    runs_dir=sys.argv[1],
)
print(f"journal {run.journal_path}", flush=True)
print(f"uplink {run._supervisor.uplink.pid}", flush=True)
records = workloads.agentic(2_000)
for step, _ in enumerate(sys.stdin):
    run.log_episodes([records[step]])
    run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    print(f"logged {step} {records[step]['id']}", flush=True)
"""


def test_an_uplink_killed_alone_mid_run_is_started_again_and_outlives_its_producer(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    proc = _producer(_LOGS_ON_AFTER_ITS_UPLINK, tmp_path, runs, lp.url, stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    path = Path(proc.stdout.readline().split(" ", 1)[1].strip())
    uplink = int(proc.stdout.readline().split(" ", 1)[1])
    logged: list[str] = []

    def step() -> int:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        _, number, episode = proc.stdout.readline().split()
        logged.append(episode)
        return int(number)

    for _ in range(5):
        step()
    run_id = _run_id(path)
    wait_for(lambda: platform_metric_steps(lp.data_dir, run_id), what="the first rows to land")
    os.kill(uplink, signal.SIGKILL)
    after = step()

    def landed_while_logging() -> bool:
        step()  # the loop goes on, a step each poll, as a training loop logs
        return after in platform_metric_steps(lp.data_dir, run_id)

    # What it logged after the kill reaches the platform, no flush() called.
    wait_for(landed_while_logging, timeout=60, what="a row logged after the kill to land")
    for _ in range(5):
        step()
    os.kill(proc.pid, signal.SIGKILL)  # the producer alone: its new uplink closes the run
    proc.stdin.close()
    proc.stdout.close()
    proc.wait(timeout=30)
    stored = wait_for(
        lambda: (s := lp.run(run_id))["status"] != "RUNNING" and s,
        timeout=60,
        what="the uplink to close the run",
    )
    assert stored["status"] == "FAILED" and "crash" in (stored["error_message"] or "")
    assert platform_episode_ids(lp.data_dir, run_id) == Counter(logged)
    assert platform_metric_steps(lp.data_dir, run_id) == Counter(range(len(logged)))


# A training job preempted (SIGTERM, a scheduler's) just as its flush() finds
# the uplink process dead and starts it again: the signal lands in the main
# thread while the flush looks after the uplink.
_TERMINATED_AS_ITS_FLUSH_RESTARTS_THE_UPLINK = """
import os, signal, sys
import primeruns as pr
import primeruns.supervisor as supervisor

run = pr.init(
    kind="train", model="m", team_id="team", api_key=sys.argv[3], base_url=sys.argv[2],
    runs_dir=sys.argv[1],
)
print(f"journal {run.journal_path}", flush=True)
run.log_metrics({"loss": 1.0}, step=0)
assert run.flush(timeout=60)
uplink = run._supervisor.uplink
os.kill(uplink.pid, signal.SIGKILL)
uplink.wait_exit(30)
run._supervisor._next_look = float("inf")  # the flush, not a log call, finds it dead
run.log_metrics({"loss": 0.5}, step=1)
start = supervisor.start_uplink

def start_as_terminated(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return start(*args, **kwargs)

supervisor.start_uplink = start_as_terminated
run.flush(timeout=60)
"""


def test_a_sigterm_as_a_flush_starts_the_uplink_again_closes_the_run(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    proc = _producer(_TERMINATED_AS_ITS_FLUSH_RESTARTS_THE_UPLINK, tmp_path, runs, lp.url)
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().split(" ", 1)[1].strip())
    # The job ends of its SIGTERM (not hung on a lock the flush held).
    assert proc.wait(timeout=60) == -signal.SIGTERM
    stored = lp.run(_run_id(path))
    # (A training run's cancellation is FAILED on the platform, with its reason.)
    assert stored["status"] == "FAILED" and "SIGTERM" in (stored["error_message"] or "")
    assert platform_metric_steps(lp.data_dir, _run_id(path)) == Counter([0, 1])


# A training job that ends without finish() (the interpreter's exit closes
# its run as crashed, waiting a short while) after its uplink process was
# killed alone since its last log call's look at it.
_EXITS_AFTER_ITS_UPLINK_DIED = """
import os, signal, sys
import primeruns as pr
import primeruns.hooks

run = pr.init(
    kind="train", model="m", team_id="team", api_key=sys.argv[3], base_url=sys.argv[2],
    runs_dir=sys.argv[1],
)
print(f"journal {run.journal_path}", flush=True)
run._supervisor._next_look = float("inf")  # no log call looks at it
for step in range(30):
    run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
uplink = run._supervisor.uplink
os.kill(uplink.pid, signal.SIGKILL)
uplink.wait_exit(30)
primeruns.hooks._EXIT_GRACE = 1.0  # the exit waits less than shipping the rest takes
"""


def test_an_exit_after_the_uplink_died_leaves_a_process_that_ships_the_rest_and_closes_the_run(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    lp = local_platform
    lp.set_faults(latency_ms=200)  # shipping the rest takes longer than the exit waits
    proc = _producer(_EXITS_AFTER_ITS_UPLINK_DIED, tmp_path, runs, lp.url)
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().split(" ", 1)[1].strip())
    assert proc.wait(timeout=60) == 0
    run_id = _run_id(path)
    stored = wait_for(
        lambda: (s := lp.run(run_id))["status"] != "RUNNING" and s,
        timeout=60,
        what="the run to be closed after its producer exited",
    )
    assert stored["status"] == "FAILED" and "crash" in (stored["error_message"] or "")
    assert platform_metric_steps(lp.data_dir, run_id) == Counter(range(30))


def test_the_uplink_runs_this_package_even_from_a_directory_holding_another(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user who runs their loop from a checkout of another prime-runs
    version: the uplink must not import the ``primeruns`` in the working
    directory (``python -m`` would put it first on the path)."""
    elsewhere = tmp_path / "elsewhere"
    decoy = elsewhere / "primeruns"
    decoy.mkdir(parents=True)
    marker = tmp_path / "decoy-imported"
    (decoy / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit('the decoy primeruns')\n"
    )
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.chdir(elsewhere)
    run = _eval_run(local_platform.url, runs)
    assert run._supervisor is not None
    uplink = run._supervisor.uplink
    run.log_episodes(workloads.gsm8k(5))
    wait_for(uplink.begun, timeout=60, what="the uplink process to begin")  # type: ignore[attr-defined]
    # Shipped by the process (a run finished before it began would ship
    # from threads here, and never show what the process imports).
    assert run.flush(timeout=60)
    run.finish(timeout=60)
    assert not marker.exists()
    assert uplink.exit_code() == 0  # type: ignore[attr-defined]  # the uplink itself shipped and closed the run
    stored = local_platform.run(run.id)
    assert stored["status"] == "COMPLETED" and landed_once(stored, 5)


@pytest.mark.parametrize("uplink", ["process", "threads"])
def test_a_flush_and_a_finish_without_a_bound_return_once_done(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uplink: str
) -> None:
    # timeout=inf is a user's "wait as long as it takes": no wait may hand
    # it to the OS as is (threading and poll overflow on it).
    if uplink == "threads":
        monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _eval_run(local_platform.url, runs)
    run.log_episodes(workloads.gsm8k(5))
    assert run.flush(timeout=float("inf"))
    run.finish(timeout=float("inf"))
    stored = local_platform.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert landed_once(stored, 5)


def test_a_run_longer_than_one_reads_scan_is_closed_out_by_its_uplink(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The uplink looks for the finish entry with reads that stop at a scan
    # limit (50,000 entries; 16 here): it must read on to the log's end, not
    # wait at the limit for a wake-up that already came.
    from primeruns.journal import reading

    monkeypatch.setattr(reading, "_MAX_SCAN", 16)
    monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")  # the patched limit applies there
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _eval_run(local_platform.url, runs)
    episodes = workloads.gsm8k(40)
    for episode in episodes:
        run.log_episodes([episode])
    run.finish(timeout=60)
    stored = local_platform.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert landed_once(stored, 40)


def test_a_run_finished_before_its_uplink_process_began_ships_from_threads_at_once(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short evaluation does not wait for its uplink process's start-up:
    finish() takes the shipping back from a process that has not begun
    (which then never ships) and ships from threads; every record lands
    once. Before, finish() waited for the process, here for ever (its
    budget), and nothing was shipped."""
    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    try:
        run = _eval_run(local_platform.url, runs)
        assert run._supervisor is not None
        uplink = run._supervisor.uplink
        assert not uplink.begun()  # type: ignore[attr-defined]
        run.log_episodes(workloads.gsm8k(5))
        run.finish(timeout=15)
        assert not uplink.alive()  # stopped, never having begun
        assert not gate.exists()
    finally:
        gate.touch()  # a process of a failed run may become the uplink now
    assert run.status is pr.RunStatus.COMPLETED
    assert _completed_once(local_platform.run(run.id), 5)


def test_a_run_whose_uplink_process_began_is_shipped_and_closed_by_it_alone(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _eval_run(local_platform.url, runs)
    assert run._supervisor is not None
    uplink = run._supervisor.uplink
    run.log_episodes(workloads.gsm8k(5))
    gate.touch()
    wait_for(uplink.begun, timeout=60, what="the uplink process to begin")  # type: ignore[attr-defined]
    run.finish(timeout=60)
    assert run._supervisor.uplink is uplink  # no threads took over
    assert uplink.exit_code() == 0  # type: ignore[attr-defined]  # it shipped and closed the run
    assert _completed_once(local_platform.run(run.id), 5)


def test_an_uplink_process_whose_producer_took_the_shipping_back_touches_nothing(
    tmp_path: Path,
) -> None:
    from primeruns.ship import link, uplink_main

    claim = link._claim_token()
    assert os.read(claim, 1) == b"\0"  # the producer took it back
    missing = tmp_path / "no-journal-here"
    wake_r, wake_w = os.pipe()
    progress_r, progress_w = os.pipe()
    try:
        code = uplink_main.main(
            [
                "--journal",
                str(missing),
                "--producer",
                str(os.getpid()),
                "--wake-fd",
                str(wake_r),
                "--progress-fd",
                str(progress_w),
                "--lock-fd",
                "-1",
                "--claim-fd",
                str(claim),
            ]
        )
    finally:
        for fd in (wake_r, wake_w, progress_r, progress_w):
            os.close(fd)
    assert code == 0
    assert not missing.exists()


def test_of_the_producer_and_its_uplink_exactly_one_gets_the_claim() -> None:
    from primeruns.ship import link

    claim = link._claim_token()
    second = os.dup(claim)  # the uplink's copy (inherited: the same pipe)
    assert link.take_claim(claim) is True
    assert link.take_claim(second) is False


def test_a_short_training_run_shipped_from_threads_lets_go_of_its_step_table(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its metrics rows are merged in a step table held under a shared lock
    while in use: once finish() returned, no thread of this process holds
    it, and gc may delete it with the run (it never could before)."""
    from primeruns.sinks.step_rows import delete_table, tables

    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    try:
        run = _train_run(local_platform.url, runs)
        for step in range(3):
            run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        run.finish(timeout=30)
    finally:
        gate.touch()
    assert local_platform.run(run.id)["train_metrics"] == {"rows": 3, "steps": 3}
    (table,) = tables(runs)
    assert delete_table(table)  # nobody holds it


_KILLED_WHILE_SHIPPING = """
import sys
from pathlib import Path
import primeruns as pr
import primeruns.ship.link as link
import workloads
from sdk_helpers import GatedSys

runs, url, stand_in = sys.argv[1:4]
link.sys = GatedSys(Path(stand_in))  # its uplink process is held in its start-up
run = pr.init(environments=["gsm8k"], model="m", runs_dir=runs, base_url=url,
              api_key="test-key-0123456789")
run.log_episodes(workloads.gsm8k(20))
print(run.id, run.journal_path, flush=True)
run.finish(timeout=600)
"""


def test_a_producer_killed_while_shipping_a_short_run_from_threads_leaves_it_to_replay(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    stand_in, gate = gated_interpreter(tmp_path)
    lp.set_faults(latency_ms=3000, routes=["/api/v1/traces"])
    try:
        proc = procs.start(
            [sys.executable, "-c", _KILLED_WHILE_SHIPPING, str(runs), lp.url, str(stand_in)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ),
            cwd=Path(__file__).resolve().parents[1],  # where workloads.py is
        )
        assert proc.stdout is not None
        run_id, journal = proc.stdout.readline().split()
        # finish() took the shipping back from the uplink process (held in
        # its start-up, it never could ship), and the producer's threads
        # sent the traces: killed now, with that request in flight.
        wait_for(lambda: lp.set_faults()["delayed"] >= 1, timeout=60, what="the traces request")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        lp.set_faults(latency_ms=0)
        wait_for(lambda: lp.set_faults()["delayed"] == 0, timeout=60, what="the request's end")
        assert lp.run(run_id)["status"] == "RUNNING"  # nobody closed it out
    finally:
        gate.touch()  # an uplink process still held (a failed test's) goes on

    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, out, err = cli(capsys, "replay", journal)
    assert code == 0, out + err
    assert _completed_once(lp.run(run_id), 20)  # completed, as the producer's finish said


_LOADED = """
import json, runpy, sys
sys.argv = ["primeruns-uplink", "--help"]  # its module's top runs, then argparse exits
try:
    runpy.run_module("primeruns.ship.uplink_main", run_name=RUN_NAME)
except SystemExit:
    pass
import httpx
httpx.Client().close()  # what the uplink builds (and where httpcore is loaded)
names = ("httpx._main", "trio", "anyio")
print(json.dumps(sorted(n for n in names if n in sys.modules and sys.modules[n] is None)))
"""


@pytest.mark.parametrize(
    ("run_name", "absent"), [("__main__", ["anyio", "httpx._main", "trio"]), ("imported", [])]
)
def test_the_uplink_process_does_not_load_what_it_never_runs(
    run_name: str, absent: list[str]
) -> None:
    # Marked absent (the import system's "not installed", which httpx and
    # httpcore handle) whether installed here or not; a process that only
    # imports the uplink's module (a test, a tool) keeps them.
    out = subprocess.run(
        [sys.executable, "-P", "-c", _LOADED.replace("RUN_NAME", repr(run_name))],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(pr.__file__).resolve().parents[1])},
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == absent


def _gone(pid: int) -> bool:
    """Whether process ``pid`` is gone or dead (a zombie no one reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat.rsplit(b")", 1)[-1].split()[:1] == [b"Z"]


def test_an_interpreter_stand_in_killed_alone_leaves_one_uplink_shipping(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sys.executable`` may be a stand-in that runs the interpreter as its
    child (a module system's wrapper, a launcher). Killed alone (a cleanup
    of stray processes by pid), it is the process the producer started, and
    the producer took the uplink for dead and started a second one while
    its child, the first uplink, shipped on over the same journal: two
    shippers of one journal, and exactly once relies on one. Now the dead
    one's process group (the child with it) is killed before another starts."""
    import primeruns.ship.link as link

    stand_in = tmp_path / "python-wrapper"
    stand_in.write_text(f'#!/bin/sh\n{shlex.quote(sys.executable)} "$@"\n')  # no exec
    stand_in.chmod(0o700)
    monkeypatch.setattr(link, "sys", GatedSys(stand_in))
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _train_run(local_platform.url, runs)
    assert run._supervisor is not None
    first = run._supervisor.uplink
    wait_for(first.begun, timeout=60, what="the uplink process to begin")  # type: ignore[attr-defined]
    shipping = procs.children(first.pid)  # type: ignore[attr-defined]
    assert shipping, "the stand-in runs no uplink"
    for step in range(10):
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    os.kill(first.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    wait_for(lambda: not first.alive(), timeout=30, what="the stand-in's end")
    step = 10
    while run._supervisor.uplink is first and step < 400:  # a log call looks once a second
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        step += 1
        time.sleep(0.01)  # polls a condition, bounded by the steps: not a timed assertion
    assert run._supervisor.uplink is not first  # the stand-in found dead: another uplink started
    # The first uplink (the stand-in's child) does not ship beside it.
    wait_for(lambda: all(_gone(pid) for pid in shipping), timeout=30, what="the first uplink's end")
    assert run.flush(timeout=60)
    run.finish(timeout=60)
    assert local_platform.run(run.id)["status"] == "COMPLETED"
    assert platform_metric_steps(local_platform.data_dir, run.id) == Counter(range(step))
