"""What the uplink tells its producer, written where both can read it: the journal.

The journal is the only channel between a live run's producer and its uplink
(docs/ARCHITECTURE.md): a sink's standing (off, retired, paused), the failures behind
``run.errors`` and ``on_error="raise"``, and how the close-out went are meta
values the uplink writes and the producer reads. Whether the uplink is a
process or threads in the producer (the fallback), this is the same path.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from .. import exceptions
from ..exceptions import APIError, JournalError
from ..journal import EntryKind, Journal
from ..redaction import scrub
from ..sinks.kinds import records_left
from .deadline import boot_clock

__all__ = [
    "Closeout",
    "SinkStanding",
    "episodes_written",
    "error_from_record",
    "pending_by_sink",
    "read_closeout",
    "read_errors",
    "read_standing",
    "record_closeout",
    "record_error",
    "record_standing",
    "records_left",
    "stamp_episodes_written",
    "unshipped",
]

K_ERRORS = "uplink.errors"
K_CLOSEOUT = "uplink.closeout"
_STANDING = "sink_state."
_MAX_ERRORS = 1000


def episodes_written(journal: Journal) -> int | None:
    """How many episodes Prime Traces acknowledged for this run (the traces
    sink counts them); None where the journal cannot say (damaged: the
    close-out reads it after every record, and must not raise for it)."""
    try:
        value = journal.get_meta("episodes_written", 0)
    except JournalError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def stamp_episodes_written(summary: MutableMapping[str, Any], journal: Journal) -> None:
    """Put the journal's count of episodes Prime Traces acknowledged into an
    evaluation's summary as the vendor's SDK does
    (``prime_runs.traces_episodes_written``): the platform's summary and the
    producer's ``run.summary`` both carry it. A count the journal cannot say
    (damaged) leaves the summary without it. A ``prime_runs`` value of the
    caller's that is no mapping gives way to it, as in the vendor's SDK (it
    raised from ``finish()`` here, into the caller's loop)."""
    written = episodes_written(journal)
    if written is None:
        return
    given = summary.get("prime_runs")
    prime = dict(given) if isinstance(given, Mapping) else {}
    prime["traces_episodes_written"] = written
    summary["prime_runs"] = prime


@dataclass(frozen=True)
class SinkStanding:
    """A sink's standing, as the uplink last recorded it."""

    off: str | None = None  # turned off on purpose (not a loss)
    retired: str | None = None  # stopped on failure; its backlog is kept
    paused_at: float | None = None  # boot_clock() when the pause was recorded
    paused_for: float | None = None  # seconds of the pause left then

    @property
    def paused(self) -> bool:
        """The pause is not over yet. Counted on the host's boot clock, which
        the uplink and its producer share and which never steps: on the wall
        clock, a step back of hours made ``flush()`` read a sink that ships
        again as paused for those hours, and a step forward read one still
        paused as shipping. A pause recorded on another boot (the clock reads
        less than at its start) is over."""
        if self.paused_at is None or self.paused_for is None:
            return False
        passed = boot_clock() - self.paused_at
        return 0.0 <= passed < self.paused_for

    @property
    def settled(self) -> bool:
        """Nothing more will ship without outside help (off, retired or paused)."""
        return self.off is not None or self.retired is not None or self.paused


def record_standing(
    journal: Journal, sink: str, *, off: str | None, retired: str | None, paused_for: float | None
) -> None:
    """``paused_for``: the seconds of a pause left now (None: not paused)."""
    # A reason may quote a failure's text: scrubbed as record_error does.
    journal.set_meta(
        _STANDING + sink,
        {
            "off": None if off is None else scrub(off),
            "retired": None if retired is None else scrub(retired),
            "paused_at": None if paused_for is None else boot_clock(),
            "paused_for": paused_for,
        },
    )


def read_standing(journal: Journal, sink: str) -> SinkStanding:
    value = journal.get_meta(_STANDING + sink)
    lasting = journal.get_meta(f"sink_off.{sink}")
    data = value if isinstance(value, dict) else {}
    off = data.get("off") or lasting
    return SinkStanding(
        off=None if off is None else str(off),
        retired=None if data.get("retired") is None else str(data["retired"]),
        paused_at=_seconds(data.get("paused_at")),
        paused_for=_seconds(data.get("paused_for")),
    )


def _seconds(value: object) -> float | None:
    """A number of seconds read from the journal (untrusted), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def record_error(journal: Journal, what: str, exc: BaseException) -> None:
    """Note a failure for ``run.errors`` (and ``on_error="raise"``).

    The message is scrubbed of credentials once more: the error mapping
    scrubs a server's text as it enters, but an exception from elsewhere
    (a library quoting a header) must not put a key on disk either."""
    record: dict[str, Any] = {
        "what": what,
        "type": type(exc).__name__,
        "message": scrub(str(exc)),
        "at": time.time(),
    }
    for attr in ("status_code", "code", "retry_after"):
        value = getattr(exc, attr, None)
        if isinstance(value, int | float | str):
            record[attr] = scrub(value) if isinstance(value, str) else value
    journal.push_meta(K_ERRORS, record, cap=_MAX_ERRORS)


def read_errors(journal: Journal) -> list[dict[str, Any]]:
    value = journal.get_meta(K_ERRORS, [])
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def error_text(record: Mapping[str, Any]) -> str:
    return f"{record.get('what')} failed: {record.get('type')}: {record.get('message')}"


def error_from_record(record: Mapping[str, Any]) -> BaseException:
    """The failure as an exception of its recorded class (``APIError`` if unknown)."""
    cls = getattr(exceptions, str(record.get("type")), None)
    message = str(record.get("message", ""))
    if not (isinstance(cls, type) and issubclass(cls, APIError)):
        return APIError(f"{record.get('type')}: {message}")
    kwargs: dict[str, Any] = {}
    if isinstance(record.get("status_code"), int):
        kwargs["status_code"] = record["status_code"]
    if isinstance(record.get("code"), str):
        kwargs["code"] = record["code"]
    if issubclass(cls, exceptions.RetryableAPIError) and record.get("retry_after") is not None:
        kwargs["retry_after"] = float(record["retry_after"])
    try:
        return cls(message, **kwargs)
    except TypeError:
        return APIError(message, **kwargs)


@dataclass(frozen=True)
class Closeout:
    """How the uplink closed the run out."""

    drained: bool
    stalled_s: float | None
    pending: dict[str, int]
    finalized: bool
    registered: bool
    others_left: dict[str, str] = field(default_factory=dict)
    """Per journal of another process of the run (a rank on this host) that
    was not done when the primary closed the run: why (``primeruns.ranks``)."""


def record_closeout(journal: Journal, outcome: Closeout) -> None:
    journal.set_meta(
        K_CLOSEOUT,
        {
            "drained": outcome.drained,
            "stalled_s": outcome.stalled_s,
            "pending": outcome.pending,
            "finalized": outcome.finalized,
            "registered": outcome.registered,
            "others_left": outcome.others_left,
            "at": time.time(),
        },
    )


def read_closeout(journal: Journal) -> Closeout | None:
    try:
        value = journal.get_meta(K_CLOSEOUT)
    except JournalError:
        return None
    if not isinstance(value, dict):
        return None
    stalled = value.get("stalled_s")
    pending = value.get("pending")
    others = value.get("others_left")
    return Closeout(
        drained=bool(value.get("drained")),
        stalled_s=float(stalled) if isinstance(stalled, int | float) else None,
        pending={str(k): int(v) for k, v in pending.items()} if isinstance(pending, dict) else {},
        finalized=bool(value.get("finalized")),
        registered=bool(value.get("registered")),
        others_left={str(k): str(v) for k, v in others.items()} if isinstance(others, dict) else {},
    )


def unshipped(
    journal: Journal, sink: str, kinds: Collection[EntryKind], *, after: int | None = None
) -> int:
    """How many journaled records ``sink`` has not dealt with past ``after``
    (default: its acknowledged offset), by entry headers alone."""
    if after is None:
        after = journal.acked(sink)
    return records_left(journal.tally_past(after), kinds)


def pending_by_sink(journal: Journal, sinks: Mapping[str, Collection[EntryKind]]) -> dict[str, int]:
    """Per sink of ``sinks`` (name: the kinds it ships) not turned off, the
    records it has not shipped, where any are left (reads the journal: the
    entries past the lowest offset, once for all of them)."""
    live = {
        name: kinds for name, kinds in sinks.items() if read_standing(journal, name).off is None
    }
    afters = [journal.acked(name) for name in live]
    out: dict[str, int] = {}
    for (name, kinds), past in zip(live.items(), journal.tallies_past(afters), strict=True):
        left = records_left(past, kinds)
        if left:
            out[name] = left
    return out
