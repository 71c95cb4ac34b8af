"""The next batch of a sink prepared while the batch before it is in flight.

A shipper has one batch in flight per sink, recorded in the journal before
its first attempt: that is what makes every batch go exactly once. Its own
work for the next batch (reading and decompressing the entries, the sink's
``prepare``: stamping, projecting, encoding, gzip) waited for the answer,
and the platform waited for that work: the uplink and the local platform
took turns, and a fast evaluation's 5,000 episodes shipped at ~60% of the
vendor's rate, neither process using a core.

Here that work runs beside the request (``Overlap.send``): the attempt goes
on one thread and the next batch is prepared on another (``sinks.fanout``,
two at once). What is prepared is only *held* (``EarlyBatch``): nothing of it
is recorded, sent or handed back to the sink (its ``carry``) until the batch
in flight is acknowledged. The shipper then records and sends it as if it
had prepared it at that moment, and only if nothing it was made from
changed: the same offset (the batch in flight was acknowledged whole, not
refused and cut), the same size limits (no 413, no isolation, no journal
trouble), the same binding. Otherwise it is dropped and the batch is made
again: at most one is held, and the cursor records what it always did.

Only a sink that says so (``prepares_while_sending``) is prepared for while
its request is in flight: its ``prepare`` and ``send`` then run at once, on
two threads, so they must share nothing that is not safe to (Prime Traces
and the evaluation sample table read their numbering in ``prepare`` and
change it only in ``restore``, which the shipper calls once the batch is
recorded). And only a batch that would go at once is made early (full, or
someone waits: a flush, the finish): a small one waits for more to queue
up, as before, and is read when its turn comes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..platform.binding import Binding
from ..sinks.base import Prepared, Sink
from ..sinks.fanout import Fanout

__all__ = ["EarlyBatch", "Overlap", "prepares_while_sending"]


def prepares_while_sending(sink: Sink) -> bool:
    """Whether ``sink``'s next batch may be prepared while its request is in flight."""
    return bool(getattr(sink, "prepares_while_sending", False))


@dataclass(frozen=True)
class EarlyBatch:
    """A batch prepared while the one before it was in flight, not recorded yet.

    ``after``, ``limits`` and ``binding`` are what it was made from: it is
    used only for a batch made from the same. ``first_seq``, ``last_read``
    and ``next_after`` are what the shipper needs of the read it was made
    from (the read's entries are not kept: their bytes are in the body).
    ``frame`` is the body as the journal stores it (``Journal.inflight_frame``:
    compressed), made here too: recording the batch then only writes it.
    """

    after: int
    limits: tuple[int, int]
    binding: Binding
    first_seq: int
    last_read: int
    next_after: int
    prepared: Prepared[Any]
    frame: bytes

    def fits(self, after: int, limits: tuple[int, int], binding: Binding) -> bool:
        """Whether it is the batch a shipper would make now from ``after``."""
        return self.after == after and self.limits == limits and self.binding == binding


class Overlap:
    """One sink's attempt and its next batch's preparation, run at once."""

    def __init__(self, name: str) -> None:
        self._fanout = Fanout(2, f"primeruns-prepare-{name}")

    def send(
        self, send: Callable[[], None], prepare: Callable[[], EarlyBatch | None]
    ) -> tuple[BaseException | None, EarlyBatch | None]:
        """Run both; what ``send`` raised (None: it succeeded) and what
        ``prepare`` made (None: nothing, whatever the reason: the batch is
        then made in its turn, which meets the reason again and deals with it)."""
        sent, made = self._fanout.run(_call, [send, prepare], give_up=_never)
        early = made.value if made.error is None else None
        return sent.error, early if isinstance(early, EarlyBatch) else None

    def close(self) -> None:
        """End the helper thread (the shipper's thread ends)."""
        self._fanout.close()


def _call(thunk: Callable[[], Any]) -> Any:
    return thunk()


def _never(exc: BaseException) -> bool:
    return False
