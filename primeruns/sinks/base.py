"""What a sink is: the part of shipping that knows one destination.

A sink turns a run of journal entries into one *batch* (a request body plus a
small recipe), and later sends a recorded batch, exactly as recorded, in one
attempt. It knows nothing of threads, cursors, retries or the journal's
storage: the shipper (:mod:`primeruns.ship.shipper`) drives it, records each
batch before its first attempt, and acknowledges it after success. That split
is what makes "a batch once attempted is resent byte-identical" true for every
destination without each sink re-implementing it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..journal import Entry, EntryKind
from ..platform.binding import Binding

__all__ = ["Binding", "Prepared", "SendContext", "Sink", "SinkOff"]


@dataclass(frozen=True)
class Prepared:
    """A batch a sink built from entries, before it is recorded in the journal.

    ``records`` is how many producer records the batch carries (for loss
    accounting); ``body`` and ``state`` are what a resend needs.
    """

    body: bytes
    state: dict[str, Any] = field(default_factory=dict)
    records: int = 0


class SinkOff(Exception):
    """Raised by a sink that turned itself off on purpose (opt-out, account not
    enabled, no pyarrow). Not a loss: the shipper stops the sink quietly.

    ``lasting`` reasons are facts about the run or the account, recorded in the
    journal so that every later process (replay, a requeued job) keeps the
    sink off; a reason of this process only (pyarrow missing here) is not, so
    a process that has what it takes ships the backlog.
    """

    def __init__(self, reason: str, *, lasting: bool = True) -> None:
        super().__init__(reason)
        self.lasting = lasting


@dataclass
class SendContext:
    """What a sink may use while sending one recorded batch."""

    binding: Binding
    state: dict[str, Any]
    save_state: Callable[[Mapping[str, Any]], None]
    """Merge keys into the batch's recorded state, durably, before going on
    (e.g. a presigned object key, or how many units of the batch are done)."""
    reject: Callable[[int, BaseException], None]
    """Count ``n`` records of a multi-request batch as failed (their own request
    was rejected) while the rest of the batch goes on."""


class Sink(Protocol):
    """A destination. Implementations live in this package, one module each."""

    name: str
    kinds: frozenset[EntryKind]
    max_entries: int
    max_bytes: int
    #: A rejected batch was refused whole (nothing of it stored) and each of
    #: its records is one entry: the shipper then isolates the bad record (by
    #: the line the server names, else by halving) and sends the rest anew.
    isolates_rejections: bool

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared | None:
        """Build the next batch from a prefix of ``entries`` (all of ``kinds``).

        Returns None when these entries make nothing to send (e.g. no sample
        projection): they are then acknowledged without a request. A sink may
        use only a prefix of ``entries``; ``Prepared.state["last_seq"]`` then
        names the last entry it consumed. It raises only when the *first* entry
        cannot be sent at all (e.g. one line over the service's limit): that
        entry alone is then counted as failed, and the rest come next time.
        """
        ...

    def send(self, body: bytes, ctx: SendContext) -> None:
        """One attempt at the recorded batch. Returns on success; raises the
        SDK's exception family (or :class:`SinkOff`) otherwise."""
        ...
