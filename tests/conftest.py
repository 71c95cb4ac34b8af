"""Shared fixtures: the local platform as a real subprocess on a temporary data
dir, and the reaping of every child process a test started."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import procs
import pytest
from hypothesis import settings

from primeruns.local import LocalPlatform

# No per-example deadline: timing targets live in tools/bench/, and on a shared
# 2-core machine a first example that pays an import or a cold cache would
# otherwise fail as "flaky" without any behaviour being wrong.
settings.register_profile("prime-runs", deadline=None)
settings.load_profile("prime-runs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.slow`` variants (the whole product of a matrix, long
    torture) run only under ``-m slow``; the default suite keeps a covering
    sample of each."""
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow variant: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _reap_children(request: pytest.FixtureRequest) -> Iterator[None]:
    """No child outlives its test, whether the test passed or not, nor an
    uplink process its producer left shipping a journal of the test's."""
    root = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    procs.reap_all()
    if root is not None:
        procs.kill_uplinks_under(root)


@pytest.fixture
def make_local_platform(tmp_path: Path) -> Iterator[Callable[..., LocalPlatform]]:
    """Factory: ``make_local_platform(**LocalPlatform kwargs)`` -> a started platform.

    Each call gets its own data dir under ``tmp_path`` (or ``data_dir=``); all
    are stopped at the end of the test.
    """
    started: list[LocalPlatform] = []

    def make(data_dir: Path | None = None, **kwargs: Any) -> LocalPlatform:
        platform = LocalPlatform(data_dir or tmp_path / f"platform-{len(started)}", **kwargs)
        started.append(platform)
        return platform.start()

    yield make
    for platform in started:
        platform.stop()


@pytest.fixture
def local_platform(make_local_platform: Callable[..., LocalPlatform]) -> LocalPlatform:
    """A started local platform with default settings (any key, every team)."""
    return make_local_platform()


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy in the environment: httpx would route a test's loopback calls
    through one, and the plain path is taken only without one."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def journal_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the journals listings read (opened or by their summary),
    in order: what a look at a runs directory costs, counted, not timed."""
    from primeruns.journal import listing

    read: list[str] = []
    real_info = listing._info

    def info(path: Path, **kwargs: Any) -> Any:
        read.append(path.name)
        return real_info(path, **kwargs)

    monkeypatch.setattr(listing, "_info", info)
    return read
