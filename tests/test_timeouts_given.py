"""Timeouts a user passes to ``finish()`` and ``flush()``: NaN, an infinity,
a negative number. ``on_error="warn"`` promises the loop no exception, and a
bad value is said with the fix, never read as 0."""

from __future__ import annotations

import importlib
import logging
import math
from fractions import Fraction
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


class _OwnNumber:
    """A number type of the user's own, read through ``__float__`` as numpy's
    scalars are (numpy is not needed here)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        return self.value

    def __repr__(self) -> str:
        return f"_OwnNumber({self.value!r})"


def _infinities() -> list[Any]:
    """An infinity of each number type a user may pass, numpy's where it is installed."""
    found: list[Any] = [math.inf, 10**400, Fraction(10**400), _OwnNumber(math.inf)]
    try:
        import numpy
    except ImportError:
        return found
    return [*found, numpy.float32("inf"), numpy.float16("inf")]


def test_flush_with_an_infinity_of_any_number_type_waits_until_shipped_and_says_nothing(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``flush(math.inf)`` waits without a limit; ``flush(10**400)`` (past a
    float's range) and numpy's ``float32("inf")`` waited the default 30 s
    instead, with a warning that the value was not a number of seconds.
    The default is made 0 here: a flush that falls back to it returns False
    before the uplink has shipped."""
    monkeypatch.setattr(importlib.import_module("primeruns.run"), "_FLUSH_TIMEOUT", 0.0)
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, runs_dir=runs,
                  base_url=local_platform.url, finish_timeout=120)  # fmt: skip
    infinities = _infinities()
    episodes = workloads.gsm8k(4 * len(infinities))
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        for i, infinity in enumerate(infinities):
            run.log_episodes(episodes[4 * i : 4 * i + 4])
            assert run.flush(timeout=infinity) is True, infinity
        run.finish(timeout=_OwnNumber(120.0))  # a finite one, taken as it is
    assert "is taken as" not in caplog.text, caplog.text
    stored = local_platform.run(run.id)
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == len(episodes)
