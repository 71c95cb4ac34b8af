"""Forked children log into their parent's run (issue #29, first bullet).

A child of fork (a multiprocessing pool with the fork start, ``os.fork()``)
logs through the run handle it inherited: its records go to a journal of its
own, attached to the parent's platform run, and land exactly once in Prime
Traces and in the evaluation sample table, with nothing counted as dropped,
as the vendor's SDK uploads them. The parent logs its own and finishes the run.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import rel_helpers as rh
import rel_torture as rt
import workloads

import primeruns as pr
from primeruns.local import LocalPlatform

# The run a pool worker logs into: set in the parent before the pool forks,
# inherited by every worker (a forked child shares nothing else with it).
_RUN: pr.Run | None = None


def _log_in_worker(part: list[dict[str, Any]]) -> int:
    assert _RUN is not None
    for i in range(0, len(part), 5):
        _RUN.log_episodes(part[i : i + 5])
    return _RUN.dropped_records


def _sample_ids(data_dir: Path, eval_id: str) -> Counter[str]:
    """Every sample id the local platform's sample table holds for ``eval_id``."""
    conn = sqlite3.connect(f"file:{data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT sample_id FROM eval_samples WHERE eval_id = ?", (eval_id,))
        return Counter(str(r[0]) for r in rows)
    finally:
        conn.close()


def _assert_exactly_once(lp: LocalPlatform, run: pr.Run, episodes: list[dict[str, Any]]) -> None:
    wanted = Counter(e["id"] for e in episodes)
    assert rh.platform_episode_ids(lp.data_dir, run.id) == wanted  # Prime Traces
    assert _sample_ids(lp.data_dir, run.id) == wanted  # the sample table
    assert run.dropped_records == 0
    assert lp.run(run.id)["status"] == "COMPLETED"


@pytest.mark.parametrize("ending", ["close", "terminate"])
def test_pool_workers_forked_from_an_evaluation_log_into_its_run_exactly_once(
    shared_platform: LocalPlatform, tmp_path: Path, ending: str
) -> None:
    """``ending``: the pool closed and joined (its workers exit through
    multiprocessing's process exit), or ended by ``with Pool() as pool:``,
    which terminates its workers (SIGTERM) as the block ends."""
    global _RUN
    lp = shared_platform
    episodes = workloads.gsm8k(110)
    ctx = multiprocessing.get_context("fork")
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = _RUN = rt.eval_run(lp.url, tmp_path / "runs")
        try:
            with warnings.catch_warnings():  # fork with threads: Python 3.12 warns
                warnings.simplefilter("ignore", DeprecationWarning)
                pool = ctx.Pool(4)
            with pool:
                parts = [episodes[k * 25 : (k + 1) * 25] for k in range(4)]
                dropped = pool.map(_log_in_worker, parts)
                if ending == "close":
                    pool.close()
                    pool.join()
            run.log_episodes(episodes[100:])
            run.finish(timeout=120)
        finally:
            _RUN = None
    assert dropped == [0, 0, 0, 0]
    _assert_exactly_once(lp, run, episodes)


def test_a_child_of_os_fork_logs_into_its_parents_run_exactly_once(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    lp = shared_platform
    episodes = workloads.gsm8k(30)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(episodes[:10])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: log, then leave as forked children do (no atexit)
            code = 1
            try:
                run.log_episodes(episodes[10:20])
                code = 0 if run.dropped_records == 0 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        run.log_episodes(episodes[20:])
        run.finish(timeout=120)
    assert os.waitstatus_to_exitcode(status) == 0
    _assert_exactly_once(lp, run, episodes)
