"""Ranks of one training run key behind a gateway that loses the creates' answers.

A training run cannot be looked up on the wire (contract §3.8 reads one by
its id), so a create whose answer was lost may have left an empty RUNNING
run. A process bounds its own lost creates; a run key's processes (ranks of
one job) register one after another under the key's lock, and the key named
a run only once a create succeeded. Behind a gateway losing every answer,
each of N ranks found nothing named and created again: 4N empty runs (its
``init()``'s try, then its uplink's three) where the user asked for one.
The key now counts its lost creates too, so the runs made stay bounded
whatever N is; once a create is answered, every rank ships into that run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from fork_oracle import TEAM
from rel_helpers import bound_run_id, isolated_env, journal_records
from rel_run_key import TOGETHER, at_once, together
from sdk_helpers import platform_metric_steps

from primeruns.journal import EntryKind
from primeruns.local import LocalPlatform
from primeruns.ship.lifecycle import _MAX_LOST_CREATES
from primeruns.ship.link import UPLINK_LOG_NAME

_KEY = "test-key-0123456789"
_RANKS = 4
_STEPS = 3
_CREATE = "/api/v1/rft/external-runs"

# argv: runs dir, base url, API key, run name (also the run key), rank,
# "flush", "train-on" or neither, the team, and how many steps. Logs that many metrics rows
# at steps of its own, flushes if told (a run whose creates all go
# unanswered never ships), or goes on until shipped or its uplink gave up
# ("train-on"), then finishes; prints its journal and the
# failures its run recorded. (A run whose creates go unanswered never
# ships: a short bound on its finish.) Started by ``together``, it says it
# is ready once the SDK is loaded, and opens its run when told to go.
_RANK = f"""
import os
import subprocess
import sys
import primeruns as pr
runs, url, key, name, rank, flush, team, steps = sys.argv[1:9]
init, training = pr.init, pr.TrainingSpec  # (loaded on first use)
if os.environ.get({TOGETHER!r}):
    print("ready", flush=True)
    sys.stdin.readline()
run = init(kind="train", name=name, model="m", team_id=team, run_key=name,
           training=training(max_steps=3, batch_size=1),
           api_key=key, base_url=url, runs_dir=runs)
for step in range(int(steps)):
    run.log_metrics({{"loss": 1.0, "rank": int(rank)}}, step=100 * int(rank) + step)
if flush == "flush":
    assert run.flush(timeout=60)
if flush == "train-on":
    # A training loop that goes on past the key's window: until everything
    # shipped, or the uplink gave up registering the run.
    while not run.flush(timeout=1) and not any("register" in e for e in run.errors):
        pass
run.finish(timeout=5)
print("journal", run.journal_path, flush=True)
print("errors", " | ".join(run.errors), flush=True)
"""


def _ranks(
    lp: LocalPlatform, tmp: Path, name: str, mode: str, flush: str = "no"
) -> list[tuple[Path, str]]:
    """Run ``_RANKS`` processes of run key ``name`` at once, each with its
    uplink as ``mode`` says; each one's journal and recorded failures."""
    extra = {"PRIME_TRACES_URL": lp.url}
    if mode == "threads":
        extra["PRIME_RUNS_UPLINK"] = "threads"
    env = isolated_env(tmp, extra)
    argvs = [
        [
            sys.executable,
            "-c",
            _RANK,
            *(str(tmp / "runs"), lp.url, _KEY, name, str(rank), flush, TEAM, str(_STEPS)),
        ]
        for rank in range(_RANKS)
    ]
    return [(Path(said["journal"]), said.get("errors", "")) for said in at_once(argvs, env, 240)]


def _made(lp: LocalPlatform, name: str) -> list[dict[str, object]]:
    return [r for r in lp.runs() if r.get("name") == name]


@pytest.mark.parametrize("mode", ["threads", "process"])
@pytest.mark.parametrize("answer", ["lost", "empty"])
def test_ranks_of_a_key_whose_creates_go_unanswered_leave_a_bounded_count_of_runs(
    train_platform: LocalPlatform, tmp_path: Path, mode: str, answer: str
) -> None:
    """Every create's answer is lost (the platform commits, the connection
    drops) or is an empty 200 without the run's id. On main the four ranks
    made 16 runs; now at most the key's allowance, whatever the ranks, and
    each rank keeps its records in its journal and says how many may remain."""
    lp = train_platform
    name = f"key-creates-{mode}-{answer}"
    if answer == "lost":
        lp.set_faults(ambiguous_rate=1.0, routes=[_CREATE])
    else:
        lp.set_faults(bogus_rate=1.0, bogus_processed=1.0, bogus_bodies=["empty"], routes=[_CREATE])
    try:
        ranks = _ranks(lp, tmp_path, name, mode)
    finally:
        lp.set_faults(ambiguous_rate=0.0, bogus_rate=0.0, routes=[])
    made = _made(lp, name)
    assert 1 <= len(made) <= _MAX_LOST_CREATES, f"{len(made)} runs made for one run key"
    for journal, errors in ranks:
        assert bound_run_id(journal) is None  # no answer named a run
        assert len(journal_records(journal, EntryKind.METRICS)) == _STEPS  # kept for replay
        assert f"up to {len(made)} empty RUNNING runs named {name!r} may remain" in errors


def test_ranks_of_a_key_ship_into_the_run_whose_create_was_answered(
    train_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The first two creates' answers are lost, the third is answered: the
    ranks that lost them, and those after, ship every row once into that
    run, and no more runs are made than creates were lost plus the one."""
    lp = train_platform
    name = "key-creates-answered"
    lp.set_faults(ambiguous_rate=1.0, routes=[_CREATE], max_faults=2)
    try:
        ranks = _ranks(lp, tmp_path, name, "threads", "flush")
    finally:
        lp.set_faults(ambiguous_rate=0.0, routes=[], max_faults=0)
    made = _made(lp, name)
    assert len(made) == 3
    run_ids = {bound_run_id(journal) for journal, _ in ranks}
    assert len(run_ids) == 1 and None not in run_ids
    (run_id,) = run_ids
    assert run_id is not None
    expected = Counter(100 * rank + step for rank in range(_RANKS) for step in range(_STEPS))
    assert platform_metric_steps(lp.data_dir, run_id) == expected


def _blip(lp: LocalPlatform, argv: list[str], env: dict[str, str], name: str) -> dict[str, str]:
    """The key's first process, run to its end while a gateway loses the
    answers of the creates the key allows: as many runs made as lost. What
    it printed (its journal, its errors)."""
    lp.set_faults(ambiguous_rate=1.0, routes=[_CREATE], max_faults=_MAX_LOST_CREATES)
    try:
        first = subprocess.run([*argv, "0", "no", TEAM, str(_STEPS)], **_CAPTURE, env=env)
    finally:
        lp.set_faults(ambiguous_rate=0.0, routes=[], max_faults=0)
    assert first.returncode == 0, first.stderr[-2000:]
    assert len(_made(lp, name)) == _MAX_LOST_CREATES
    return dict(line.split(" ", 1) for line in first.stdout.splitlines() if " " in line)


@pytest.mark.parametrize("mode", ["threads", "process"])
def test_a_requeue_after_a_blip_spent_its_keys_creates_says_it_gave_up_not_that_it_registers(
    train_platform: LocalPlatform, tmp_path: Path, mode: str
) -> None:
    """A gateway blip loses three creates' answers of a key's first process;
    the platform is healthy again when the job is requeued, within the
    window. The requeue sends no create (up to three empty runs may remain)
    and keeps its rows for a replay; its init() warned that the run "goes on
    journaling and registers when it can", then its uplink gave up at once:
    the user was told it would register, and it never did. Now it is told
    only that it gave up, and when a replay may create the run."""
    lp = train_platform
    name = f"key-creates-blip-{mode}"
    extra = {"PRIME_TRACES_URL": lp.url}
    if mode == "threads":
        extra["PRIME_RUNS_UPLINK"] = "threads"
    env = isolated_env(tmp_path, extra)
    argv = [sys.executable, "-c", _RANK, str(tmp_path / "runs"), lp.url, _KEY, name]
    _blip(lp, argv, env, name)
    requeue = subprocess.run([*argv, "1", "no", TEAM, str(_STEPS)], **_CAPTURE, env=env)
    assert requeue.returncode == 0, requeue.stderr[-2000:]
    assert len(_made(lp, name)) == _MAX_LOST_CREATES  # no create sent
    said = dict(line.split(" ", 1) for line in requeue.stdout.splitlines() if " " in line)
    journal = Path(said["journal"])
    assert bound_run_id(journal) is None
    assert len(journal_records(journal, EntryKind.METRICS)) == _STEPS  # kept for replay
    assert "registers when it can" not in requeue.stderr, requeue.stderr
    assert "KeyCreatesSpent" in said["errors"] and "not creating another until" in said["errors"]


# The key's window of lost creates in these tests, short enough to wait out.
_WINDOW_S = 25.0
# Sets it in every interpreter of the test's environment, an uplink
# process's too (a monkeypatch in the producer would not reach that one).
# With ``_WINDOW_FROM`` set (a file's path), the first look at a key's window
# by any of them stamps the window's start: as if the blip's last lost
# create were then. Stamped by the blip itself, the window ran while its
# process ended and the requeue's started (9 s on one of 2 cores): a host
# slower still started the requeue past the window, which then created the
# run at once, never refused, and the test failed.
_WINDOW_FROM = "PRIMERUNS_TEST_WINDOW_FROM"
_SITECUSTOMIZE = f"""
import os
import time

from primeruns.ship import deadline, run_keys

run_keys.LOST_WINDOW_S = {_WINDOW_S!r}
_marker = os.environ.get({_WINDOW_FROM!r})
if _marker:
    _window = run_keys.lost_creates_window

    def _window_from_now(key, api_root, root=None):
        try:  # the first look of all the test's interpreters, once
            os.close(os.open(_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            pass
        else:
            found = run_keys._record(key, api_root, root)
            assert found is not None and found[run_keys._LOST] == run_keys.CREATES_ALLOWED
            found |= {{
                run_keys._LOST_AT: time.time(),
                run_keys._AT_BOOT: deadline.boot_clock(),
                run_keys._BOOT_ID: run_keys._boot_id(),
            }}
            run_keys.remember(key, api_root, found, root, durable=False)
        return _window(key, api_root, root)

    run_keys.lost_creates_window = _window_from_now
"""


def _short_window_env(tmp: Path, mode: str, extra: dict[str, str]) -> dict[str, str]:
    """``isolated_env`` whose interpreters count the key's window as ``_WINDOW_S``."""
    hooks = tmp / "short-window"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    if mode == "threads":
        extra = {**extra, "PRIME_RUNS_UPLINK": "threads"}
    env = isolated_env(tmp, extra)
    env["PYTHONPATH"] = os.pathsep.join([str(hooks), env["PYTHONPATH"]])
    return env


@pytest.mark.parametrize("mode", ["threads", "process"])
def test_a_live_requeue_after_a_blip_creates_the_run_once_the_keys_window_ends(
    train_platform: LocalPlatform, tmp_path: Path, mode: str
) -> None:
    """A gateway blip loses three creates' answers of a key's first process;
    the platform is healthy again when the job is requeued, within the key's
    window. The requeue still trains when the window ends: its uplink waited
    for it, created the run once and shipped every row into it, with no
    replay. On main it sent no create and shipped nothing until a user ran
    ``primeruns replay`` after the window."""
    lp = train_platform
    name = f"key-creates-blip-wait-{mode}"
    env = _short_window_env(tmp_path, mode, {"PRIME_TRACES_URL": lp.url})
    argv = [sys.executable, "-c", _RANK, str(tmp_path / "runs"), lp.url, _KEY, name]
    _blip(lp, argv, env, name)
    # The window starts at the requeue's first look at it, however long its
    # start took: refused then, it waits the window out.
    env[_WINDOW_FROM] = str(tmp_path / "window-started")
    requeue = subprocess.run([*argv, "1", "train-on", TEAM, str(_STEPS)], **_CAPTURE, env=env)
    assert requeue.returncode == 0, requeue.stderr[-2000:]
    assert (tmp_path / "window-started").exists()
    said = dict(line.split(" ", 1) for line in requeue.stdout.splitlines() if " " in line)
    journal = Path(said["journal"])
    # Refused within the window (an uplink process logs beside the journal).
    warned = requeue.stderr if mode == "threads" else (journal / UPLINK_LOG_NAME).read_text()
    assert "tries one more create at" in warned, warned[-2000:]
    made = _made(lp, name)
    assert len(made) == _MAX_LOST_CREATES + 1  # the one create after the window
    run_id = bound_run_id(journal)
    assert run_id is not None and run_id in {str(r["id"]) for r in made}
    assert platform_metric_steps(lp.data_dir, run_id) == Counter(100 + s for s in range(_STEPS))
    assert said.get("errors", "") == ""


def test_the_process_a_blip_refused_is_told_a_requeue_does_not_ship_it_and_a_replay_does(
    train_platform: LocalPlatform, tmp_path: Path
) -> None:
    """After the blip, the requeue creates the run once the key's window
    ends and ships its own rows; the first process, refused and finished
    with its rows kept, is not taken over (no run named it when the requeue
    looked). It was told "primeruns replay from then creates the run and
    ships them", and the README that a requeue after a blip ships without a
    replay: a user trusting either waited for the requeue. Now it is told
    that a requeue ships its own records, not these, and its replay ships
    them into the requeue's run (no other create), every step once; the
    requeue's init() names its journal and the replay."""
    lp = train_platform
    name = "key-creates-blip-first"
    env = _short_window_env(tmp_path, "threads", {"PRIME_TRACES_URL": lp.url})
    argv = [sys.executable, "-c", _RANK, str(tmp_path / "runs"), lp.url, _KEY, name]
    first = _blip(lp, argv, env, name)
    assert "a requeue ships its own records, not these" in first["errors"], first["errors"]
    # The window starts at the requeue's first look at it, however long its
    # start took: refused then, it waits the window out (as in the test above).
    env[_WINDOW_FROM] = str(tmp_path / "window-started")
    requeue = subprocess.run([*argv, "1", "train-on", TEAM, str(_STEPS)], **_CAPTURE, env=env)
    assert requeue.returncode == 0, requeue.stderr[-2000:]
    assert (tmp_path / "window-started").exists()
    assert "tries one more create at" in requeue.stderr, requeue.stderr[-2000:]  # refused
    journal = Path(first["journal"])
    assert journal.name in requeue.stderr and "primeruns replay" in requeue.stderr
    said = dict(line.split(" ", 1) for line in requeue.stdout.splitlines() if " " in line)
    run_id = bound_run_id(Path(said["journal"]))
    assert run_id is not None
    assert bound_run_id(journal) is None  # not taken over: its rows wait for the replay
    replay = [sys.executable, "-m", "primeruns", "replay", str(journal)]
    commands = {**env, "PRIME_API_KEY": _KEY, "PRIME_API_BASE_URL": lp.url}
    done = subprocess.run(replay, **_CAPTURE, env=commands)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert len(_made(lp, name)) == _MAX_LOST_CREATES + 1  # the requeue's create alone
    steps = [*range(_STEPS), *(100 + s for s in range(_STEPS))]
    assert platform_metric_steps(lp.data_dir, run_id) == Counter(steps)


@pytest.mark.parametrize("mode", ["threads", "process"])
def test_ranks_of_a_key_behind_a_gateway_broken_throughout_make_at_most_twice_its_allowance(
    train_platform: LocalPlatform, tmp_path: Path, mode: str
) -> None:
    """Every create's answer is lost, and the four ranks train on past the
    key's window: each refused one waits for the window's end and tries one
    create, still counted against the key. At most the key's allowance in
    the window and the same after it: 2 x 3 runs whatever the ranks, each
    keeping its rows and saying how many runs may remain."""
    lp = train_platform
    name = f"key-creates-broken-wait-{mode}"
    env = _short_window_env(tmp_path, mode, {"PRIME_TRACES_URL": lp.url})
    argv = [sys.executable, "-c", _RANK, str(tmp_path / "runs"), lp.url, _KEY, name]
    argvs = [[*argv, str(rank), "train-on", TEAM, str(_STEPS)] for rank in range(_RANKS)]
    lp.set_faults(ambiguous_rate=1.0, routes=[_CREATE])
    try:
        # Their runs opened at one moment, however long each interpreter
        # took to start: the ranks of one job, all within the key's window.
        ranks = together(argvs, env, 240)
    finally:
        lp.set_faults(ambiguous_rate=0.0, routes=[])
    made = _made(lp, name)
    assert _MAX_LOST_CREATES < len(made) <= 2 * _MAX_LOST_CREATES, f"{len(made)} runs made"
    for said in ranks:
        journal = Path(said["journal"])
        assert bound_run_id(journal) is None
        assert len(journal_records(journal, EntryKind.METRICS)) == _STEPS  # kept for replay
        assert "empty RUNNING runs named" in said["errors"]


_CAPTURE: dict[str, object] = {"capture_output": True, "text": True, "timeout": 240}
