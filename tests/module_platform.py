"""One local platform for all the tests of a module.

Starting ``primeruns serve`` and stopping it takes about a second, most of a
short loopback test. In a module whose tests each check their own runs (by
run id, never by counting what the platform holds, nor by its count of
injected faults), the tests can share one server::

    _server, local_platform = module_platform.fixtures(train_teams=["team-a"])

Each test then gets the server running with the fault settings it started
with, whatever the test before it left (a stop, faults still on). Under
pytest-xdist each worker starts its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest

from primeruns.local import LocalPlatform

_SETTABLE = set(inspect.signature(LocalPlatform.set_faults).parameters) - {"self", "seed"}


def fixtures(**options: Any) -> tuple[Any, Any]:
    """The module-scoped server (``LocalPlatform(data_dir, **options)``) and
    the ``local_platform`` fixture that hands it to each test."""
    started_with: dict[str, Any] = {}

    @pytest.fixture(scope="module", name="module_platform_server")
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
        platform = LocalPlatform(tmp_path_factory.mktemp("module-platform"), **options)
        platform.start()
        try:
            # set_faults() without a change answers the settings in force.
            now = platform.set_faults()
            started_with.update({k: v for k, v in now.items() if k in _SETTABLE})
            yield platform
        finally:
            platform.stop()

    @pytest.fixture(name="local_platform")
    def per_test(module_platform_server: LocalPlatform) -> LocalPlatform:
        module_platform_server.start()  # a no-op while it runs
        module_platform_server.set_faults(**started_with)
        return module_platform_server

    return server, per_test
