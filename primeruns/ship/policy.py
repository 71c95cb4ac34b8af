"""How a shipper reacts to a failed attempt: classify, back off, strike.

Failures fall in four classes (docs/ARCHITECTURE.md, "Error handling"):

- *transient* (no answer, 408, 429, 5xx, a 2xx that proves nothing): keep the
  batch, wait (honouring Retry-After, else exponential backoff with jitter)
  and resend it as is;
- *record rejection* (400, 409, 413, 422, an unencodable batch): the content
  is at fault, so resending cannot help; the batch is counted as failed with
  the server's reason and the sink moves on (a 413 first halves the batch,
  down to one record: ``Shipper._rejected``);
- *fatal for the sink* (401, 402, 403, 404, other statuses): the sink stops;
  its backlog stays in the journal for ``primeruns replay``. So does a new
  connection to a loopback platform a journal chose that reached another
  user's socket (``loopback_owner.ServedByAnotherUserError``): nothing was
  sent, no record is lost, and retrying would only knock on the neighbour's
  door again; the journal waits for a sync with ``--base-url``;
- *off* (:class:`~primeruns.sinks.base.SinkOff`): the sink turned itself off on
  purpose; nothing is lost.

A *strike* is a batch that still failed transiently after ``attempts_per_strike``
attempts. Three strikes in a row retire the sink for an evaluation run and
pause it (``pause_s``) for a training run, which may last days.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from ..exceptions import is_record_rejection, is_transient
from ..settings import (
    DEFAULT_LINGER_S,
    DEFAULT_PAUSE_S,
    DEFAULT_RETRY_BASE_S,
    DEFAULT_STALL_S,
    SdkSettings,
    process_sdk_settings,
)
from ..sinks.base import SinkOff

__all__ = ["UNREACHED_S", "Failure", "RetryPolicy", "classify"]

# How long a closing run tries to register with, or drain a sink to, a
# platform whose every try since the last one that moved refused to connect
# (``RetryPolicy.unreached``), at most: the stall allowance where that is
# shorter.
UNREACHED_S = 10.0


class Failure(enum.Enum):
    TRANSIENT = "transient"
    REJECTED = "rejected"
    FATAL = "fatal"
    OFF = "off"


def classify(exc: BaseException) -> Failure:
    if isinstance(exc, SinkOff):
        return Failure.OFF
    if is_transient(exc):
        return Failure.TRANSIENT
    if is_record_rejection(exc):
        return Failure.REJECTED
    return Failure.FATAL


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff and strike settings. Four come from the SDK's settings
    (``from_settings``), so a rehearsal or a test can shorten the waits
    (``PRIME_RUNS_RETRY_BASE_S``, ``PAUSE_S``, ``LINGER_S``, ``STALL_S``)."""

    base_delay_s: float = DEFAULT_RETRY_BASE_S
    max_delay_s: float = 30.0
    retry_after_cap_s: float = 60.0
    attempts_per_strike: int = 5
    strikes_to_retire: int = 3
    pause_s: float = DEFAULT_PAUSE_S
    # A small batch waits this long after the sink's last request for more to
    # queue up (not the first after a quiet spell, nor during flush/finish):
    # a loop logging every few milliseconds then costs a request per tenth of
    # a second per sink, not one per call, in the uplink and the platform.
    linger_s: float = DEFAULT_LINGER_S
    # A closing run (its finish, or its crashed producer's close-out; replay
    # and sync ship by strikes, as a live run does) stops waiting once a sink
    # is stuck: no request of it succeeded for stall_s although it tried
    # stuck_attempts times in a row. A link failing 40% of requests does that
    # about once in 1,500 tries; a platform that is down, within stall_s
    # (closing backoffs are capped so that the tries fit).
    stall_s: float = DEFAULT_STALL_S
    stuck_attempts: int = 8

    @classmethod
    def from_settings(cls, settings: SdkSettings) -> RetryPolicy:
        """The policy of resolved settings (``primeruns.settings``: checked there)."""
        return cls(
            base_delay_s=settings.retry_base_s,
            pause_s=settings.pause_s,
            linger_s=settings.linger_s,
            stall_s=settings.stall_s,
        )

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The policy of this process's settings, for a caller handed none: those
        the uplink process adopted, else the environment's, parsed strictly
        (a bad value raises ConfigurationError naming the variable)."""
        return cls.from_settings(process_sdk_settings())

    def delay(
        self, attempt: int, retry_after: float | None, rng: random.Random, *, closing: bool = False
    ) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempt counts from 0).
        ``closing``: at most a share of the stall allowance, so that a sink
        gets its ``stuck_attempts`` tries before a close-out calls it stuck."""
        if retry_after is not None:
            wait = min(max(retry_after, 0.0), self.retry_after_cap_s)
        else:
            wait = min(self.max_delay_s, self.base_delay_s * 2.0**attempt) * rng.uniform(0.5, 1.5)
        if closing:
            wait = min(wait, self.stall_s / self.stuck_attempts)
        return wait

    def unreached(self, idle_s: float, unreached_in_a_row: int) -> bool:
        """Whether a closing run's registration or sink, idle this long, whose
        latest ``unreached_in_a_row`` tries never connected (nothing listens,
        no route), can be given up on: sooner than a platform that answers
        badly (it may be restarting), since the records stay journaled for
        ``primeruns sync`` either way. A run ended with the platform down from
        init() on waited the whole allowance, 60 s (the vendor's SDK gave up
        within about 27 s, keeping nothing); one whose platform went down
        mid-run, 69 s (the vendor's: 45 s)."""
        return idle_s >= min(self.stall_s, UNREACHED_S) and unreached_in_a_row >= 2

    def stuck(self, idle_s: float, failed_in_a_row: int) -> bool:
        """Whether a sink (or the registration) idle this long after this many
        failed tries in a row can be given up on by a closing run. Twice the
        allowance with nothing moving is enough on its own: a platform that
        holds every request until its timeout (60 s and more) never lets a
        sink make its tries."""
        if idle_s >= 2 * self.stall_s:
            return True
        return idle_s >= self.stall_s and failed_in_a_row >= self.stuck_attempts
