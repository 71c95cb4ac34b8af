"""The lookup of an evaluation an earlier create of this run made, by its
client token, after that create's answer was lost (or before a run key's
first create): adopting it rather than making a second run.

The platform's list (``GET /evaluations/``, contract §2.3) has no filter by
metadata and no choice of fields: each item carries its evaluation's whole
metadata, the run's config. An answer is read up to ``plain.MAX_ANSWER_BYTES``
(16 MiB) and refused past it, so a page of 50 evaluations carrying ~340 KB of
config each was refused on every try: the run never found its evaluation,
and, its create not to be sent again while one may exist, never registered.
So a page refused as too large is read again smaller, halved down to one
evaluation, and the look goes on from where it was with the smaller pages;
it still covers the same newest ``DEPTH`` evaluations. A single evaluation
past the bound by itself is not this run's while this run's own create
body is well under it (its metadata is in that body): it is passed over.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from primeruns.logs import get_logger

from ..exceptions import UnprovenAnswerError
from ..platform import plain
from ..platform.errors import OversizeAnswerError

__all__ = ["DEPTH", "PAGE", "find_created"]

log = get_logger("primeruns.lifecycle")

# How far back the look goes: the newest evaluations of the run's team and
# dataset, which is where a create made moments ago is; in pages of this
# many while their answers fit.
PAGE = 50
DEPTH = 200
# The namespace of the SDK's own keys in an evaluation's metadata.
NAMESPACE = "prime_runs"


def find_created(
    get: Callable[[str], dict[str, Any]],
    body: Mapping[str, Any],
    token: str,
    body_bytes: int,
    *,
    open_only: bool = False,
) -> dict[str, Any] | None:
    """The evaluation whose metadata carries ``token``, among the newest
    ``DEPTH`` of the team and dataset of the create ``body`` (``body_bytes``
    long as sent), or None. ``get(path)`` is one GET under the API root that
    raises ``OversizeAnswerError`` at once (no retry: a smaller page is the
    remedy) and retries other transient failures as the caller does. Raises
    ``UnprovenAnswerError`` for an answer without its list (``{}`` is not
    "no such evaluation": creating now could make a second).

    ``open_only``: one whose status says it is closed is passed over (a
    create this run sent made one still open; one closed is an earlier sync
    journal's of the same journal, synced anew once that one was gone:
    adopted, it was shipped every record again and finalized a second time)."""
    query = {}
    if body.get("team_id"):
        query["team_id"] = str(body["team_id"])
    if body.get("dataset"):
        query["environment_name"] = str(body["dataset"])
    size, at = PAGE, 0
    while at < DEPTH:
        path = "/evaluations/?" + urllib.parse.urlencode(
            {"limit": str(size), **query, "skip": str(at)}
        )
        try:
            listing = get(path)
        except OversizeAnswerError:
            if size > 1:
                size //= 2  # the same evaluations again, fewer at a time
                continue
            if body_bytes > plain.MAX_ANSWER_BYTES // 2:
                raise  # this run's own might be that large: cannot tell
            log.info("prime-runs: evaluation %d of the lookup is past the answer bound", at)
            at += 1
            continue
        items = listing.get("evaluations")
        if not isinstance(items, list):
            raise UnprovenAnswerError(
                "the lookup of an earlier create was answered without its "
                "'evaluations' list; cannot tell whether the run exists"
            )
        for item in items:
            meta = _as_dict(_as_dict(item).get("metadata")).get(NAMESPACE)
            if _as_dict(meta).get("client_token") == token:
                if open_only and _closed(item):
                    log.info(
                        "prime-runs: not adopting evaluation %s, closed, of this run's token",
                        _as_dict(item).get("id"),
                    )
                    continue
                found = dict(item)
                found.setdefault("evaluation_id", found.get("id"))
                # (Its id, not the item: that holds the run's whole config.)
                log.info(
                    "prime-runs: adopted the run an earlier create made: %s",
                    found.get("evaluation_id"),
                )
                return found
        if len(items) < size:
            break
        at += size
    return None


# The statuses of a closed evaluation (contract §2.3).
_CLOSED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "STOPPED"})


def _closed(item: Any) -> bool:
    status = _as_dict(item).get("status")
    return isinstance(status, str) and status.upper() in _CLOSED


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
