"""Ids put into the platform API's paths, each as one path segment.

A run id, an environment's owner or name come from a journal, and a journal
is untrusted input (one handed over by another user, a crafted spec): put
into a path as they are, ``../../teams/T/x?a=`` sent the user's key to a path
and a query of the journal's choosing (a server or proxy resolves the dot
segments). Escaped whole, an id is one segment; the ids the platform makes
are unchanged by it.
"""

from __future__ import annotations

from urllib.parse import quote

__all__ = ["segment"]


def segment(value: object) -> str:
    """``value`` as one path segment: every ``/``, ``?``, ``#`` and ``%``
    escaped, and ``.`` or ``..`` (which a path resolves) as ``%2E``."""
    text = quote(str(value), safe="")
    return text.replace(".", "%2E") if text in (".", "..") else text
