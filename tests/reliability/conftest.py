"""Reliability suite fixtures: one local platform shared by a module's trials
(runs are independent, and starting a server per trial would dominate CI time),
and the marking of the long torture variants."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from primeruns.local import LocalPlatform

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _running(platform: LocalPlatform) -> Iterator[LocalPlatform]:
    platform.start()
    try:
        yield platform
    finally:
        platform.stop()


@pytest.fixture(scope="module")
def shared_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    yield from _running(LocalPlatform(tmp_path_factory.mktemp("rel-platform")))


@pytest.fixture(scope="module")
def train_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    """A module's platform that takes training runs of ``fork_oracle.TEAM``."""
    from fork_oracle import TEAM

    yield from _running(
        LocalPlatform(tmp_path_factory.mktemp("train-platform"), train_teams=[TEAM])
    )


@pytest.fixture
def own_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    """A platform of the test's own, to stop and start."""
    yield from _running(LocalPlatform(tmp_path_factory.mktemp("own-platform")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.slow`` variants here run only under ``-m slow``."""
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="long torture variant: run with -m slow")
    here = str(Path(__file__).resolve().parent)
    for item in items:
        if "slow" in item.keywords and str(item.fspath).startswith(here):
            item.add_marker(skip)
