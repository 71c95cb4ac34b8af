"""Fixtures of the Prime Traces tests: one local platform per test module,
and the vendor's own client (``prime_traces.TracesClient``) pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prime_traces import TracesClient

from primeruns.local import LocalPlatform


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    with LocalPlatform(tmp_path_factory.mktemp("traces")) as p:
        yield p


@pytest.fixture
def client(platform: LocalPlatform) -> Iterator[TracesClient]:
    with TracesClient(api_key="k", base_url=platform.url, team_id="") as c:
        yield c
