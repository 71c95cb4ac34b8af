"""The oracle of the tests where several processes log into one run (forked
children, pool workers that join): every episode once in each evaluation
sink, and a training run's samples from several processes kept apart."""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import sqlite3
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from sdk_helpers import platform_episode_ids

import primeruns as pr
from primeruns.local import LocalPlatform
from primeruns.local.objects import object_path


def sample_ids(data_dir: Path, eval_id: str) -> Counter[str]:
    """Every sample id the local platform's sample table holds for ``eval_id``."""
    conn = sqlite3.connect(f"file:{data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT sample_id FROM eval_samples WHERE eval_id = ?", (eval_id,))
        return Counter(str(r[0]) for r in rows)
    finally:
        conn.close()


def landed_once(lp: LocalPlatform, run_id: str, episodes: Sequence[dict[str, Any]]) -> bool:
    """Every episode once in Prime Traces and in the sample table, nothing else."""
    wanted = Counter(e["id"] for e in episodes)
    return platform_episode_ids(lp.data_dir, run_id) == sample_ids(lp.data_dir, run_id) == wanted


def assert_exactly_once(lp: LocalPlatform, run: pr.Run, episodes: Sequence[dict[str, Any]]) -> None:
    wanted = Counter(e["id"] for e in episodes)
    assert platform_episode_ids(lp.data_dir, run.id) == wanted  # Prime Traces
    assert sample_ids(lp.data_dir, run.id) == wanted  # the sample table
    assert run.dropped_records == 0
    assert lp.run(run.id)["status"] == "COMPLETED"


def assert_training_samples_apart(lp: LocalPlatform, run: pr.Run, episodes: int) -> None:
    """``episodes`` logged at steps 0 and 10 (10 each) by several processes:
    each once in Prime Traces, each Parquet object its own, no sample id
    used twice within a step; the run completed."""
    stored: dict[str, Any] = lp.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == episodes
    keys = [o["key"] for o in stored["parquet_objects"]]
    assert len(set(keys)) == len(keys)
    ids_by_step: dict[int, list[int]] = {}
    for obj in stored["parquet_objects"]:
        table = pq.read_table(object_path(lp.data_dir / "objects", obj["key"]))
        ids_by_step.setdefault(obj["step"], []).extend(table.column("sample_id").to_pylist())
    assert sorted(ids_by_step) == [0, 10]
    assert all(len(ids) == len(set(ids)) == 10 for ids in ids_by_step.values()), ids_by_step
    assert run.dropped_records == 0


# The team the local platforms of these tests enable for training runs.
TEAM = "team-fork"


def train_run(base_url: str, runs_dir: Path) -> pr.Run:
    """An online training run of 20 steps of 10 samples on ``base_url``."""
    from rel_torture import KEY

    return pr.init(
        kind="train",
        model="m",
        team_id=TEAM,
        training=pr.TrainingSpec(max_steps=20, batch_size=10),
        api_key=KEY,
        base_url=base_url,
        runs_dir=runs_dir,
    )


def fork() -> int:
    """``os.fork()``, without Python 3.12's warning about forking with threads
    (the run's threads are why the SDK handles the fork)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def fork_pool(processes: int) -> multiprocessing.pool.Pool:
    """A pool of ``processes`` workers started by fork, without Python 3.12's
    warning about forking with threads."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return multiprocessing.get_context("fork").Pool(processes)
