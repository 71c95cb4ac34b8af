"""The rows of issue #29's matrix whose workers are the run's own processes
(forked children, pool workers with the fork, forkserver or spawn start):
the run's process (``rel_family.py``) is started, its workers' lines read
as they come, a worker or the whole job SIGKILLed, and the outcome held to
``one_run_oracle``.

A worker SIGKILLed: worker 2, once it said half its episodes, while it
logs on (it logs until it is killed); its uplink ships what it journaled,
and the run's ``finish()`` waits for that before it closes the run. A
pool's worker is SIGKILLed in a ``ProcessPoolExecutor``, which fails that
task with ``BrokenProcessPool`` and ends the other worker, done or not
(SIGTERM): what it logged lands all the same (``rel_family.py`` says why
not a ``multiprocessing.Pool``). The primary SIGKILLed: the run's
process and every process under it (its workers, every uplink: the job
dies) once each of its processes said half its episodes, the platform slow
to answer (so that every process leaves records to ship); then ``primeruns
replay`` of its journal ships the run and its workers' journals and closes
it as failed (a run its crashed process created, README "Ranks").
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import one_run_oracle as oracle
import pool_workers
import procs
import rel_helpers as rh
import rel_rank

from primeruns.local import LocalPlatform

_SCRIPT = rh.HERE / "rel_family.py"
_PROCESSES = (0, 1, 2)  # the run's process, then its two workers
_VICTIM = pool_workers.VICTIM
_LATENCY_MS = 150


@dataclass
class Family:
    """The run's process and what its processes said (each line a call
    that returned), by who said it."""

    proc: subprocess.Popen[str]
    journal: Path | None = None
    run_id: str | None = None
    pids: dict[int, int] = field(default_factory=dict)
    episodes: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    steps: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    said: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    ended: dict[int, str] = field(default_factory=dict)  # how each executor task ended

    def read(self) -> tuple[int, str] | None:
        """One line: (who, the word); None at the end of the output."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            return None
        who_text, word, value = [*line.strip().split(" ", 2), "", ""][:3]
        who = int(who_text)
        self.said[who].append(word)
        if word == "journal":
            self.journal = Path(value)
        elif word == "run":
            self.run_id = value
        elif word == "pid":
            self.pids[who] = int(value)
        elif word == "episode":
            self.episodes[who].append(value)
        elif word == "metrics":
            self.steps[who].append(int(value))
        elif word == "task":
            worker, how = value.split()
            self.ended[int(worker)] = how
        return who, word

    def read_until(self, done: Callable[[Family], bool]) -> None:
        """Read lines until ``done(self)`` holds, or the output ends."""
        while not done(self):
            if self.read() is None:
                return

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()


def _per_process(kind: str) -> int:
    return sum(len(b) for b in rel_rank.episodes_of(kind, 0, oracle.STEPS[kind]).values())


def _tree(pid: int) -> list[int]:
    """``pid`` and every process under it, each stopped as it is found (so
    none starts a child between the listing and the kill)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(current, signal.SIGSTOP)
            found.append(current)
            todo += procs.children(current)
    return found


def _kill_job(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the run's process and every process under it: its workers,
    the forkserver, every uplink (a scheduler's or an out-of-memory kill of
    the whole job)."""
    for pid in _tree(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def family_trial(lp: LocalPlatform, tmp: Path, topology: str, kind: str, fault: str) -> None:
    """One cell of the matrix: ``topology`` (``fork``, ``pool-fork``,
    ``pool-forkserver``, ``pool-spawn``) x ``kind`` x ``fault`` (``none``,
    ``worker``, ``primary``)."""
    if fault == "primary":
        # Each request slow while they log: the job dies with records of every
        # process left to ship, which the replay ships (and then closes the run).
        lp.set_faults(latency_ms=_LATENCY_MS)
    try:
        family = _run(lp, tmp, topology, kind, fault)
    finally:
        lp.set_faults(latency_ms=0)
    assert family.journal is not None and family.run_id is not None, dict(family.said)
    run_id = family.run_id
    if fault == "primary":
        assert oracle.status(lp, run_id) == "RUNNING"  # nobody closed it
        oracle.replay(lp, tmp, family.journal)
        # The crashed process created the run: its replay closes it as failed.
        oracle.closed_after_every_record(lp, run_id, kind, "FAILED")
    else:
        oracle.closed_after_every_record(lp, run_id, kind, "COMPLETED")
    acked = [e for who in _PROCESSES for e in family.episodes[who]]
    oracle.check_landed_once(lp, run_id, kind, acked, tmp / "runs")
    if kind == "train":
        oracle.check_metrics(lp, run_id, {f"loss_p{w}": family.steps[w] for w in _PROCESSES})


def _run(lp: LocalPlatform, tmp: Path, topology: str, kind: str, fault: str) -> Family:
    """Start the run's process, apply the fault, let it finish (unless it
    was killed); what its processes said."""
    env = rh.isolated_env(tmp / "home", {"PRIME_TRACES_URL": lp.url})
    args = [str(tmp / "runs"), lp.url, kind, topology, str(oracle.STEPS[kind]), fault]
    proc = procs.start(
        [sys.executable, str(_SCRIPT), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    family = Family(proc)
    half = _per_process(kind) // 2
    if fault == "worker":
        family.read_until(lambda f: len(f.episodes[_VICTIM]) >= half)
        assert _VICTIM in family.pids, f"worker {_VICTIM} never started: {dict(family.said)}"
        os.kill(family.pids[_VICTIM], signal.SIGKILL)  # out of memory: its uplink ships on
    elif fault == "primary":
        # Each process has journaled records when the job dies.
        family.read_until(lambda f: all(len(f.episodes[w]) >= half for w in _PROCESSES))
        _kill_job(proc)
        family.read_until(lambda f: False)  # what they said before they died
        proc.wait(timeout=60)
    if fault != "primary":
        # An executor ends the victim's sibling when the victim dies: only
        # the run's own process is sure to finish its part.
        executor = fault == "worker" and topology != "fork"
        living = [w for w in _PROCESSES if w == 0 or not (w == _VICTIM or executor)]
        family.read_until(
            lambda f: "logged" in f.said[0] and all("done" in f.said[w] for w in living)
        )
        assert "logged" in family.said[0], f"the run's process stopped: {dict(family.said)}"
        for who in living:
            assert "done" in family.said[who], f"process {who}: {family.said[who][-3:]}"
        family.tell("finish")
        family.read_until(lambda f: "finished" in f.said[0])
        assert "finished" in family.said[0], f"the run did not finish: {dict(family.said)}"
        assert proc.wait(timeout=180) == 0
        if executor:
            # The victim's task broken, the other one's done or broken.
            assert family.ended.get(_VICTIM) == "broken", family.ended
            assert family.ended.get(1) in ("done", "broken"), family.ended
    return family
