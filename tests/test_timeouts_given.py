"""Timeouts a user passes to ``finish()`` and ``flush()``: NaN, an infinity,
a negative number. ``on_error="warn"`` promises the loop no exception, and a
bad value is said with the fix, never read as 0."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
import workloads
from sdk_helpers import API_KEY, point_at

import primeruns as pr

_EPISODES = workloads.gsm8k(40)


def test_finish_with_a_nan_timeout_ships_within_the_runs_finish_timeout_and_says_so(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, NaN read as 0 (``max(0, nan)``): the uplink was given no time,
    and the run closed out with what it had not shipped yet left behind."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, runs_dir=runs,
                  base_url=local_platform.url, finish_timeout=120)  # fmt: skip
    run.log_episodes(_EPISODES)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run.finish(timeout=math.nan)
    assert "finish: timeout=nan is taken as 120.0: pass a non-negative number" in caplog.text
    stored = local_platform.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == len(_EPISODES)


def test_flush_with_an_infinite_or_nan_timeout_never_raises_into_the_loop(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the platform gone the flush waits for the sink to give up (it is
    retired after three strikes), not past it. Before, an infinite timeout
    overflowed the wait (OverflowError out of ``flush``), and NaN waited
    in a loop that never slept."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, runs_dir=runs,
                  base_url=local_platform.url, finish_timeout=5)  # fmt: skip
    local_platform.stop()
    run.log_episodes(_EPISODES)
    assert run.flush(timeout=math.inf) is False
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        assert run.flush(timeout=math.nan) is False
    assert "flush: timeout=nan is taken as 30.0: pass a non-negative number" in caplog.text
    assert run.flush(timeout=-1.0) is False  # a deadline already passed: no wait, no warning
    run.finish()
