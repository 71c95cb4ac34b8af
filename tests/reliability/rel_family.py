"""The run's process in issue #29's matrix when its workers are its own
processes: forked children or the workers of a multiprocessing pool.

Usage: python rel_family.py RUNS_DIR BASE_URL KIND TOPOLOGY STEPS

KIND is ``eval`` or ``train``; TOPOLOGY ``fork`` (two children of
``os.fork()``), ``pool-fork`` (a pool of two workers with the fork start,
logging through the run they inherited), ``pool-forkserver`` or
``pool-spawn`` (workers that join with ``run.handle()`` and ``pr.join``).
It creates the run, starts its workers (``pool_workers.log_part``, indices 1
and 2) and logs its own part (index 0) meanwhile. Every line names the
process that said it (``pool_workers.say``), and says a call returned:
``0 journal PATH``, ``0 run ID``, ``<who> pid PID``, ``<who> episode ID``,
``<who> metrics STEP``, ``<who> done DROPPED``, ``0 logged``. Then it waits
for a line on its standard input: ``finish`` (every worker's task is done:
the pool is closed and joined, the children waited for) or ``finish lost``
(a worker was SIGKILLed: its task never ends, so the pool is terminated),
finishes the run and says ``0 finished``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from pathlib import Path

import fork_oracle as fo
import pool_workers
import rel_torture as rt

import primeruns as pr

WORKERS = (1, 2)


def _open(runs_dir: str, base_url: str, kind: str) -> pr.Run:
    if kind == "train":
        return fo.train_run(base_url, Path(runs_dir))
    return rt.eval_run(base_url, Path(runs_dir))


def _fork_children(kind: str, steps: int) -> list[int]:
    pids = []
    for who in WORKERS:
        pid = fo.fork()
        if pid == 0:  # the child: log its part, leave as forked children do (no atexit)
            code = 1
            try:
                pool_workers.log_part((None, who, kind, steps))
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    return pids


def main() -> None:
    runs_dir, base_url, kind, topology = sys.argv[1:5]
    steps = int(sys.argv[5])
    run = _open(runs_dir, base_url, kind)
    pool_workers.RUN = run  # what a child of fork inherits
    pool_workers.say(0, "journal", run.journal_path)
    pool_workers.say(0, "run", run.id)
    pids: list[int] = []
    pool = None
    results = []
    if topology == "fork":
        pids = _fork_children(kind, steps)
    else:
        method = topology.removeprefix("pool-")
        handle = None if method == "fork" else run.handle()
        with warnings.catch_warnings():  # fork with threads: Python 3.12 warns
            warnings.simplefilter("ignore", DeprecationWarning)
            pool = multiprocessing.get_context(method).Pool(len(WORKERS))
        results = [
            pool.apply_async(pool_workers.log_part, ((handle, who, kind, steps),))
            for who in WORKERS
        ]
    pool_workers.log_part((None, 0, kind, steps))  # the run's own part, as the workers log theirs
    pool_workers.say(0, "logged")
    ending = sys.stdin.readline().split()
    lost = ending[1:] == ["lost"]
    for pid in pids:
        os.waitpid(pid, 0)
    if pool is not None:
        if lost:
            pool.terminate()  # the killed worker's task never ends
        else:
            for result in results:
                result.get(timeout=120)
            pool.close()
            pool.join()
    run.finish(timeout=120)
    pool_workers.say(0, "finished")


if __name__ == "__main__":
    main()
