"""Helpers shared by the SDK tests: an isolated environment pointed at a local
platform, and waits on real conditions (never fixed sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

API_KEY = "test-key-0123456789"


def point_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str | None) -> Path:
    """Isolate settings from the machine (HOME, PRIME_* variables) and point the
    SDK at ``url``. Returns the runs directory to pass as ``runs_dir``."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    for var in (
        "PRIME_API_KEY",
        "PRIME_API_BASE_URL",
        "PRIME_BASE_URL",
        "PRIME_TEAM_ID",
        "PRIME_TRACES_URL",
        "PRIME_TRACES_OPT_OUT",
        "PRIME_RUNS_MODE",
        "PRIME_RUNS_DIR",
    ):
        monkeypatch.delenv(var, raising=False)
    # Short backoff so fault-injection tests finish quickly; the policy is the same.
    monkeypatch.setenv("PRIME_RUNS_RETRY_BASE_S", "0.02")
    if url is not None:
        monkeypatch.setenv("PRIME_TRACES_URL", url)
    runs = tmp_path / "runs"
    return runs


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
