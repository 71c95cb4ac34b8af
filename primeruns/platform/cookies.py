"""Cookies looked at only in an answer that sets one.

httpx hands every response to its cookie jar: it wraps the request and the
response as urllib's and has ``http.cookiejar`` parse them, whether or not
a ``Set-Cookie`` header is there. A sync's backlog is one request per
metrics row and three per training-sample object, none of which sets a
cookie; that wrapping was ~7% of a sync's interpreter time. A response
without the header cannot change the jar, so it is skipped; one with it is
handled exactly as httpx does.
"""

from __future__ import annotations

import httpx

__all__ = ["keep_cookies_lazily"]


class _LazyCookies(httpx.Cookies):
    def extract_cookies(self, response: httpx.Response) -> None:
        if "set-cookie" in response.headers or "set-cookie2" in response.headers:
            super().extract_cookies(response)


def keep_cookies_lazily(client: httpx.Client) -> httpx.Client:
    """``client``, its (empty, new) jar swapped for one that skips answers
    setting no cookie. httpx offers no switch for it: ``Client.cookies``'s
    setter copies into a plain ``Cookies``, so the attribute behind it is set."""
    client._cookies = _LazyCookies(client.cookies)
    return client
