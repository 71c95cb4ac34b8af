"""What a sink is: the part of shipping that knows one destination.

A sink turns a run of journal entries into one *batch* (a request body plus a
small recipe), and later sends a recorded batch, exactly as recorded, in one
attempt. It knows nothing of threads, cursors, retries or the journal's
storage: the shipper (:mod:`primeruns.ship.shipper`) drives it, records each
batch before its first attempt, and acknowledges it after success. That split
is what makes "a batch once attempted is resent byte-identical" true for every
destination without each sink re-implementing it.

What a sink records with a batch is a frozen dataclass of its own, its
*progress* (``progress_type``): the recipe a resend needs (an idempotency
key, the rows to look for) and how far a multi-request batch got (objects
done, a presigned key). The sink reads it as typed fields and replaces it
whole (``SendContext.save_progress``); how it is written to the journal, and
read back from one that may be damaged, is the shipper's business
(:mod:`primeruns.ship.batchstate`), so a sink never handles the stored form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import orjson

from ..journal import Entry, EntryKind
from ..platform.binding import Binding

__all__ = ["Binding", "NoProgress", "Prepared", "SendContext", "Sink", "SinkOff", "parse_entry"]

P = TypeVar("P")


def parse_entry(entry: Entry) -> Any:
    """An entry's record, parsed for one sink (a sink may be handed a parser
    shared with the journal's other sinks instead: ``ship.parsed``)."""
    return orjson.loads(entry.payload)


@dataclass(frozen=True)
class NoProgress:
    """The progress of a sink whose batches need nothing but their body."""


@dataclass(frozen=True)
class Prepared(Generic[P]):
    """A batch: as a sink built it from entries, and as the shipper reads it
    back from the journal for each attempt.

    ``records`` is how many producer records the batch carries (for loss
    accounting); ``body`` and ``progress`` are what a resend needs.
    ``last_seq`` names the last entry the batch consumed when the sink used
    only a prefix of the entries it was given (None: all of them).
    ``carry`` is what the sink carries from batch to batch (rollout numbers,
    sample id ranges), JSON-able and read only by its ``restore``: kept once
    the batch is recorded (of a sink that ``carries_parts``: the parts the
    batch changed). ``tidied`` (of a sink that ``carries_parts``): parts it
    saves again as they were before the batch, without what no longer
    counts (the rollout numbering's stale counts), in the write that saves
    ``carry``: the same whichever way the batch goes, so neither recorded
    with it nor given back if it is refused. ``counters`` are added to the
    journal's meta values of those names once the batch is acknowledged.
    """

    body: bytes
    records: int
    progress: P
    last_seq: int | None = None
    carry: Mapping[str, Any] | None = None
    tidied: Mapping[str, Any] | None = None
    counters: Mapping[str, int] = field(default_factory=dict)


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
class SendContext(Generic[P]):
    """What a sink may use while sending one recorded batch."""

    binding: Binding
    progress: P
    """The batch's progress as recorded (after the last ``save_progress``)."""
    record: Callable[[P, P], None]
    """The shipper's: records a change of progress (from, to), durably."""
    failed_at_ack: dict[int, tuple[int, BaseException]] = field(default_factory=dict)
    """Records of the batch refused for their content, by the sink's number
    for their part of it: (count, why). Counted as failed in the one write
    that acknowledges the batch, so exactly once whatever dies when: a sink
    records each refusal in its progress, and sets it here again on every
    attempt (counted at once, in a write of their own, a death before the
    progress saying so had them refused and counted again)."""

    def save_progress(self, progress: P) -> None:
        """Make ``progress`` the batch's, durably, before going on (e.g. a
        presigned object key, or how many units of the batch are done): the
        sink passes ``dataclasses.replace(ctx.progress, ...)``."""
        self.record(self.progress, progress)
        self.progress = progress


class Sink(Protocol):
    """A destination. Implementations live in this package, one module each.

    A sink may also set ``prepares_while_sending = True`` (read with
    ``getattr``; default False): its ``prepare`` for the next batch and its
    ``send`` of the batch in flight may then run at once, on two threads
    (``ship.early``), so neither may change what the other reads. And
    ``reads_ahead_of_batch = True`` (the same way): its batches take a
    prefix of what is read (one training step), so the shipper reads about
    twice the last batch for the next, not ``max_entries``
    (``ship.readahead.next_want``). And ``passes_over_entries = True``
    (the same way): some entries of its kinds make none of its records (the
    sample table's steps off its cadence); without it, each entry of its
    kinds in a batch's range is one of the batch's records, so a damaged
    batch is known to have held them all, whatever its state says.
    And ``carries_parts = True`` (the same way): its ``Prepared.carry`` is
    only the parts of its numbering the batch changed (part name to value),
    which the shipper saves one by one and hands back to ``restore`` (all of
    them at start-up), so a batch's carry does not grow with the run.
    """

    name: str
    kinds: frozenset[EntryKind]
    max_entries: int
    max_bytes: int
    #: A rejected batch was refused whole (nothing of it stored) and each of
    #: its records is one entry: the shipper then isolates the bad record (by
    #: the line the server names, else by halving) and sends the rest anew.
    isolates_rejections: bool
    #: The frozen dataclass of its batches' progress: a recorded batch's is
    #: read back into it.
    progress_type: type[Any]

    def prepare(self, entries: Sequence[Entry], binding: Binding) -> Prepared[Any] | None:
        """Build the next batch from a prefix of ``entries`` (all of ``kinds``).

        Returns None when these entries make nothing to send (e.g. no sample
        projection): they are then acknowledged without a request. A sink may
        use only a prefix of ``entries``; ``Prepared.last_seq`` then names the
        last entry it consumed. It raises only when the *first* entry cannot
        be sent at all (e.g. one line over the service's limit): that entry
        alone is then counted as failed, and the rest come next time.
        """
        ...

    def send(self, body: bytes, ctx: SendContext[Any]) -> None:
        """One attempt at the recorded batch. Returns on success; raises the
        SDK's exception family (or :class:`SinkOff`) otherwise."""
        ...
