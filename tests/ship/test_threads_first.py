"""An evaluation ships from threads while its uplink process starts (``ship.startup``).

The oracle throughout: every episode whose ``log_episodes`` returned lands
once in Prime Traces and once in the sample table, whichever end shipped it
and wherever the handover fell; and the run is closed out once, by one of
them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import module_platform
import procs
import pytest
import workloads
from sdk_helpers import API_KEY, gated_interpreter, held_uplink_starts, point_at, wait_for

# The runs of these tests are told apart by id: one server serves them all.
from threads_first_helpers import eval_run as _eval_run
from threads_first_helpers import stored_once, threads_first

from primeruns.journal import EntryKind, Journal

_server, local_platform = module_platform.fixtures()

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("when", ["caught-up", "backlog-in-flight"])
def test_episodes_logged_across_the_handover_land_once_and_the_process_closes_the_run(
    when: str, local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``caught-up``: the threads hand over once they shipped all there was;
    ``backlog-in-flight``: at once (no catching up), batches in flight."""
    from primeruns.ship import startup

    if when == "backlog-in-flight":
        monkeypatch.setattr(startup, "_CATCH_UP_S", 0.0)
    lp = local_platform
    lp.set_faults(latency_ms=50)
    runs = point_at(monkeypatch, tmp_path, lp.url)
    run = _eval_run(lp.url, runs)
    assert run._supervisor is not None
    uplink = run._supervisor.uplink
    episodes = workloads.gsm8k(300)
    run.log_episodes(episodes[:150])
    wait_for(uplink.begun, timeout=60, what="the uplink process to take over")  # type: ignore[attr-defined]
    run.log_episodes(episodes[150:])
    run.finish(timeout=60)
    assert run._supervisor.uplink is uplink
    assert uplink.exit_code() == 0  # type: ignore[attr-defined]  # the process closed the run out
    assert stored_once(lp.run(run.id), len(episodes), "COMPLETED")


def test_the_loop_takes_the_gil_back_sooner_only_while_the_threads_ship(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While an evaluation's threads ship beside its loop, the switch
    interval is short (a log call's p99 was 6-10 ms waiting for a shipper to
    let the GIL go); once its process ships, or the run finished first, it
    is the user's again, and a forked worker has the user's at once."""
    from primeruns.ship.switch_interval import SHIPPING_INTERVAL_S

    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    original = sys.getswitchinterval()
    sys.setswitchinterval(0.01)  # the user's own
    users = sys.getswitchinterval()
    try:
        run = _eval_run(lp.url, runs)
        assert run._supervisor is not None
        uplink = run._supervisor.uplink
        assert sys.getswitchinterval() == pytest.approx(SHIPPING_INTERVAL_S)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # a data loader's worker: none of our threads ship in it
            os.write(write, repr(sys.getswitchinterval()).encode())
            os._exit(0)
        os.close(write)
        in_child = float(os.read(read, 64))
        os.close(read)
        os.waitpid(child, 0)
        assert in_child == users
        episodes = workloads.gsm8k(40)
        run.log_episodes(episodes)
        wait_for(uplink.begun, timeout=60, what="the uplink process to take over")  # type: ignore[attr-defined]
        assert sys.getswitchinterval() == users
        run.finish(timeout=60)
        assert stored_once(lp.run(run.id), len(episodes), "COMPLETED")
        short = _eval_run(lp.url, runs)  # finished before its process took over
        assert sys.getswitchinterval() == pytest.approx(SHIPPING_INTERVAL_S)
        short.log_episodes(episodes[:1])
        short.finish(timeout=60)
        assert sys.getswitchinterval() == users
    finally:
        sys.setswitchinterval(original)


def _log_steps_until_handed_over(
    run: Any, episodes: list[dict[str, Any]], *, timeout: float
) -> int:
    """Log two episodes a step (then ``wait_for``'s pause: the loop's own
    work) until the run's uplink process took the run over, before the
    episodes run out; how many were logged."""
    uplink = run._supervisor.uplink
    logged = 0

    def a_step_then_handed_over() -> bool:
        nonlocal logged
        assert logged < len(episodes), "not handed over while the evaluation logged"
        run.log_episodes(episodes[logged : logged + 2])
        logged += 2
        return bool(uplink.begun())

    wait_for(a_step_then_handed_over, timeout=timeout, what="the handover")
    return logged


def test_an_evaluation_that_never_lets_its_threads_catch_up_is_still_handed_over(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN §6.3 (shipping runs in the uplink's process, not the loop's)
    holds for an evaluation once its threads' phase ends, and that phase is
    bounded: a run that logs on while a slow platform keeps the threads
    behind is handed over all the same (``_CATCH_UP_S`` after the process
    is ready), with every episode once."""
    lp = local_platform
    lp.set_faults(latency_ms=300, routes=["/api/v1/traces"])
    runs = point_at(monkeypatch, tmp_path, lp.url)
    run = _eval_run(lp.url, runs)
    assert run._supervisor is not None
    uplink = run._supervisor.uplink
    try:
        logged = _log_steps_until_handed_over(run, workloads.gsm8k(2000), timeout=120)
    finally:
        lp.set_faults(latency_ms=0)
    run.finish(timeout=60)
    assert uplink.exit_code() == 0  # type: ignore[attr-defined]  # the process closed the run out
    assert stored_once(lp.run(run.id), logged, "COMPLETED")


def test_a_steady_evaluation_is_handed_over_while_its_threads_are_a_batch_behind(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evaluation that logs a few episodes each step of its own work
    always has a request in flight or an entry just logged: waiting for its
    threads to have nothing left kept it on threads (its loop paying their
    CPU) for the whole catch-up allowance. A backlog of a batch or two is
    caught up: the process takes over while the loop logs on, every episode
    once."""
    from primeruns.ship import startup

    monkeypatch.setattr(startup, "_CATCH_UP_S", 600.0)  # only catching up hands over here
    lp = local_platform
    lp.set_faults(latency_ms=100, routes=["/api/v1/traces"])  # a batch always in flight
    runs = point_at(monkeypatch, tmp_path, lp.url)
    run = _eval_run(lp.url, runs)
    assert run._supervisor is not None
    uplink = run._supervisor.uplink
    episodes = workloads.gsm8k(600)  # 15 s of steps: the process is ready in 1-2
    try:
        logged = _log_steps_until_handed_over(run, episodes, timeout=60)
    finally:
        lp.set_faults(latency_ms=0)
    run.log_episodes(episodes[logged : logged + 2])
    logged += 2
    run.finish(timeout=60)
    assert uplink.exit_code() == 0  # type: ignore[attr-defined]  # the process closed the run out
    assert stored_once(lp.run(run.id), logged, "COMPLETED")


def test_an_uplink_process_dead_in_its_start_up_leaves_the_threads_shipping(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    try:
        run = _eval_run(local_platform.url, runs)
        assert run._supervisor is not None
        uplink = run._supervisor.uplink
        episodes = workloads.gsm8k(40)
        run.log_episodes(episodes[:20])
        process = uplink._process  # type: ignore[attr-defined]
        os.kill(process.pid, signal.SIGKILL)
        process.wait_exit(30)
        with caplog.at_level(logging.WARNING, logger="primeruns"):
            run.log_episodes(episodes[20:])
            assert run.flush(timeout=60)
            run.finish(timeout=60)
        assert not uplink.begun()  # type: ignore[attr-defined]
        assert "exited before the run was finished" not in caplog.text  # nothing to replace
    finally:
        gate.touch()
    assert stored_once(local_platform.run(run.id), 40, "COMPLETED")


def test_threads_that_ship_for_good_after_the_process_died_starting_linger_as_the_fallback(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The threads that bridge the process's start catch up at the run's
    linger (0.1 s); once they ship for the rest of the run, beside the
    loop, they linger as the threads fallback does (``THREADS_LINGER_S``:
    a batch a second per sink, not one every two or three steps of a
    steady loop, each taking its GIL). A process that died starting left
    them at 0.1 s for the rest of the run; one that died after it was
    ready had its threads replaced by the fallback's. Both do now."""
    from primeruns.ship import startup
    from primeruns.ship.link import THREADS_LINGER_S

    gate = held_uplink_starts(monkeypatch, tmp_path)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    try:
        run = _eval_run(local_platform.url, runs)
        uplink = threads_first(run)
        episodes = workloads.gsm8k(40)
        run.log_episodes(episodes[:20])
        os.kill(uplink._process.pid, signal.SIGKILL)  # type: ignore[arg-type]
        wait_for(lambda: uplink._state == startup._THREADS_ONLY, timeout=60, what="threads only")
        shipping = uplink._threads.uplink
        assert shipping.policy.linger_s >= THREADS_LINGER_S
        run.log_episodes(episodes[20:])
        assert run.flush(timeout=60)
        assert all(s._policy.linger_s >= THREADS_LINGER_S for s in shipping.shippers)
        run.finish(timeout=60)
    finally:
        gate.touch()
    assert stored_once(local_platform.run(run.id), 40, "COMPLETED")


def test_the_producer_moves_nothing_while_its_threads_ship_and_again_once_they_ship_for_good(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While an evaluation's threads ship beside its loop, the background
    sync's ticks leave the producer's mover be: its uplink process moves
    what was spooled once it takes over. A mover step there held the GIL
    20-200 ms beside the loop and the threads in the run's first seconds
    (its dictionary training, then the batch the handover waited for),
    and the log calls then waited for it. Once the threads ship for good
    (the process died starting), the producer moves again."""

    moved = _count_moves(monkeypatch)
    real_tick = Journal._tick_mover
    ticks = 0

    def tick(self: Journal) -> None:
        nonlocal ticks
        ticks += 1
        real_tick(self)

    monkeypatch.setattr(Journal, "_tick_mover", tick)
    gate = held_uplink_starts(monkeypatch, tmp_path)  # the threads' phase lasts
    episodes = workloads.gsm8k(200)
    try:
        run = _ticking_eval_run(monkeypatch, tmp_path, local_platform.url)
        uplink = run._supervisor.uplink  # type: ignore[union-attr]
        logged = 0

        def logged_through_ticks() -> bool:
            nonlocal logged
            run.log_episodes(episodes[logged : logged + 2])  # each tick follows writes
            logged += 2
            return ticks >= 5 or logged >= 180

        wait_for(logged_through_ticks, timeout=60, what="the background's ticks")
        assert ticks >= 5
        journal = run._recorder.journal
        assert journal is not None
        journal.wake_all()  # as its shippers' pokes do when they stand down
        ticks = 0
        wait_for(logged_through_ticks, timeout=60, what="the background's ticks")
        assert ticks >= 5
        assert moved[0] == 0
        process = uplink._process  # type: ignore[attr-defined]
        os.kill(process.pid, signal.SIGKILL)
        process.wait_exit(30)
        logged = _log_until_moved(run, episodes, logged, moved, 60, "the producer to move again")
        run.log_episodes(episodes[logged:])
        run.finish(timeout=60)
        assert not uplink.begun()  # type: ignore[attr-defined]
    finally:
        gate.touch()
    assert stored_once(local_platform.run(run.id), 200, "COMPLETED")


def test_the_producer_moves_again_once_its_threads_could_not_stand_down(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handover whose threads could not stand down leaves them shipping,
    with no watcher to try again: the producer's mover, left be for the
    handover, stayed so to the run's end."""
    from primeruns.ship import startup
    from primeruns.ship.link import UplinkThreads

    moved = _count_moves(monkeypatch)
    tried = 0

    def stand_down(self: UplinkThreads) -> bool:
        nonlocal tried
        tried += 1
        raise RuntimeError("refused")

    monkeypatch.setattr(UplinkThreads, "stand_down", stand_down)
    monkeypatch.setattr(startup, "_CATCH_UP_S", 0.0)
    episodes = workloads.gsm8k(200)
    run = _ticking_eval_run(monkeypatch, tmp_path, local_platform.url)
    uplink = run._supervisor.uplink  # type: ignore[union-attr]
    run.log_episodes(episodes[:2])
    wait_for(lambda: tried, timeout=60, what="the handover")
    moved[0] = 0
    logged = _log_until_moved(
        run, episodes, 2, moved, 30, "the producer to move once the handover failed"
    )
    assert uplink._state == "threads"  # type: ignore[attr-defined]
    run.log_episodes(episodes[logged:])
    run.finish(timeout=60)
    assert not uplink.begun()  # type: ignore[attr-defined]
    assert stored_once(local_platform.run(run.id), 200, "COMPLETED")


def test_the_producer_moves_again_once_its_uplink_process_is_long_in_coming(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer's mover waits for the handover only so long: an uplink
    process that is never ready (held in its start-up here; stopped or
    starved in a run) kept the threads shipping, and nothing but the room
    count (a quarter of the room left, raw) ever woke the mover, so the
    whole run's spool stayed unmoved."""
    from primeruns.ship import startup

    moved = _count_moves(monkeypatch)
    monkeypatch.setattr(startup, "_DEFER_MOVING_S", 0.0)
    gate = held_uplink_starts(monkeypatch, tmp_path)  # never ready while the test runs
    episodes = workloads.gsm8k(200)
    try:
        run = _ticking_eval_run(monkeypatch, tmp_path, local_platform.url)
        uplink = run._supervisor.uplink  # type: ignore[union-attr]
        logged = _log_until_moved(
            run, episodes, 0, moved, 30, "the producer to move while its process is held"
        )
        assert uplink._state == "threads"  # type: ignore[attr-defined]
        run.log_episodes(episodes[logged:])
        run.finish(timeout=60)
        assert not uplink.begun()  # type: ignore[attr-defined]
    finally:
        gate.touch()
    assert stored_once(local_platform.run(run.id), 200, "COMPLETED")


def _ticking_eval_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str) -> Any:
    """An evaluation against ``url`` whose journal's background ticks come
    every 0.02 s once it is made (the first, a second after ``init()``'s first
    write, comes after the threads started, as in a real run)."""
    from primeruns.journal import maintenance

    run = _eval_run(url, point_at(monkeypatch, tmp_path, url))
    monkeypatch.setattr(maintenance, "SYNC_INTERVAL", 0.02)
    return run


def _count_moves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The entries the producer's mover moves from now on, counted in ``[0]``."""
    from primeruns.journal.mover import Mover

    real_step = Mover.step
    moved = [0]

    def step(self: Mover) -> bool:
        result = real_step(self)
        moved[0] += result
        return result

    monkeypatch.setattr(Mover, "step", step)
    return moved


def _log_until_moved(
    run: Any, episodes: list[Any], logged: int, moved: list[int], timeout: float, what: str
) -> int:
    """Log the episodes past ``logged``, two at a time, until the mover moved
    some (a tick follows writes); how many are logged then."""
    done = logged

    def moved_here() -> bool:
        nonlocal done
        if done < len(episodes):
            run.log_episodes(episodes[done : done + 2])
            done += 2
        return moved[0] > 0

    wait_for(moved_here, timeout=timeout, what=what)
    return done


_PRODUCER = """
import sys
from pathlib import Path
import primeruns as pr
import primeruns.ship.link as link
import workloads
from sdk_helpers import GatedSys

runs, url, stand_in, how = sys.argv[1:5]
link.sys = GatedSys(Path(stand_in))  # its uplink process is held in its start-up
run = pr.init(environments=["gsm8k"], model="m", runs_dir=runs, base_url=url,
              api_key="test-key-0123456789")
run.log_episodes(workloads.gsm8k(30))
print(run.id, run.journal_path, flush=True)
if how == "wait":
    sys.stdin.read()  # until killed
# else: exit without finish(): the run is closed at exit, as crashed
"""


def _start_producer(runs: Path, url: str, stand_in: Path, how: str) -> subprocess.Popen[str]:
    return procs.start(
        [sys.executable, "-c", _PRODUCER, str(runs), url, str(stand_in), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ),
        cwd=TESTS,  # where workloads.py is
    )


def test_a_producer_killed_while_its_threads_ship_is_taken_over_by_its_uplink_process(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL in the threads' phase, a traces request in flight: the process
    (let go only then) ships the rest and closes the run out as crashed."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    stand_in, gate = gated_interpreter(tmp_path)
    lp.set_faults(latency_ms=2000, routes=["/api/v1/traces"])
    try:
        proc = _start_producer(runs, lp.url, stand_in, "wait")
        assert proc.stdout is not None
        run_id, _ = proc.stdout.readline().split()
        wait_for(lambda: lp.set_faults()["delayed"] >= 1, timeout=60, what="a traces request")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        lp.set_faults(latency_ms=0)
    finally:
        gate.touch()
    wait_for(lambda: lp.run(run_id)["status"] != "RUNNING", timeout=120, what="the run's close-out")
    stored = lp.run(run_id)
    assert stored_once(stored, 30, "FAILED"), stored


def test_an_exit_without_finish_hands_over_at_once_and_the_process_ships_on(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exit waits less than the close-out may take: the process (still
    in its start-up at the exit) is told to go on, and ships it all."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    stand_in, gate = gated_interpreter(tmp_path)
    lp.set_faults(latency_ms=1000, routes=["/api/v1/traces"])
    try:
        proc = _start_producer(runs, lp.url, stand_in, "exit")
        assert proc.stdout is not None
        run_id, journal = proc.stdout.readline().split()

        def closing_at_exit() -> bool:
            with Journal.open(Path(journal), owner=False) as j:
                return bool(j.read(0, kinds={EntryKind.FINISH}, max_entries=1).entries)

        wait_for(closing_at_exit, timeout=60, what="the exit's finish entry")
        lp.set_faults(latency_ms=0)
    finally:
        gate.touch()
    assert proc.wait(timeout=120) == 0
    proc.stdout.close()
    wait_for(lambda: lp.run(run_id)["status"] != "RUNNING", timeout=120, what="the run's close-out")
    assert stored_once(lp.run(run_id), 30, "FAILED")


_NO_HTTP_LIBRARY = """
import json, sys
sys.path.insert(0, sys.argv[4])
import workloads
import primeruns as pr
run = pr.init(environments=["gsm8k"], model="m", api_key=sys.argv[3], base_url=sys.argv[1],
              runs_dir=sys.argv[2])
for episode in workloads.gsm8k(40):
    run.log_episodes([episode])
run.finish(timeout=60)
print(json.dumps([run.id, sorted(sys.modules)]))
"""

# What an evaluation's process never uses, each paid in every fresh
# process's first ``init()`` when it was imported eagerly: a training run's
# sinks (and with them sqlite3), the in-memory journal (a run no folder
# takes), urllib.request (read for proxies only when the environment names one).
_NOT_AN_EVALUATIONS = {
    "primeruns.sinks.train_metrics",
    "primeruns.sinks.train_samples",
    "primeruns.sinks.step_rows",
    "primeruns.sinks.step_ranges",
    "primeruns.journal.memory",
    "sqlite3",
    "urllib.request",
}


def test_an_evaluation_loads_no_http_library_its_process_had_not(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's calls go on the standard library's ``http.client`` (with
    ``platform.plain``): httpx and httpcore (and what they pull in where it
    is installed: trio, click, rich) were ~70-130 ms of every fresh
    process's first ``init()``, more than the rest of a one-episode run.
    Nor does it load what only a training run, or a run kept in memory,
    uses (``_NOT_AN_EVALUATIONS``). Its episodes land all the same, each
    once in each sink."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    for name in [n for n in os.environ if n.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)  # (a proxy is httpx's to honour, read by urllib.request)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _NO_HTTP_LIBRARY,
            lp.url,
            str(runs),
            API_KEY,
            str(TESTS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    run_id, loaded = json.loads(child.stdout.strip().splitlines()[-1])
    assert not {"httpx", "httpcore", "trio", "anyio", "click", "rich"} & {
        m.split(".")[0] for m in loaded
    }
    unused = set(_NOT_AN_EVALUATIONS)
    if sys.platform in ("darwin", "win32"):  # proxies read from the system's settings too
        unused.discard("urllib.request")
    assert not unused & set(loaded)
    assert stored_once(lp.run(run_id), 40, "COMPLETED")
