"""Workers that were not forked from the run's process join it explicitly
(issue #29): ``run.handle()`` in the run's process, ``pr.join(handle)`` in
each worker of a multiprocessing pool with the spawn or forkserver start.
Every record whose call returned lands exactly once, the workers' finish()
leaves the run open, and the run's own finish() closes it."""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path

import fork_oracle as fo
import pool_workers
import pytest
import rel_torture as rt
import workloads

from primeruns.local import LocalPlatform

_METHODS = ["spawn", "forkserver"]


@pytest.mark.parametrize("method", _METHODS)
@pytest.mark.parametrize("worker_finishes", [False, True])
def test_pool_workers_that_join_an_evaluation_log_into_it_exactly_once(
    shared_platform: LocalPlatform, tmp_path: Path, method: str, worker_finishes: bool
) -> None:
    """``worker_finishes``: each task ends with the worker's finish() (the
    run stays open: the parent logs after it), or the workers just exit."""
    lp = shared_platform
    episodes = workloads.gsm8k(110)
    task = pool_workers.log_joined_and_finish if worker_finishes else pool_workers.log_joined
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        handle = run.handle()
        assert pickle.loads(pickle.dumps(handle)).run_id == run.id
        assert "key" not in repr(handle).lower() and rt.KEY not in repr(handle)
        with multiprocessing.get_context(method).Pool(4) as pool:
            parts = [(handle, episodes[k * 25 : (k + 1) * 25]) for k in range(4)]
            dropped = pool.map(task, parts)
            pool.close()
            pool.join()
        assert lp.run(run.id)["status"] == "RUNNING"  # no worker closed it
        run.log_episodes(episodes[100:])
        run.finish(timeout=120)
    assert dropped == [0, 0, 0, 0]
    fo.assert_exactly_once(lp, run, episodes)


@pytest.mark.parametrize("method", _METHODS)
def test_pool_workers_that_join_a_training_run_collide_with_nothing(
    train_platform: LocalPlatform, tmp_path: Path, method: str
) -> None:
    """Workers log episodes of the steps the parent logs too: every episode
    once in Prime Traces, each Parquet object its own, no sample id twice
    within a step."""
    lp = train_platform
    steps = workloads.agentic_by_step(10)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = fo.train_run(lp.url, tmp_path / "runs")
        run.log_episodes(steps[0][:4])
        handle = run.handle()
        with multiprocessing.get_context(method).Pool(2) as pool:
            parts = [(handle, steps[0][4:7]), (handle, steps[0][7:])]
            dropped = pool.map(pool_workers.log_joined, parts)
            pool.close()
            pool.join()
        run.log_episodes(steps[10])
        run.finish(timeout=120)
    assert dropped == [0, 0]
    fo.assert_training_samples_apart(lp, run, 20)


def test_a_forked_child_of_a_joined_worker_logs_into_the_run(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A spawned worker that forks a child of its own (a pool in the worker)
    which logs through the run the worker joined: the child's records land
    once, as a forked child's of the run's own process do. Before, the
    child had no journal to open and dropped every record."""
    lp = shared_platform
    episodes = workloads.gsm8k(20)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            task = (run.handle(), episodes[:10])
            [child_dropped] = pool.map(pool_workers.log_joined_through_a_forked_child, [task])
        run.log_episodes(episodes[10:])
        run.finish(timeout=120)
    assert child_dropped == 0
    fo.assert_exactly_once(lp, run, episodes)
