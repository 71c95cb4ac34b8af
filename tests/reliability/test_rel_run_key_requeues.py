"""A run's clean requeues do not take over the processes before them.

A job requeued with the same ``run_key`` logs into one run, one process
after another; each looks for the journals of the earlier ones and takes
over those whose processes are gone, to ship what they left (a SIGKILLed
process in threads mode: ``test_rel_run_key_threads.py``). A process that
finished and shipped everything left nothing: taking it over anyway copied
and imported its whole journal into a sync journal on every later requeue,
so each requeue cost more than the one before. One whose close-out did not
reach the platform still has its run to close, and is taken over. A job
requeued by the run's id does the same, and still numbers the training
samples of a step it logs again apart from its predecessor's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import procs
from rel_helpers import bound_run_id, isolated_env, platform_episode_ids
from rel_run_key import KEY, killed_leaving_all, producer, start, started

from primeruns.journal import Journal
from primeruns.local import LocalPlatform


def _ran(argv: list[str], env: dict[str, str]) -> dict[str, str]:
    """Run a process to its end (it must exit with 0): the first word of
    each line it printed, and the rest of the line."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def _requeue(
    runs: Path, lp: LocalPlatform, first: int, env: dict[str, str]
) -> tuple[Path, list[str]]:
    """One process of the run key, 10 episodes of its own, finished: its
    journal and the episode ids it logged."""
    said = _ran(producer(runs, lp, first, 10, "finish"), env)
    return Path(said["journal"]), said["logged"].split()


def _synced(home: Path) -> set[str]:
    """The local ids of the journals taken over into a sync journal."""
    root = home / ".local" / "state" / "prime-runs" / "synced"
    return (
        {p.name for p in root.iterdir() if (p / "data.mdb").is_file()} if root.is_dir() else set()
    )


def _continued_by(journal: Path) -> object:
    with Journal.open(journal, owner=False) as opened:
        return opened.get_meta("continued_by")


def _landed_once(lp: LocalPlatform, run_id: str, logged: list[str], count: int) -> None:
    """The oracle: the ``count`` episodes the processes logged are each
    stored once in the key's run, and the run was closed COMPLETED."""
    assert len(logged) == count
    assert platform_episode_ids(lp.data_dir, run_id) == dict.fromkeys(logged, 1)
    assert lp.run(run_id)["status"] == "COMPLETED"


def test_a_run_keys_clean_requeues_do_not_take_over_the_finished_processes_before_them(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Three clean processes of one run key in a row: the later ones take
    over none of the earlier ones' journals (no sync journal made of them,
    none marked continued), and every record is stored once."""
    lp = own_platform
    runs = tmp_path / "runs"
    env = isolated_env(tmp_path, {"PRIME_TRACES_URL": lp.url})
    journals: list[Path] = []
    logged: list[str] = []
    for attempt in range(3):
        journal, ids = _requeue(runs, lp, attempt * 10, env)
        journals.append(journal)
        logged += ids
    run_id = bound_run_id(journals[0], tmp_path / "home")
    assert run_id is not None
    assert {bound_run_id(j, tmp_path / "home") for j in journals} == {run_id}
    assert _synced(tmp_path / "home") == set()
    assert [_continued_by(j) for j in journals] == [None, None, None]
    _landed_once(lp, run_id, logged, 30)


def test_a_run_keys_process_whose_close_out_failed_is_taken_over_by_the_next(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Its records shipped, but the platform refused its close-out calls: it
    has its run left to close, and the next process of the key takes it
    over (its sync journal made) and closes the run, every record once."""
    lp = own_platform
    runs = tmp_path / "runs"
    home = tmp_path / "home"
    # Threads: the first process's shipping ends with it, none outlives it.
    env = isolated_env(tmp_path, {"PRIME_RUNS_UPLINK": "threads", "PRIME_TRACES_URL": lp.url})
    first, journal = start(runs, lp, 0, 10, "closeout-fails", env)
    assert first.stdin is not None and first.stdout is not None
    logged = first.stdout.readline().split()[1:]
    assert first.stdout.readline().strip() == "flushed"
    lp.set_faults(retryable_rate=1.0, statuses=[503], routes=["/api/v1/evaluations/"])
    try:
        first.stdin.write("go\n")
        first.stdin.flush()
        assert first.wait(timeout=120) == 0
    finally:
        lp.set_faults(retryable_rate=0.0, statuses=[503, 502, 429], routes=[])
    run_id = bound_run_id(journal, home)
    assert run_id is not None
    assert lp.run(run_id)["status"] != "COMPLETED"  # its close-out did not land

    nxt, more = _requeue(runs, lp, 10, env)
    logged += more
    with Journal.open(journal, owner=False) as opened:
        local_id = opened.local_id
    assert local_id in _synced(home)
    assert _continued_by(journal) == nxt.name
    _landed_once(lp, run_id, logged, 20)


def test_a_killed_process_an_earlier_requeue_took_over_is_not_taken_over_again(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A threads-mode process of the key is SIGKILLed with its records left;
    the next one takes it over and ships them through its sync journal; the
    one after that finds all of it shipped there and does not take it over
    again (it stays continued by the one that did), every record once."""
    lp = own_platform
    runs = tmp_path / "runs"
    env = isolated_env(tmp_path, {"PRIME_RUNS_UPLINK": "threads", "PRIME_TRACES_URL": lp.url})
    killed, logged = killed_leaving_all(runs, lp, 30, env)
    second, more = _requeue(runs, lp, 30, env)
    logged += more
    assert _continued_by(killed) == second.name
    third, more = _requeue(runs, lp, 40, env)
    logged += more
    assert _continued_by(killed) == second.name
    assert [_continued_by(j) for j in (second, third)] == [None, None]
    run_id = bound_run_id(killed, tmp_path / "home")
    assert run_id is not None
    _landed_once(lp, run_id, logged, 50)


def _cli_json(env: dict[str, str], *argv: str) -> Any:
    """``primeruns ARGV --json`` run to its end (exit 0): what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", *argv, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_replay_all_after_a_requeue_closed_the_run_does_not_close_the_taken_over_one_again(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A threads-mode process of the key is SIGKILLed; the next one takes
    it over and closes the run COMPLETED. ``ls`` then called the killed one
    a crashed run not closed out, and every ``replay --all`` said it closed
    the run out as crashed. Its run was closed once, by the process that
    took it over: listed as shipped, the replay passes it over."""
    lp = own_platform
    runs = tmp_path / "runs"
    env = isolated_env(tmp_path, {"PRIME_RUNS_UPLINK": "threads", "PRIME_TRACES_URL": lp.url})
    killed, logged = killed_leaving_all(runs, lp, 30, env)
    second, more = _requeue(runs, lp, 30, env)
    assert _continued_by(killed) == second.name
    commands = {**env, "PRIME_API_KEY": KEY, "PRIME_API_BASE_URL": lp.url}
    listed = {row["local_id"]: row for row in _cli_json(commands, "ls", "--runs-dir", str(runs))}
    assert listed[killed.name]["state"] == "shipped", listed[killed.name]
    replayed = _cli_json(commands, "replay", "--all", "--runs-dir", str(runs))
    assert [r for r in replayed if r.get("status") == "crashed"] == [], replayed
    run_id = bound_run_id(killed, tmp_path / "home")
    assert run_id is not None
    _landed_once(lp, run_id, logged + more, 40)


def test_a_process_a_requeue_shipped_whole_syncs_as_shipped_once_its_sync_journal_is_gone(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A threads-mode process of the key is SIGKILLed with its records left;
    the next takes it over, ships them and closes the run. The record its
    take-over left never said the run was closed (``handover.remember``):
    its sync journal deleted by hand, a ``sync`` of the killed journal was
    refused, saying it would ship its records twice. The record says so
    now: the sync sends nothing, and says why."""
    lp = own_platform
    runs = tmp_path / "runs"
    home = tmp_path / "home"
    env = isolated_env(tmp_path, {"PRIME_RUNS_UPLINK": "threads", "PRIME_TRACES_URL": lp.url})
    killed, logged = killed_leaving_all(runs, lp, 30, env)
    second, more = _requeue(runs, lp, 30, env)
    assert _continued_by(killed) == second.name
    run_id = bound_run_id(killed, home)
    assert run_id is not None
    shutil.rmtree(home / ".local" / "state" / "prime-runs" / "synced" / killed.name)
    commands = {**env, "PRIME_API_KEY": KEY, "PRIME_API_BASE_URL": lp.url}
    [done] = _cli_json(commands, "sync", str(killed))
    assert done["records"] == 0 and "is gone" in done["shipped_before"], done
    _landed_once(lp, run_id, logged + more, 40)


def _traces_left_by_a_replay(
    lp: LocalPlatform, tmp_path: Path
) -> tuple[dict[str, str], Path, list[str], list[str]]:
    """Prime Traces down, two processes of the key finish with their traces
    left, and a ``replay`` of the first leaves its 10 too (the run closed):
    the processes' environment, the first's journal, the ids each logged."""
    runs = tmp_path / "runs"
    # A sink failing at the close-out gives up after 2 s without progress.
    env = isolated_env(tmp_path, {"PRIME_TRACES_URL": lp.url, "PRIME_RUNS_STALL_S": "2"})
    commands = {**env, "PRIME_API_KEY": KEY, "PRIME_API_BASE_URL": lp.url}
    lp.set_faults(retryable_rate=1.0, statuses=[503], routes=["/api/v1/traces"])
    try:
        first, logged = _requeue(runs, lp, 0, env)
        _, more = _requeue(runs, lp, 10, env)
        replay = [sys.executable, "-m", "primeruns", "replay", str(first), "--timeout", "5"]
        done = subprocess.run(replay, capture_output=True, text=True, env=commands, timeout=180)
        assert done.returncode != 0 and "still pending traces 10" in done.stdout, done.stdout
    finally:
        lp.set_faults(retryable_rate=0.0, statuses=[503, 502, 429], routes=[])
    return env, first, logged, more


def test_a_requeue_ships_the_traces_a_replay_left_in_an_earlier_processs_sync_journal(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Prime Traces is down: the first process of the key finishes with its
    traces left (the run closed), the second takes it over and still cannot
    ship them, and a ``replay`` of the first leaves them too, recording its
    sync journal's run as closed. Traces back, the third process took that
    record for all of the first shipped and passed it over: its 10 traces
    were shipped by nothing (and ``gc --force`` then deleted the one journal
    that listed them). Now it takes it over: every episode lands once in
    Prime Traces and in the evaluation, the run COMPLETED."""
    lp = own_platform
    runs = tmp_path / "runs"
    env, first, logged, more = _traces_left_by_a_replay(lp, tmp_path)
    _, last = _requeue(runs, lp, 20, env)
    run_id = bound_run_id(first, tmp_path / "home")
    assert run_id is not None
    traces = lp.run(run_id)["traces"]
    assert traces["episodes"] == traces["distinct_episodes"] == 30, traces
    _landed_once(lp, run_id, logged + more + last, 30)
    # Shipped by the take-over, its sync journal deleted by hand is not said
    # to have left the 10 traces the replay left: a sync finds all shipped.
    shutil.rmtree(tmp_path / "home" / ".local" / "state" / "prime-runs" / "synced" / first.name)
    commands = {**env, "PRIME_API_KEY": KEY, "PRIME_API_BASE_URL": lp.url}
    done = _cli_json(commands, "sync", str(first))
    assert [r["records"] for r in done] == [0], done
    _landed_once(lp, run_id, logged + more + last, 30)


def test_a_requeue_names_the_traces_a_replay_left_in_a_sync_journal_deleted_by_hand(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """As above, but the user deletes the first process's sync journal by
    hand after the replay left its 10 traces there. Its record said the run
    was closed, which was taken for all of it shipped: a ``sync`` of the
    journal said "done: 10 episodes to traces" though it sent none, and the
    third process passed it over in silence, the 10 traces shipped by
    nothing. Which records the platform holds went with the sync journal,
    so neither may ship them again: the sync is refused and the requeue
    warns, each naming the 10 traces left and how to ship them."""
    lp = own_platform
    runs = tmp_path / "runs"
    home = tmp_path / "home"
    env, first, logged, more = _traces_left_by_a_replay(lp, tmp_path)
    commands = {**env, "PRIME_API_KEY": KEY, "PRIME_API_BASE_URL": lp.url}
    shutil.rmtree(home / ".local" / "state" / "prime-runs" / "synced" / first.name)
    sync = [sys.executable, "-m", "primeruns", "sync", str(first)]
    done = subprocess.run(sync, capture_output=True, text=True, env=commands, timeout=180)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "10 records left to ship (traces: 10)" in said, said
    third = subprocess.run(
        producer(runs, lp, 20, 10, "finish"), capture_output=True, text=True, env=env, timeout=180
    )
    assert third.returncode == 0, third.stderr[-2000:]
    warned = [line for line in third.stderr.splitlines() if str(first) in line]
    assert any("10 records left to ship (traces: 10)" in w for w in warned), third.stderr
    assert any("primeruns sync" in w for w in warned), third.stderr
    run_id = bound_run_id(first, home)
    assert run_id is not None
    # Prime Traces holds the others' once; the first's 10 are named, not guessed at.
    [last] = [line.split()[1:] for line in third.stdout.splitlines() if line.startswith("logged")]
    assert platform_episode_ids(lp.data_dir, run_id) == dict.fromkeys(more + last, 1)
    assert lp.run(run_id)["status"] == "COMPLETED"
    assert len(logged) == 10


def test_gc_force_of_a_journal_taken_over_with_records_left_says_where_they_are(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A killed process of the key is taken over while Prime Traces is down:
    its sync journal keeps its 30 traces to ship. ``gc --force`` deleted the
    killed journal saying only its size, and no listing of the runs
    directory named the sync journal again: the records were reachable by
    nothing the user was told. gc names it and the command that ships them;
    run, the 30 land once in Prime Traces (the next process's own 10, in its
    journal alone, are counted lost by gc)."""
    lp = own_platform
    runs = tmp_path / "runs"
    env = isolated_env(
        tmp_path,
        {"PRIME_RUNS_UPLINK": "threads", "PRIME_TRACES_URL": lp.url, "PRIME_RUNS_STALL_S": "2"},
    )
    commands = {**env, "PRIME_API_KEY": KEY, "PRIME_API_BASE_URL": lp.url}
    killed, logged = killed_leaving_all(runs, lp, 30, env)
    lp.set_faults(retryable_rate=1.0, statuses=[503], routes=["/api/v1/traces"])
    try:
        _, more = _requeue(runs, lp, 30, env)
    finally:
        lp.set_faults(retryable_rate=0.0, statuses=[503, 502, 429], routes=[])
    run_id = bound_run_id(killed, tmp_path / "home")
    assert run_id is not None
    gc = _cli_json(commands, "gc", "--runs-dir", str(runs), "--older-than", "0", "--force")
    by_id = {d["local_id"]: d for d in gc["deleted"]}
    left = by_id.pop(killed.name)["left_in_sync_journal"]
    assert left["records"] == 30, gc
    # The second process's own traces were in its journal alone: counted lost.
    [second] = by_id.values()
    assert second["lost_records"] == 10 and "left_in_sync_journal" not in second, gc
    _cli_json(commands, "replay", left["path"])
    assert len(more) == 10
    _landed_once(lp, run_id, logged, 30)


# argv: runs dir, base url, the API key, the run's id ("-": create it). One
# process of a training job: it logs step 10 (one the platform keeps samples
# of) and finishes.
_TRAINING = """
import sys
import workloads
import primeruns as pr
runs, url, key, run_id = sys.argv[1:5]
common = dict(kind="train", model="m", team_id="team", api_key=key, base_url=url, runs_dir=runs)
run = pr.init(name="requeued", **common) if run_id == "-" else pr.init(id=run_id, **common)
run.log_episodes(workloads.agentic_by_step(4)[10])
run.log_metrics({"loss": 1.0}, step=10)
run.finish(timeout=60)
print("run", run.id, flush=True)
print("journal", run.journal_path, flush=True)
"""


def _sample_ids(lp: LocalPlatform, run_id: str, step: int) -> list[int]:
    """The ids of the training samples the platform holds of ``step``."""
    read = httpx.get(
        f"{lp.url}/api/v1/rft/runs/{run_id}/samples",
        params={"step": step, "limit": 100},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    return [sample["sample_id"] for sample in read.json()["samples"]]


def test_a_job_requeued_by_id_after_a_clean_finish_keeps_a_steps_sample_ids_apart(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The requeued process resumes from a checkpoint and logs step 10 again.
    Its predecessor finished and shipped everything, so it is not taken
    over; its step 10 samples are on the platform all the same, and the new
    ones must not take their sample ids."""
    lp = own_platform
    runs = tmp_path / "runs"
    env = isolated_env(tmp_path, {"PRIME_TRACES_URL": lp.url})
    run_id = "-"
    journals = []
    for _ in range(2):
        said = _ran([sys.executable, "-c", _TRAINING, str(runs), lp.url, KEY, run_id], env)
        run_id = said["run"]
        journals.append(Path(said["journal"]))
    assert _synced(tmp_path / "home") == set()  # the first was not taken over
    assert [_continued_by(j) for j in journals] == [None, None]
    stored = lp.run(run_id)
    assert stored["status"] == "COMPLETED"
    assert sorted(o["step"] for o in stored["parquet_objects"]) == [10, 10]
    ids = _sample_ids(lp, run_id, 10)
    assert len(ids) == 8 and len(set(ids)) == 8, ids


# argv: as _TRAINING. A training process requeued by id that logs step 10
# once told (a line on stdin), says so, and waits for the test's SIGKILL.
_TRAINING_KILLED = """
import signal, sys
import workloads
import primeruns as pr
runs, url, key, run_id = sys.argv[1:5]
run = pr.init(id=run_id, kind="train", model="m", team_id="team", api_key=key, base_url=url,
              runs_dir=runs)
print("journal", run.journal_path, flush=True)
sys.stdin.readline()
run.log_episodes(workloads.agentic_by_step(4)[10])
print("logged", flush=True)
while True:
    signal.pause()
"""


def test_a_killed_requeue_by_id_after_a_clean_one_keeps_a_steps_sample_ids_apart(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A training job by id: the first process logs step 10 and finishes;
    the second resumes from the same checkpoint, logs step 10 again and is
    SIGKILLed before any of it shipped; the third takes it over and ships
    its step 10. All 12 samples of step 10 keep distinct ids."""
    lp = own_platform
    runs = tmp_path / "runs"
    env = isolated_env(tmp_path, {"PRIME_RUNS_UPLINK": "threads", "PRIME_TRACES_URL": lp.url})
    run_id, _ = _killed_after_a_clean_one(lp, runs, env)
    _ran([sys.executable, "-c", _TRAINING, str(runs), lp.url, KEY, run_id], env)
    ids = _sample_ids(lp, run_id, 10)
    assert len(ids) == 12 and len(set(ids)) == 12, ids


def _killed_after_a_clean_one(
    lp: LocalPlatform, runs: Path, env: dict[str, str]
) -> tuple[str, Path]:
    """A training job by id: a first process logs step 10 and finishes, a
    second logs step 10 again and is SIGKILLed before any of it shipped.
    The run's id and the killed process's journal."""
    said = _ran([sys.executable, "-c", _TRAINING, str(runs), lp.url, KEY, "-"], env)
    run_id = said["run"]
    killed, journal = started(
        [sys.executable, "-c", _TRAINING_KILLED, str(runs), lp.url, KEY, run_id], env
    )
    assert killed.stdin is not None and killed.stdout is not None
    lp.set_faults(retryable_rate=1.0, statuses=[503], routes=["/api/v1/rft/", "/api/v1/traces"])
    try:
        killed.stdin.write("go\n")
        killed.stdin.flush()
        assert killed.stdout.readline().strip() == "logged"
        procs.kill_job(killed)
        killed.wait(timeout=60)
    finally:
        lp.set_faults(retryable_rate=0.0, statuses=[503, 502, 429], routes=[])
    return run_id, journal


def _killed_with_its_spec_damaged(
    lp: LocalPlatform, tmp_path: Path
) -> tuple[str, Path, dict[str, str]]:
    """``_killed_after_a_clean_one`` (in threads mode), the killed process's
    journal then damaged to a spec of ``{}``, which names no kind: the run's
    id, that journal, and the environment."""
    env = isolated_env(tmp_path, {"PRIME_RUNS_UPLINK": "threads", "PRIME_TRACES_URL": lp.url})
    run_id, journal = _killed_after_a_clean_one(lp, tmp_path / "runs", env)
    with Journal.open(journal, owner=True) as damaged:
        damaged.set_meta("spec", {})
    return run_id, journal, env


def test_a_killed_training_process_whose_spec_is_damaged_is_taken_over_as_training(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """As above, but the killed process's journal lost its spec to damage
    (stored as ``{}``, which names no kind). The requeue taking it over is
    bound to the same run: the journal ships as the taker's, a training
    run's, and its step 10 samples reach the platform (before, it was read
    as an evaluation's and they never did)."""
    lp = own_platform
    run_id, _, env = _killed_with_its_spec_damaged(lp, tmp_path)
    _ran([sys.executable, "-c", _TRAINING, str(tmp_path / "runs"), lp.url, KEY, run_id], env)
    assert lp.run(run_id)["status"] == "COMPLETED"
    assert sorted(o["step"] for o in lp.run(run_id)["parquet_objects"]) == [10, 10, 10]
    ids = _sample_ids(lp, run_id, 10)
    assert len(ids) == 12 and len(set(ids)) == 12, ids


def test_a_job_requeued_by_id_where_its_predecessors_journal_is_not_keeps_sample_ids_apart(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The requeued process runs on another node (its runs directory another
    one), or after ``primeruns gc`` deleted the first process's journal:
    nothing tells it of its predecessor but the run it attaches to. It logs
    step 10 again all the same, and the first process's step 10 samples are
    on the platform: the new ones must not take their ids."""
    lp = own_platform
    env = isolated_env(tmp_path, {"PRIME_TRACES_URL": lp.url})
    run_id = "-"
    for node in ("node-a", "node-b"):
        runs = tmp_path / node
        said = _ran([sys.executable, "-c", _TRAINING, str(runs), lp.url, KEY, run_id], env)
        run_id = said["run"]
    assert lp.run(run_id)["status"] == "COMPLETED"
    ids = _sample_ids(lp, run_id, 10)
    assert len(ids) == 8 and len(set(ids)) == 8, sorted(ids)


def test_a_replay_of_a_bound_journal_whose_spec_is_damaged_ships_nothing_and_says_how(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The killed process's journal of the test above, its spec damaged to
    ``{}``, replayed alone (no requeue to take it over): it ships nothing,
    its training samples to no evaluation's sinks, and the replay says the
    spec is damaged and how to ship it."""
    lp = own_platform
    run_id, journal, env = _killed_with_its_spec_damaged(lp, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", "replay", str(journal)],
        capture_output=True,
        text=True,
        env={**env, "PRIME_API_KEY": KEY},
        timeout=180,
        check=False,
    )
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "spec.kind is missing" in said and "--spec FILE" in said, said
    assert len(_sample_ids(lp, run_id, 10)) == 4
    assert lp.run(run_id)["traces"]["episodes"] == 4  # the first process's
