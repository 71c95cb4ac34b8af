"""Task functions for the pool tests of ``test_rel_fork_child``,
``test_rel_join`` and issue #29's matrix (``rel_family``): in a module of
their own, so that a spawned or forkserver worker imports this small module,
not the test module."""

from __future__ import annotations

import itertools
import os
from typing import Any

import primeruns as pr


def log_joined(task: tuple[pr.RunHandle, list[dict[str, Any]]]) -> int:
    """Join the run and log a part of the episodes, five at a time; the
    records this worker dropped."""
    handle, part = task
    run = pr.join(handle)  # the same run on every task of this worker
    for i in range(0, len(part), 5):
        run.log_episodes(part[i : i + 5])
    return run.dropped_records


def log_joined_and_finish(task: tuple[pr.RunHandle, list[dict[str, Any]]]) -> int:
    """As ``log_joined``, then the worker's finish(): its records shipped, the run left open."""
    dropped = log_joined(task)
    run = pr.join(task[0])
    run.finish(timeout=60)
    return dropped


def log_joined_through_a_forked_child(task: tuple[pr.RunHandle, list[dict[str, Any]]]) -> int:
    """Join the run, log the first half of the episodes, and have a child of
    ``os.fork()`` (a pool of the worker's own) log the rest through the
    joined run and leave with ``os._exit``; the worker's finish() then. The
    child's exit code: 0, or the records it dropped."""
    handle, part = task
    run = pr.join(handle)
    half = len(part) // 2
    run.log_episodes(part[:half])
    pid = os.fork()
    if pid == 0:
        try:
            run.log_episodes(part[half:])
        finally:
            os._exit(min(run.dropped_records, 100))
    _, status = os.waitpid(pid, 0)
    run.finish(timeout=60)
    return os.waitstatus_to_exitcode(status)


# The run a child of fork logs into (issue #29's matrix, ``rel_family``): set
# in the run's process before it forks, inherited by the child.
RUN: pr.Run | None = None

# One part of issue #29's matrix: (the run's handle, or None to log through
# the inherited ``RUN``; who logs, 0 for the run's own process; the kind of
# run; its number of steps; whether it logs on until it is killed).
Part = tuple[pr.RunHandle | None, int, str, int, bool]
# The worker SIGKILLed in a cell whose fault is "worker".
VICTIM = 2


def say(who: int, *words: object) -> None:
    """One line on standard output, naming the process that says it: one
    write, so the lines of processes sharing the pipe never interleave."""
    line = " ".join(str(w) for w in (who, *words)) + "\n"
    os.write(1, line.encode())


def log_part(task: Part) -> int:
    """Log this process's episodes (and, in a training run, a metrics row
    per step with a key of its own, ``loss_p<who>``, and one every process
    logs, ``lr``), saying each call that returned; the records it dropped.
    The process to be killed then logs on, episodes with new ids, until it
    is: killed in the middle of its task, as a worker dies of a fault, never
    between two (where a pool's worker holds the pool's locks)."""
    import rel_rank
    import workloads

    handle, who, kind, steps, until_killed = task
    run = RUN if handle is None else pr.join(handle)
    assert run is not None
    say(who, "pid", os.getpid())
    for step, batch in rel_rank.episodes_of(kind, who, steps).items():
        run.log_episodes(batch)
        for episode in batch:
            say(who, "episode", episode["id"])
        if kind == "train":
            run.log_metrics({f"loss_p{who}": 1.0 / (step + 1), "lr": 0.1}, step=step)
            say(who, "metrics", step)
    for again in itertools.count(1) if until_killed else ():
        for batch in rel_rank.episodes_of(kind, who, steps).values():
            batch = [workloads.renew_ids(e, 1_000_000 + again) for e in batch]
            run.log_episodes(batch)
            for episode in batch:
                say(who, "episode", episode["id"])
    say(who, "done", run.dropped_records)
    return run.dropped_records
