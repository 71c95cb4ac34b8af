"""The run's process in issue #29's matrix when its workers are its own
processes: forked children or the workers of a multiprocessing pool.

Usage: python rel_family.py RUNS_DIR BASE_URL KIND TOPOLOGY STEPS FAULT

KIND is ``eval`` or ``train``; TOPOLOGY ``fork`` (two children of
``os.fork()``), ``pool-fork`` (a pool of two workers with the fork start,
logging through the run they inherited), ``pool-forkserver`` or
``pool-spawn`` (workers that join with ``run.handle()`` and ``pr.join``).
FAULT is the cell's (``none``, ``worker``, ``primary``). With ``worker``,
worker 2 logs on after its part until it is SIGKILLed
(``pool_workers.log_part``): it dies in the middle of its task. Its pool is
then a ``concurrent.futures.ProcessPoolExecutor`` with the same start, which
fails that task with ``BrokenProcessPool`` and ends the other worker
(SIGTERM); any other pool is a ``multiprocessing.Pool``, which would wait
for that task for ever (CPython's bpo-22393). A worker killed between two
tasks, holding a lock of its pool's queues, can hang either (seen in this
matrix: ``Pool.terminate()`` and both live workers waiting for the task
queue's lock; an executor's shutdown joining a worker that waits for the
result queue's lock), so the victim never is.

It creates the run, starts its workers (``pool_workers.log_part``, indices 1
and 2) and logs its own part (index 0) meanwhile. Every line names the
process that said it (``pool_workers.say``), and says a call returned:
``0 journal PATH``, ``0 run ID``, ``<who> pid PID``, ``<who> episode ID``,
``<who> metrics STEP``, ``<who> done DROPPED``, ``0 logged``. Then it waits
for a line on its standard input (``finish``), waits for its children or
its pool's tasks (an executor's each said as ``0 task WHO done`` or ``0 task
WHO broken``), closes the pool, finishes the run and says ``0 finished``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_all
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import fork_oracle as fo
import pool_workers
import rel_torture as rt

import primeruns as pr

WORKERS = (1, 2)
_WAIT_S = 120  # for the workers' tasks: a bound, never a hang


def _open(runs_dir: str, base_url: str, kind: str) -> pr.Run:
    if kind == "train":
        return fo.train_run(base_url, Path(runs_dir))
    return rt.eval_run(base_url, Path(runs_dir))


def _fork_children(kind: str, steps: int, victim: int | None) -> list[int]:
    pids = []
    for who in WORKERS:
        pid = fo.fork()
        if pid == 0:  # the child: log its part, leave as forked children do (no atexit)
            code = 1
            try:
                pool_workers.log_part((None, who, kind, steps, who == victim))
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    return pids


def _ended(task: Future[int]) -> str:
    """How an executor's task ended: ``done``, or ``broken`` (its worker, or
    another, died: the executor ended the rest)."""
    if not task.done():
        return "running"
    return "broken" if isinstance(task.exception(), BrokenProcessPool) else "done"


def main() -> None:
    runs_dir, base_url, kind, topology = sys.argv[1:5]
    steps, fault = int(sys.argv[5]), sys.argv[6]
    victim = pool_workers.VICTIM if fault == "worker" else None
    run = _open(runs_dir, base_url, kind)
    pool_workers.RUN = run  # what a child of fork inherits
    pool_workers.say(0, "journal", run.journal_path)
    pool_workers.say(0, "run", run.id)
    pids: list[int] = []
    pool: Any = None
    tasks: dict[int, Any] = {}
    if topology == "fork":
        pids = _fork_children(kind, steps, victim)
    else:
        method = topology.removeprefix("pool-")
        handle = None if method == "fork" else run.handle()
        context = multiprocessing.get_context(method)
        with warnings.catch_warnings():  # fork with threads: Python 3.12 warns
            warnings.simplefilter("ignore", DeprecationWarning)
            if fault == "worker":
                pool = ProcessPoolExecutor(len(WORKERS), mp_context=context)
                for who in WORKERS:
                    part = (handle, who, kind, steps, who == victim)
                    tasks[who] = pool.submit(pool_workers.log_part, part)
            else:
                pool = context.Pool(len(WORKERS))
                for who in WORKERS:
                    part = (handle, who, kind, steps, False)
                    tasks[who] = pool.apply_async(pool_workers.log_part, (part,))
    pool_workers.log_part((None, 0, kind, steps, False))  # its own part, as the workers log
    pool_workers.say(0, "logged")
    sys.stdin.readline()  # finish
    for pid in pids:
        os.waitpid(pid, 0)
    if isinstance(pool, ProcessPoolExecutor):
        wait_all(tasks.values(), timeout=_WAIT_S)
        for who, task in tasks.items():
            pool_workers.say(0, "task", who, _ended(task))
        pool.shutdown(wait=True)
    elif pool is not None:
        for task in tasks.values():
            task.get(timeout=_WAIT_S)
        pool.close()
        pool.join()
    run.finish(timeout=120)
    pool_workers.say(0, "finished")


if __name__ == "__main__":
    main()
