"""Task functions for the pool tests of ``test_rel_fork_child`` and
``test_rel_join``: in a module of their own, so that a spawned or forkserver
worker imports this small module, not the test module."""

from __future__ import annotations

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
