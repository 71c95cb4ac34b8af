"""A rank SIGKILLed while a child it forked still logs into the run.

Ranks attach to a run by id (``primeruns.ranks``); rank 1 forks a worker of
its own (a data loader's), which logs into the run through a journal of its
own (``primeruns.forkchild``), and rank 1 is SIGKILLed (out of memory)
while the worker lives on; the job's launcher starts rank 1 again.

Nobody runs the dead rank's ``finish()``, which would have waited for its
child: the primary's close-out waits for it instead, as for any other
process of the run. And the dead rank's journal is let go once its producer
and uplink are gone, whatever its children still do: the primary neither
waits for it as if the rank still logged nor says so. The primary killed
so, its uplink's close-out waits for the child before it closes the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import one_run_oracle as oracle
import procs
import rel_helpers as rh
import rel_torture as rt
import workloads
from sdk_helpers import wait_for

from primeruns.journal import Journal, journal_info
from primeruns.journal.lock import lock_held
from primeruns.journal.meta import K_FORK_PARENT
from primeruns.local import LocalPlatform
from primeruns.ship.ledger import read_closeout

# Rank 1: its episodes, then a child's, which waits for a line on its
# standard input (the test's) before it logs more and exits; the rank waits
# to be killed.
_RANK_WITH_A_CHILD = """
import os, signal, sys
import workloads
import primeruns as pr

runs, url, key, run_id = sys.argv[1:5]
attach = {"id": run_id} if run_id else {"environments": ["gsm8k"]}  # else: it creates the run
run = pr.init(model="m", api_key=key, base_url=url, runs_dir=runs, **attach)
print("journal", run.journal_path, run.id, flush=True)
episodes = workloads.gsm8k(70)[50:]
run.log_episodes(episodes[:5])
if os.fork() == 0:
    run.log_episodes(episodes[5:10])
    print("child-logged", flush=True)
    sys.stdin.readline()
    run.log_episodes(episodes[10:15])
    print("child-finished", flush=True)
    sys.exit(0)  # its records ship as it exits
print("forked", flush=True)
signal.pause()
"""
_STEPS = 2  # rel_rank.py's steps: ranks 0 and 1 log gsm8k(24)[0:6] and [6:12]


def _rank(lp: LocalPlatform, tmp: Path, run_id: str, rank: int, **extra: str) -> oracle.Rank:
    env = rh.isolated_env(tmp, {"PRIME_TRACES_URL": lp.url, "RANK": str(rank), **extra})
    args = [str(tmp / "runs"), lp.url, run_id, "eval", str(rank), str(_STEPS)]
    proc = procs.start(
        [sys.executable, str(rh.HERE / "rel_rank.py"), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    started = oracle.Rank(rank, proc)
    started.read_until("logged")
    assert started.journal is not None, f"rank {rank} did not start"
    return started


def _kill_with_a_child(
    lp: LocalPlatform, tmp: Path, run_id: str, extra: dict[str, str]
) -> tuple[subprocess.Popen[str], list[str]]:
    """The process of ``_RANK_WITH_A_CHILD``, SIGKILLed (out of memory: its
    uplink ships on) once it forked and its child logged; what it said of
    its journal (its path and the run's id)."""
    dying = procs.start(
        [sys.executable, "-c", _RANK_WITH_A_CHILD, str(tmp / "runs"), lp.url, rt.KEY, run_id],
        env=rh.isolated_env(tmp, {"PRIME_TRACES_URL": lp.url, **extra}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert dying.stdin is not None and dying.stdout is not None
    said = {}
    for _ in range(3):
        word, *rest = dying.stdout.readline().split()
        said[word] = rest
    assert set(said) == {"journal", "forked", "child-logged"}, said
    os.kill(dying.pid, signal.SIGKILL)
    dying.wait(timeout=60)
    return dying, said["journal"]


def _child_of(runs: Path) -> Path:
    [child] = [
        p
        for p in runs.iterdir()
        if not p.name.startswith(".") and journal_info(p).meta.get(K_FORK_PARENT)
    ]
    return child


def _let_the_child_end(dying: subprocess.Popen[str], child: Path) -> None:
    """Let the child log its last episodes and exit, and wait for its
    records to be shipped (its journal let go)."""
    assert dying.stdin is not None and dying.stdout is not None
    dying.stdin.write("go\n")
    dying.stdin.flush()
    assert dying.stdout.read().split() == ["child-finished"]
    wait_for(lambda: not lock_held(child), timeout=120, what="the child's journal let go")


def _left_named(stderr: str) -> set[str]:
    """The journals the primary's finish said it closed the run without."""
    out: set[str] = set()
    for line in stderr.splitlines():
        if "other process(es) of it had not shipped everything (" in line:
            named = line.split("shipped everything (", 1)[1].rsplit("); what", 1)[0]
            out.update(part.split(": ", 1)[0] for part in named.split("; "))
    return out


def test_a_rank_killed_while_its_forked_child_logs_leaves_the_child_to_the_primary(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Before, the primary's close-out passed the dead rank's child over (a
    forked child's parent waits for it), so nothing waited for it; and it
    waited for the dead rank's journal instead, held by the child through
    the owner lock it inherited, then closed the run naming that journal as
    still logging, and the child's not at all."""
    lp = shared_platform
    run_id = oracle.create(lp, "eval")
    runs = tmp_path / "runs"
    # The primary gives up on a process whose files stay still for 2 s: the
    # child here waits for the test meanwhile.
    primary = _rank(lp, tmp_path, run_id, 0, PRIME_RUNS_STALL_S="2")
    dying, (journal, _) = _kill_with_a_child(lp, tmp_path, run_id, {"RANK": "1"})
    child = _child_of(runs)
    # Let go once its uplink shipped what it logged, while its child lives on.
    wait_for(lambda: not lock_held(Path(journal)), timeout=120, what="the dead rank's journal")
    requeued = _rank(lp, tmp_path, run_id, 1)  # the launcher starts rank 1 again

    primary.release()
    requeued.release()
    requeued.wait_finished()
    primary.wait_finished()
    assert primary.proc.stderr is not None
    named = _left_named(primary.proc.stderr.read())
    assert named == {str(child)}, named
    assert journal_info(child).meta.get("continued_by") is None  # not the requeued rank's

    _let_the_child_end(dying, child)
    pool = workloads.gsm8k(70)
    acked = [e["id"] for e in pool[:12] + pool[50:65]]
    assert [*primary.episodes, *requeued.episodes] == [e["id"] for e in pool[:12]]
    oracle.check_landed_once(lp, run_id, "eval", acked, runs)
    assert oracle.status(lp, run_id) == "COMPLETED"


def test_a_primary_killed_while_its_forked_child_logs_closes_the_run_after_the_child(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The run's creator is killed while a child it forked logs on: its
    uplink closes the run as crashed. Before, that close-out passed the
    child over (as a finish that waited for it does) and closed the run at
    once, the child's records landing in it afterwards unsaid."""
    lp = shared_platform
    runs = tmp_path / "runs"
    # Its uplink gives up on a process whose files stay still for 2 s.
    dying, (journal, run_id) = _kill_with_a_child(lp, tmp_path, "", {"PRIME_RUNS_STALL_S": "2"})
    child = _child_of(runs)
    wait_for(lambda: not lock_held(Path(journal)), timeout=120, what="its uplink's close-out")
    with Journal.open(Path(journal), owner=False) as closed:
        closeout = read_closeout(closed)
    assert closeout is not None and closeout.finalized
    assert list(closeout.others_left) == [str(child)], closeout

    _let_the_child_end(dying, child)
    pool = workloads.gsm8k(70)
    oracle.check_landed_once(lp, run_id, "eval", [e["id"] for e in pool[50:65]], runs)
    assert oracle.status(lp, run_id) == "FAILED"
