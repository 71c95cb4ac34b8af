"""Starlette tries an app's routes in turn, a regex each: what a training
run's sync sends per step and per traces upload is found among the first
routes, and no route placed before another takes any of its requests."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Match, Route

from primeruns.local.app import build_app
from primeruns.local.settings import ServerSettings


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Starlette]:
    built = build_app(ServerSettings(data_dir=tmp_path_factory.mktemp("routes") / "data"))
    yield built
    built.state.ctx.db.close()


def _scope(method: str, path: str) -> dict[str, object]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}


def _tried(routes: list[BaseRoute], method: str, path: str) -> list[BaseRoute]:
    """The routes the router tries for the request, up to the one that takes it."""
    tried = []
    for route in routes:
        tried.append(route)
        if route.matches(_scope(method, path))[0] == Match.FULL:
            return tried
    raise AssertionError(f"no route takes {method} {path}")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/rft/metrics"),
        ("POST", "/api/v1/rft/samples/presign"),
        ("PUT", "/storage/rft__rft_1__step-00000007__0a1b.parquet"),
        ("POST", "/api/v1/rft/samples/confirm"),
        ("POST", "/api/v1/traces"),
    ],
)
def test_a_syncs_requests_are_found_among_the_first_routes(
    app: Starlette, method: str, path: str
) -> None:
    assert len(_tried(app.router.routes, method, path)) <= 6


def test_a_metrics_row_is_found_by_the_first_route(app: Starlette) -> None:
    """A sync is one ``POST /rft/metrics`` a row: no regex is tried before its route."""
    assert len(_tried(app.router.routes, "POST", "/api/v1/rft/metrics")) == 1


def _example_path(route: Route) -> str:
    """A path ``route`` takes: each parameter given a value of its type."""
    return re.sub(
        r"{(\w+)(?::(\w+))?}",
        lambda m: {"int": "7", "dashboard_index": "7", "path": "a__b.parquet"}.get(
            m.group(2) or "", f"x-{m.group(1)}"
        ),
        route.path,
    )


def test_no_route_takes_the_requests_of_a_route_after_it(app: Starlette) -> None:
    routes = app.router.routes
    checked = 0
    for route in routes:
        if not isinstance(route, Route):
            continue  # the dashboard's static files: a mount of its own prefix
        for method in sorted(route.methods or ()):
            taken_by = _tried(routes, method, _example_path(route))[-1]
            assert taken_by is route, (method, route.path, getattr(taken_by, "path", None))
            checked += 1
    assert checked > 50
