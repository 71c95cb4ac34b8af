"""Journal tests: ``@pytest.mark.slow`` torture variants run only under ``-m slow``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="torture variant: run with -m slow")
    for item in items:
        if "slow" in item.keywords and "tests/journal" in str(item.fspath):
            item.add_marker(skip)
