"""A cookie the platform's side sets (a load balancer's stickiness, say) is
sent back on the calls after it, though the client skips the cookie jar for
the answers that set none (``primeruns.platform.cookies``)."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from primeruns.platform import PlatformClient, resolve_settings


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> PlatformClient:
    settings = resolve_settings(
        api_key="pk-test", base_url="https://platform.example", environ={}, config={}
    )
    return PlatformClient(settings, transport=httpx.MockTransport(handler))


def test_a_cookie_set_by_an_answer_goes_back_with_later_calls() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("cookie"))
        if len(seen) == 2:
            return httpx.Response(200, json={}, headers={"Set-Cookie": "lb=node-3; Path=/"})
        return httpx.Response(200, json={})

    client = _client(handler)
    for _ in range(4):  # answers without the header before and after it
        client.api("POST", "/rft/metrics", {"run_id": "r", "metrics": {"step": 1}})
    assert seen == [None, None, "lb=node-3", "lb=node-3"]
