"""One thread per sink that ships the journal from the sink's acknowledged offset.

The loop: read the entries after the cursor, let the sink build a batch,
record the batch in the journal (its exact body), send it, acknowledge it.
A batch found recorded at start-up (a crash or restart mid-request) is sent
again exactly as recorded, before anything new: so a content-addressed upload
is replayed, never duplicated, and a sink that cannot deduplicate (the eval
sample table) gets to check first. What queued up during one request goes out
as the next batch, so the request rate follows the network, not the producer.

The producer never waits on this thread: it only appends to the journal,
which wakes the shipper through a condition variable (no polling); in the
uplink process the producer's wake-ups arrive by pipe (``ship.link``). A
sink's standing is written to the journal (``ledger``) whenever it changes,
so the producer reads it from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from primeruns.logs import get_logger

from ..exceptions import APIError, JournalCorruptError, JournalError, RetryableAPIError
from ..journal import Damage, Entry, InFlight, Journal
from ..platform.binding import Binding
from ..platform.errors import never_reached
from ..sinks.base import Prepared, SendContext, Sink
from ..threads import bounded, start_daemon
from . import batchstate, ledger, resident
from .early import EarlyBatch, Overlap, prepares_while_sending
from .parsed import SharedRecords
from .policy import Failure, RetryPolicy, classify
from .readahead import ReadAhead, next_want
from .sharedreads import SharedReads

__all__ = ["Shipper", "ShipperState", "drain_all"]

log = get_logger("primeruns.ship")

# The kinds of damage to a journal's structure a shipper says (``_say_structure``).
_STRUCTURE_SAID = 4


@dataclass
class ShipperState:
    """A sink's standing, for ``run.failed_records``, ``flush`` and the CLI."""

    active: bool = True
    off_reason: str | None = None  # turned off on purpose: not a loss
    retired_reason: str | None = None  # stopped on failure: backlog kept in the journal
    paused_until: float = 0.0
    strikes: int = 0
    failed_in_a_row: int = 0  # attempts failed since the last request that moved a batch on
    unreached_in_a_row: int = 0  # of those, the latest in a row that never connected
    last_error: str | None = None  # the latest transient failure, until something moves
    batches_sent: int = 0
    records_sent: int = 0
    bytes_sent: int = 0


class Shipper:
    """Ships one sink. Thread-safe controls: ``start``, ``drain``, ``stop``."""

    def __init__(
        self,
        journal: Journal,
        sink: Sink,
        *,
        binding: Callable[[], Binding | None],
        training: bool,
        policy: RetryPolicy,
        on_failure: Callable[[str, BaseException], None],
        on_loss: Callable[[str, BaseException], None] | None = None,
        seed: int | None = None,
        on_progress: Callable[[], None] | None = None,
        reads: SharedReads | None = None,
        records: SharedRecords | None = None,
    ) -> None:
        """``reads``: the entries read once for this journal's shippers whose
        sinks take them (``ship.sharedreads``; default: read for this one).
        ``records``: what the sinks send of them, made once for all
        (``ship.parsed``), if the sink takes it from there. ``on_loss``: told
        of records the platform refused for their content, counted lost with
        the reason (default ``on_failure``): no retry would ship them, so a
        sync that did all it could is not failed by them."""
        self.journal = journal
        self._on_progress = on_progress
        self.sink = sink
        self.name = sink.name
        self._binding = binding
        self._training = training
        self._policy = policy
        self._on_failure = on_failure
        self._on_loss = on_loss or on_failure
        self._rng = random.Random(seed)
        self.state = ShipperState()
        self._progress = threading.Condition()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._scanned = journal.acked(self.name)
        self._reads = reads if reads is not None and sink.kinds <= reads.kinds else None
        self._records = records
        # Read once, whatever prefix a batch takes (and, shared, whichever sink reads first).
        self._ahead = ReadAhead(
            journal if self._reads is None else self._reads.reader(self.name), sink.kinds
        )
        # What a sink carries from batch to batch (e.g. rollout numbering): the
        # recorded batch's copy if there is one, else the last one saved (the
        # same, saved before the batch was recorded: the one to go on from
        # when the batch's state is damaged, never numbering afresh).
        cursor = journal.cursor(self.name)
        self._carry_parts = carries_parts(sink)
        carry = None if cursor.inflight is None else batchstate.carry_of(cursor.inflight.state)
        if self._carry_parts:
            recorded, carry = carry, self._saved_parts()
            if recorded is not None:
                # Over them the parts the batch in flight recorded (the same,
                # or older: a batch saved but never recorded stored no row,
                # so going back on its numbers reuses none), saved again
                # where they are not what is saved (``_keep_recorded``).
                self._keep_recorded({p: v for p, v in recorded.items() if carry.get(p) != v})
                carry.update(recorded)
        elif carry is None:
            carry = journal.get_meta(f"carry.{self.name}")
        restore = getattr(sink, "restore", None)
        if isinstance(carry, dict) and restore is not None:
            try:
                restore(carry)
            except (TypeError, ValueError) as exc:
                # A damaged journal: better numbering afresh than no shipping.
                log.warning(
                    "%s: the carried numbering is unreadable (%s); starting afresh", self.name, exc
                )
        off = journal.get_meta(f"sink_off.{self.name}")
        if off is not None:  # turned off on purpose by an earlier process
            self.state.active = False
            self.state.off_reason = str(off)
        self._thread: threading.Thread | None = None
        self._final = False
        # Monotonic time of the last request; none yet: the first batch never
        # lingers (0.0 made it wait out the linger on a machine up for less
        # than linger_s, whose monotonic clock starts near zero).
        self._last_send = float("-inf")
        # The last batch took a prefix of the entries it was given: the next
        # one's are here already, so waiting for more would only slow a
        # backlog (the sample table: one object per step, 10 a second).
        self._left_behind = False
        # Entries read for the next batch while batches take a prefix, of a
        # sink that asks so (``readahead.next_want``); None: its max_entries.
        self._want: int | None = None
        self._reads_ahead = bool(getattr(sink, "reads_ahead_of_batch", False))
        self._hurry_until = 0.0  # no lingering until then (a flush waits)
        self._shrink = 1  # batch size divisor after journal write failures
        self._isolate: int | None = None  # entry cap while a rejected record is isolated
        # Records of a refused batch set apart (``_set_apart``): the lines the
        # sink named, until the batch is made again and they are known by
        # seq; then each seq and why, until a batch that covers it is
        # acknowledged, counting it as failed (or it comes first in one).
        self._apart_lines: _ApartLines | None = None
        self._apart: dict[int, BaseException] = {}
        # Entry cap learned from a 413 (the platform's or a proxy's size
        # limit): halved at each, doubled back at each success.
        self._fit: int | None = None
        # The last entry a damage report counted (``_count_damage``), here or
        # by an earlier process that stopped before it acknowledged past it
        # (or that counted what damage cost the log's end: never acknowledged).
        damaged_end = journal.damaged_end()
        self._damage_through = min(journal.damage_counted(self.name), damaged_end)
        # Damage past the log's end not counted yet: no acknowledgement
        # passes it, so a drain waits for this (``settled``) or a process
        # whose sink had shipped everything else ended without counting it.
        self._damage_owed = damaged_end if damaged_end > journal.last_seq() else -1
        # Damage to the structure already said (``_count_damage``): a stray
        # key is met again by every read that walks past it.
        self._structure_said: set[str] = set()
        self._moved_at = time.monotonic()  # the last request that moved a batch on
        # The last try that connected (or moved): what the short allowance of
        # a platform refusing every connection counts from (``stuck_for``).
        self._reached_at = self._moved_at
        # The next batch, prepared while the one before it was in flight
        # (``ship.early``), for a sink whose prepare and send may run at once.
        self._overlap = Overlap(self.name) if prepares_while_sending(sink) else None
        self._early: EarlyBatch | None = None

    # -- control ------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = start_daemon(self._run, f"primeruns-ship-{self.name}")

    def poke(self) -> None:
        """Wake the thread now: a binding arrived, or a pause should end early."""
        self._wake.set()
        self.journal.wake_all()

    def hurry(self, seconds: float = 5.0) -> None:
        """Send small batches at once for a while: someone waits for them (flush)."""
        self._hurry_until = time.monotonic() + seconds
        self.poke()

    def revive(self, *, final: bool = False) -> None:
        """Give a sink retired or paused for transient failures another chance
        (``finish()`` does this: the platform may be back). ``final``: the run
        is closing; keep retrying until stopped instead of striking out."""
        with self._progress:
            self._final = self._final or final
            if self.state.retired_reason is not None and self.state.off_reason is None:
                self.state.retired_reason = None
                self.state.active = True
            self.state.paused_until = 0.0
            self.state.strikes = 0
            self._moved_at = self._reached_at = time.monotonic()
            self.state.failed_in_a_row = 0
            self.state.unreached_in_a_row = 0
        self._record_standing()
        self.poke()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the current attempt; wait up to ``timeout`` for the thread."""
        self.signal_stop()
        self.join(timeout)

    def signal_stop(self) -> None:
        self._stop.set()
        self.poke()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to exit after ``signal_stop`` (whose wake-up
        every wait of the thread sees, whenever it starts waiting)."""
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def shipped_through(self) -> int:
        """Every entry up to this seq is dealt with for this sink."""
        # The offset alone: drain() asks on every wake-up, and the cursor
        # with its in-flight body copied a whole Parquet object each time.
        return max(self._scanned, self.journal.acked(self.name))

    def pending_records(self) -> int:
        """How many journaled records this sink has not dealt with yet (reads
        the journal: for reports, not for hot loops)."""
        return ledger.unshipped(
            self.journal, self.name, self.sink.kinds, after=self.shipped_through()
        )

    def settled(self, target: int) -> bool:
        """Nothing more will happen for entries <= target without outside help:
        shipped, or the sink is off, retired or paused."""
        if self.state.off_reason is not None or self.state.retired_reason is not None:
            return True
        if self.state.paused_until > time.monotonic():
            return True
        return self.shipped_through() >= target and self._damage_through >= self._damage_owed

    def stuck_for(self, now: float) -> float | None:
        """Seconds nothing has moved, when this sink is stuck (``policy.stuck``):
        no request of it succeeded for the stall allowance although it kept
        trying. A sink waiting out a backoff between tries is not stuck until
        it has had its tries: the stall measures whether anything *can*
        move, not how long a backoff happens to be."""
        idle = now - self._moved_at
        # A platform refusing every connection (gone mid-run) gets the short
        # allowance of a registration that never connected: the records stay
        # journaled for sync, and the vendor's SDK gave up within 45 s. It
        # counts from the last try that connected: one that answered 503s
        # and now refuses is restarting, and counted from the last move, its
        # first two refusals gave up on it. A closing run's alone: sync and
        # replay ship by strikes, and one restart of the platform ended them.
        unreached_idle = now - max(self._moved_at, self._reached_at)
        if self._final and self._policy.unreached(unreached_idle, self.state.unreached_in_a_row):
            return idle
        return idle if self._policy.stuck(idle, self.state.failed_in_a_row) else None

    def drain(self, target: int, deadline: float) -> bool:
        """Wait until entries <= target are dealt with: True when shipped, or
        when the sink is off (not enabled for the account, opted out: nothing
        of it is owed); False at the deadline or when retired or paused."""
        with self._progress:
            while not self.settled(target):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                # Every change settled() reads is made under _progress and
                # notified (_changed), so this needs no shorter wake-up.
                self._progress.wait(bounded(remaining))
        return self.shipped_through() >= target or self.state.off_reason is not None

    # -- the loop ------------------------------------------------------------
    def _notify(self) -> None:
        with self._progress:
            self._changed()

    def _changed(self) -> None:
        """Progress or a change of standing: wake the waiters (called with
        ``_progress`` held), here and in the producer's process."""
        self._progress.notify_all()
        if self._on_progress is not None:
            self._on_progress()

    def _record_standing(self) -> None:
        st = self.state
        left = st.paused_until - time.monotonic()
        paused = left if left > 0 else None
        # Closed or full: the producer sees the sink as still shipping.
        with contextlib.suppress(JournalError, ValueError):
            ledger.record_standing(
                self.journal,
                self.name,
                off=st.off_reason,
                retired=st.retired_reason,
                paused_for=paused,
            )

    def forget_standing(self) -> None:
        """A retirement or pause recorded for this sink is not the next
        shipper's: that one starts the sink afresh, and ``flush()`` would
        read the old one and give up before it records its own. Called as a
        shipper starts (after an uplink that died having retired it) and as
        one stops at a handover (``ship.startup``: the process's shippers
        start only once it took the claim, and a flush may look before)."""
        try:
            recorded = ledger.read_standing(self.journal, self.name)
            if recorded.retired is not None or recorded.paused_for is not None:
                ledger.record_standing(
                    self.journal, self.name, off=recorded.off, retired=None, paused_for=None
                )
        except (JournalError, ValueError):
            pass  # closed or full: the producer sees the sink as it was recorded

    def _sleep(self, seconds: float | None) -> None:
        # Cleared after waking, never before: a poke that lands just before
        # the wait still ends it.
        if not self._stop.is_set():
            self._wake.wait(None if seconds is None else bounded(seconds))
        self._wake.clear()

    def _run(self) -> None:
        trouble = 0  # consecutive journal write failures (a full disk, EIO)
        self.forget_standing()
        try:
            while not self._stop.is_set():
                try:
                    self._step()
                    trouble = 0
                except JournalError as exc:
                    # The journal could not record a batch or its outcome: the
                    # disk is full or failing. That is not the platform's fault
                    # and not a reason to give up: back off, with smaller
                    # batches, and try again. Nothing journaled is lost.
                    trouble += 1
                    self._shrink = min(self._shrink * 2, 256)
                    if trouble == 1:
                        log.warning(
                            "%s: the journal cannot be written (%s); retrying", self.name, exc
                        )
                    # Short waits: space frees up as soon as other sinks
                    # acknowledge (compaction) or the user clears the disk.
                    self._sleep(min(2.0, 0.05 * 2 ** min(trouble, 6)))
                except Exception as exc:  # a bug must not kill the producer: retire the sink
                    log.exception("shipper %s stopped by an unexpected error", self.name)
                    # Its thread stays: retired, it sleeps until the close-out
                    # revives it (the backlog is in the journal) or it is stopped.
                    self._retire(f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self._persist_scanned()
            self._close_sink()
            if self._overlap is not None:
                self._overlap.close()
            self._notify()

    def _close_sink(self) -> None:
        """Let go of what the sink holds (the metrics sink's step table, whose
        lock keeps ``primeruns gc`` off it): this thread was its only user.
        Shipping from threads, the producer lives on after the run, and would
        hold it for the rest of its life."""
        close = getattr(self.sink, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # a bug here must not hide the shipper's own end
                log.exception("%s: could not close the sink", self.name)

    def _persist_scanned(self) -> None:
        """Record how far the sink got past entries it has nothing to do with
        (kept in memory while running, to spare a write per wake-up), so that
        ``primeruns ls`` sees a finished sink as such."""
        try:
            cursor = self.journal.cursor(self.name)
            if cursor.inflight is None and self._scanned > cursor.acked:
                self.journal.ack(self.name, self._scanned)
        except (JournalError, ValueError):
            pass  # closed or read-only: the next process rescans, harmlessly

    def _step(self) -> bool:
        """One turn of the loop; False when it only waited."""
        st = self.state
        if not st.active:
            self._sleep(None)  # until revived or stopped
            return False
        if st.paused_until > time.monotonic():
            self._sleep(st.paused_until - time.monotonic())
            return False
        binding = self._binding()
        if binding is None:  # the run is not registered on the platform yet
            self._sleep(None)  # registering pokes every shipper
            return False
        cursor = self.journal.cursor(self.name)
        inflight = cursor.inflight
        if inflight is None:
            inflight = self._next_batch(binding, max(cursor.acked, self._scanned))
            if inflight is None:
                return False
        self._ship(inflight, binding)
        return True

    def _limits(self) -> tuple[int, int]:
        """(max_entries, max_bytes) of the next batch's read."""
        sink = self.sink
        cap = min(sink.max_entries // self._shrink, self._isolate or 1 << 62, self._fit or 1 << 62)
        return max(1, cap), max(1, sink.max_bytes // self._shrink)

    def _next_batch(self, binding: Binding, after: int) -> InFlight | None:
        sink = self.sink
        limits = self._limits()
        early, self._early = self._early, None
        if early is not None and not self._apart and early.fits(after, limits, binding):
            return self._record(
                early.prepared, early.first_seq, early.last_read, early.next_after, early.frame
            )
        want = min(limits[0], self._want or limits[0])
        result = self._ahead.read(after, max_entries=want, max_bytes=limits[1])
        if result.damaged:
            try:
                self._count_damage(result.damaged)
            except JournalError:
                # Not written (a full disk): the loop backs off, and the read
                # after it must meet the damage again to count it, not take
                # the entries kept past it (``_count_damage``).
                self._ahead.forget()
                raise
        if not result.entries:
            if result.next_after > self._scanned:
                self._scanned = result.next_after
                self._notify()
                return None
            resident.idle()  # caught up: give back what the batches left behind
            # The stop flag is looked at under the log's condition, which
            # signal_stop notifies (poke): no stop is missed, so no timeout.
            self.journal.wait_for_append(result.next_after, None, until=self._stop.is_set)
            return None
        linger = self._linger_left(result.entries)
        if linger > 0:
            self._ahead.consumed(after)  # what is kept is bounded while it waits
            self._sleep(linger)  # more may queue up meanwhile; read on after
            return None
        entries = self._without_apart(result.entries)
        if entries is None:
            return None
        try:
            prepared: Prepared[Any] | None = sink.prepare(entries, binding)
        except Exception as exc:
            if classify(exc) is Failure.OFF:
                self._turn_off(exc)
                return None
            first = entries[0].seq
            if self._needs_no_request(entries, binding):
                # The bad record is further on, after entries that make no
                # request (episodes without traces, for the sample table): a
                # sink ends its batch before a bad record only after one it
                # sends. Passed alone, as a batch of them is; the bad one
                # then comes first and fails alone.
                self.journal.ack(self.name, first)
                self._scanned = max(self._scanned, first)
                self._notify()
                return None
            # The first entry cannot be sent at all (a sink builds up to, not
            # past, a bad record): count it, move past it alone.
            self._fail_records(first, 1, exc)
            return None
        if (
            want < limits[0]
            and (prepared is None or prepared.last_seq is None)
            and result.next_after < self.journal.last_seq()
        ):
            # It took every entry of a read that stopped short of the log's
            # end: with more, it might have gone on past them. Read again, in
            # full. Not only when ``want`` entries came back: a read through
            # the reads shared with Prime Traces counts its bare traces too
            # (``SharedReads``), so a step's 8 episodes of 16 entries read
            # were all taken, and the step went in two objects.
            self._want = None
            return None
        if prepared is None:
            last = result.next_after
            apart = self._apart_through(last)
            if apart:  # (a sink that sends nothing of them made no request either)
                self._fail_records(last, len(apart), self._apart[apart[0]])
                return None
            self.journal.ack(self.name, last)
            self._scanned = max(self._scanned, last)
            self._notify()
            return None
        inflight = self._record(
            prepared,
            result.entries[0].seq,
            result.entries[-1].seq,
            result.next_after,
            apart=self._apart_through(
                result.next_after if prepared.last_seq is None else prepared.last_seq
            ),
        )
        if self._left_behind and self._reads_ahead:
            used = sum(1 for e in result.entries if e.seq <= inflight.last_seq)
            self._want = next_want(used, want)
        else:
            self._want = None
        return inflight

    def _without_apart(self, entries: Sequence[Entry]) -> Sequence[Entry] | None:
        """``entries`` (read for the next batch) without the records set apart
        (``_set_apart``); None when the first of them are set apart: counted
        as failed now, alone, and the batch is made after them."""
        found, self._apart_lines = self._apart_lines, None
        if found is not None:
            if entries[0].seq != found.first_seq:
                # Not the batch the lines are of (nothing else moves this
                # sink's offset, so never seen): one record at a time, which
                # ends, rather than a guess at which records they are.
                self._isolate = 1
                return None
            kept = [e for e in entries if e.seq not in self._apart]
            for line in found.lines:
                if line <= len(kept):
                    self._apart[kept[line - 1].seq] = found.why
        if not self._apart:
            return entries
        lead = 0
        while lead < len(entries) and entries[lead].seq in self._apart:
            lead += 1
        if lead:
            self._fail_records(entries[lead - 1].seq, lead, self._apart[entries[0].seq])
            return None
        return [e for e in entries if e.seq not in self._apart]

    def _apart_through(self, last_seq: int) -> list[int]:
        """The seqs set apart that a batch ending at ``last_seq`` passes over."""
        return sorted(seq for seq in self._apart if seq <= last_seq)

    def _needs_no_request(self, entries: Sequence[Entry], binding: Binding) -> bool:
        """Whether the first of ``entries``, whose batch the sink could not
        prepare, is fine alone and makes no request (its prepare: None)."""
        if len(entries) < 2:
            return False
        try:
            return self.sink.prepare(entries[:1], binding) is None
        except Exception:
            return False

    def _count_damage(self, damaged: Sequence[Damage]) -> None:
        """Count the entries damage reports stand for (a missing range: every
        one of them, whichever kinds they were: counted, never left out),
        each once. Reads go forward, but the same entries are read again: a
        read for the next batch made early and dropped (``_prepare_early``),
        a batch refused whole and made smaller, entries kept ahead let go
        (``ReadAhead``). Past ``_damage_through``, every report is new.

        Damage to the structure (``seq`` None: a key no entry has, a read
        that failed) is no record: every entry around it is read and
        counted on its own, so it is said once and counted nowhere, as sync
        and replay (which read a rebuilt journal) never counted it. Counted,
        a stray key past the log's end was one more lost record at every
        read that walked past it: a run's losses grew with every batch."""
        lost = 0
        reasons = []
        through = self._damage_through
        for damage in sorted(damaged, key=lambda d: -1 if d.seq is None else d.seq):
            if damage.seq is None:
                self._say_structure(damage.what)
                continue
            last = damage.seq + damage.entries - 1
            new = last - max(damage.seq - 1, through)
            if new > 0:
                lost += new
                reasons.append(damage.what)
                through = last
        if lost:
            reason = "; ".join(reasons[:3])
            self.journal.record_loss(self.name, lost, f"damaged: {reason}", damaged_through=through)
        # Only once written: where the disk is full the loop backs off and
        # reads again, and that read must count these entries, or the batch
        # past them is acknowledged with them counted nowhere.
        self._damage_through = through
        if lost and self._damage_owed >= 0:
            self._notify()  # a drain may wait for it (``settled``)

    def _say_structure(self, what: str) -> None:
        """Say damage to the journal's structure once per shipper (a few
        kinds of it at most: a failing read names its place each time)."""
        if what in self._structure_said or len(self._structure_said) >= _STRUCTURE_SAID:
            return
        self._structure_said.add(what)
        log.warning(
            "prime-runs: %s: the journal %s is damaged (%s); no record is lost to it, "
            "the entries around it ship",
            self.name,
            self.journal.path,
            what,
        )

    def _record(
        self,
        prepared: Prepared[Any],
        first_seq: int,
        last_read: int,
        next_after: int,
        frame: bytes | None = None,
        *,
        apart: Sequence[int] = (),
    ) -> InFlight:
        """Record a prepared batch as the sink's in flight, before its first
        attempt: made of entries ``first_seq`` to ``last_read`` of a read
        that scanned to ``next_after`` (``frame``: its body as the journal
        stores it, if made already), passing over the records set apart at
        ``apart``: counted as failed in the write that acknowledges it."""
        sink = self.sink
        last_seq = next_after if prepared.last_seq is None else prepared.last_seq
        self._left_behind = last_seq < last_read
        self._ahead.consumed(last_seq)  # the batch's entries are in its body now
        before = self._carry_before(prepared.carry)
        if apart:
            prepared = dataclasses.replace(prepared, records=prepared.records + len(apart))
        state = batchstate.to_journal(
            prepared, last_seq, carry_before=before if isinstance(before, dict) else {}
        )
        if apart:
            state.update(batchstate.apart_to_journal(len(apart), self._apart[apart[0]]))
        inflight = InFlight(first_seq=first_seq, last_seq=last_seq, body=prepared.body, state=state)
        if prepared.carry is not None:
            # Saved before the batch: a failure between the two leaves a gap
            # in the sink's numbering after a restart, never a reuse of it.
            # The parts the sink tidied go in the same write, not in the
            # batch's state: its carry and carry_before hold what it changed.
            self._save_carry(prepared.carry, prepared.tidied)
        self.journal.set_inflight(self.name, inflight, frame=frame)
        if prepared.carry is not None:
            # Recorded: only now does the sink go on from this batch's carry
            # (a batch prepared again after a failed recording repeats it).
            restore = getattr(sink, "restore", None)
            if restore is not None:
                restore(prepared.carry)
        return inflight

    # -- the carry ----------------------------------------------------------------
    # A sink's carry is saved whole under ``carry.<sink>``; a sink that
    # carries parts (``carries_parts``: the rollout numbering, kept in
    # chunks) gives only the parts a batch changed, each saved under
    # ``carry.<sink>.<part>``, so recording a batch costs what the batch
    # changed, not what the run numbered so far.
    def _saved_parts(self) -> dict[str, Any]:
        """A part-carrying sink's saved carry: the whole carry an earlier
        version saved (if any) and every part saved since."""
        carry: dict[str, Any] = {}
        whole = self._saved_carry(f"carry.{self.name}")
        if isinstance(whole, dict):
            carry.update(whole)
        prefix = f"carry.{self.name}."
        for key, value in self.journal.all_meta().items():
            if key.startswith(prefix):
                carry[key[len(prefix) :]] = value
        return carry

    def _keep_recorded(self, recorded: Mapping[str, Any]) -> None:
        """Save again the parts the batch in flight recorded, which this
        process goes on from. They are saved already, unless the process
        before was killed giving the batch back (refused whole: its parts
        saved as before it, the batch not yet dropped); the batch is then
        sent again, and if it is stored, a part it changed and no later
        batch does would keep its lower counts for the next process, which
        would number those rollouts again."""
        if not recorded:
            return
        try:
            self._save_carry(recorded)
        except JournalError as exc:  # a full disk: as before, the memory alone has them
            log.warning("%s: the carried numbering was not saved again (%s)", self.name, exc)

    def _carry_before(self, carry: Mapping[str, Any] | None) -> Any:
        """What the sink carried before a batch carrying ``carry``: for a
        part-carrying sink, the saved value of each part it changes (None:
        none yet)."""
        if carry is None:
            return None
        if self._carry_parts:
            # One read for all of them: a batch changes a part per example
            # it numbers, and a transaction each was most of its recording.
            keys = {part: f"carry.{self.name}.{part}" for part in carry}
            try:
                saved, damaged = self.journal.get_metas(keys.values())
            except JournalCorruptError as exc:
                log.warning("%s: the carried numbering is unreadable (%s)", self.name, exc)
                return dict.fromkeys(keys)
            if damaged:
                log.warning(
                    "%s: the carried numbering is unreadable (%d parts, %s first)",
                    self.name,
                    len(damaged),
                    damaged[0],
                )
            return {part: saved.get(key) for part, key in keys.items()}
        return self.journal.get_meta(f"carry.{self.name}")

    def _saved_carry(self, key: str) -> Any:
        """A saved part of the carry; None where it is damaged (what a sink
        cannot read of its carry costs its own numbers, not the shipping)."""
        try:
            return self.journal.get_meta(key)
        except JournalCorruptError as exc:
            log.warning("%s: the carried numbering is unreadable (%s)", self.name, exc)
            return None

    def _save_carry(
        self, carry: Mapping[str, Any], tidied: Mapping[str, Any] | None = None
    ) -> None:
        """Save ``carry`` (and, of a part-carrying sink, the parts it
        ``tidied``: ``Prepared.tidied``) in one transaction."""
        if self._carry_parts:
            # A part of None holds nothing (emptied, or none yet): removed,
            # so start-up does not read a key per part a run ever had.
            parts = {**tidied, **carry} if tidied else carry
            prefix = f"carry.{self.name}."
            self.journal.update_meta(
                {f"{prefix}{p}": v for p, v in parts.items() if v is not None},
                drop=[f"{prefix}{p}" for p, v in parts.items() if v is None],
            )
        else:
            self.journal.set_meta(f"carry.{self.name}", dict(carry))

    def _linger_left(self, entries: Sequence[Any]) -> float:
        """How long a batch of ``entries`` should wait for more (0: send now)."""
        if self._goes_at_once(entries):
            return 0.0
        return max(0.0, self._last_send + self._policy.linger_s - time.monotonic())

    def _goes_at_once(self, entries: Sequence[Any]) -> bool:
        """Whether a batch of ``entries`` goes without waiting for more,
        however recent the last request: someone waits for it, the batch
        before left entries behind, or it is full."""
        if self._final or self._stop.is_set() or time.monotonic() < self._hurry_until:
            return True
        if self._left_behind or len(entries) >= self.sink.max_entries // max(1, self._shrink):
            return True
        return sum(len(e.payload) for e in entries) >= self.sink.max_bytes // 2

    def _prepare_early(self, binding: Binding, after: int) -> EarlyBatch | None:
        """The batch after entry ``after``, prepared while the one ending
        there is in flight (``ship.early``): held, not recorded. None when
        there is none to make yet, or it would wait for more."""
        limits = self._limits()
        try:
            result = self._ahead.read(after, max_entries=limits[0], max_bytes=limits[1])
            if result.damaged:
                # Reported once, by a read: the batch's own read must meet it.
                self._ahead.forget()
                return None
            if not result.entries or not self._goes_at_once(result.entries):
                return None  # what was read is kept for the batch's turn
            prepared = self.sink.prepare(result.entries, binding)
            frame = None if prepared is None else self.journal.inflight_frame(prepared.body)
        except Exception:
            # Whatever it was, the batch's turn meets it again and deals with it.
            log.debug("%s: the next batch was not prepared early", self.name, exc_info=True)
            self._ahead.forget()
            return None
        if prepared is None or frame is None:
            return None
        return EarlyBatch(
            after,
            limits,
            binding,
            result.entries[0].seq,
            result.entries[-1].seq,
            result.next_after,
            prepared,
            frame,
        )

    def _attempt(self, inflight: InFlight, ctx: SendContext[Any], binding: Binding) -> None:
        """One attempt at the batch in flight; the first, for a sink that
        allows it, with the next batch prepared meanwhile."""
        if self._overlap is None or self._early is not None or self._apart:
            self.sink.send(inflight.body, ctx)
            return
        error, self._early = self._overlap.send(
            lambda: self.sink.send(inflight.body, ctx),
            lambda: self._prepare_early(binding, inflight.last_seq),
        )
        if error is not None:
            raise error

    def _ship(self, inflight: InFlight, binding: Binding) -> None:
        try:
            if inflight.damage is not None:
                raise batchstate.BadState(inflight.damage)
            batch = batchstate.from_journal(inflight, self.sink.progress_type)
            apart = batchstate.apart_of(inflight.state, batch.records)
        except batchstate.BadState as exc:
            # Not guessed at: sent with made-up progress (nothing attempted,
            # no object done), a batch could be stored twice. Its records
            # count as failed (``_lost_with``).
            self._fail_records(inflight.last_seq, self._lost_with(inflight), exc)
            return
        progressed = False

        def record(old: Any, new: Any) -> None:
            nonlocal progressed
            # Only a change is written, and counts as moving on: what a sink
            # saves again on every attempt (the eval samples' "attempted") is
            # recorded already, and cannot reset the count forever.
            change = batchstate.changes(old, new)
            if change:
                self.journal.update_inflight_state(self.name, change)
                # A multi-request batch that got further is not failing: its
                # attempts start over (a batch of several requests on a flaky
                # link must not strike out while every attempt moves it on).
                progressed = True
                self._moved()

        ctx = SendContext(binding=binding, progress=batch.progress, record=record)
        if apart is not None:
            # The shipper's own entry (a sink's are its parts' numbers, from 0).
            ctx.failed_at_ack[-1] = apart
        last_error: BaseException | None = None
        attempt = 0
        while attempt < self._policy.attempts_per_strike:
            if self._stop.is_set():
                return
            progressed = False
            self._last_send = time.monotonic()
            try:
                self._attempt(inflight, ctx, binding)
            except JournalError:
                raise  # recording progress failed: the loop backs off (see _run)
            except Exception as exc:
                kind = classify(exc)
                if kind is Failure.TRANSIENT:
                    last_error = exc
                    with self._progress:
                        self.state.failed_in_a_row += 1
                        if never_reached(exc):
                            self.state.unreached_in_a_row += 1
                        else:
                            self.state.unreached_in_a_row = 0
                            self._reached_at = time.monotonic()
                        self.state.last_error = _describe(exc)
                    retry_after = exc.retry_after if isinstance(exc, RetryableAPIError) else None
                    attempt = 0 if progressed else attempt + 1
                    if attempt < self._policy.attempts_per_strike or self._final:
                        self._sleep(
                            self._policy.delay(attempt, retry_after, self._rng, closing=self._final)
                        )
                    if self._final:  # finishing: keep trying until the deadline stops us
                        attempt = min(attempt, self._policy.attempts_per_strike - 1)
                    continue
                if kind is Failure.OFF:
                    self._turn_off(exc)
                elif kind is Failure.REJECTED:
                    self._rejected(inflight, batch, exc)
                else:
                    self._on_failure(self.name, exc)
                    self._retire(_describe(exc))
                return
            else:
                self._acked(inflight, batch, ctx.failed_at_ack)
                return
        assert last_error is not None
        self._strike(last_error)

    # -- outcomes --------------------------------------------------------------
    def _moved(self) -> None:
        """The sink moved on (a request succeeded, or a batch's state changed):
        the platform can be reached."""
        with self._progress:
            self._moved_at = self._reached_at = time.monotonic()
            self.state.failed_in_a_row = 0
            self.state.unreached_in_a_row = 0
            self.state.last_error = None

    def _acked(
        self,
        inflight: InFlight,
        batch: Prepared[Any],
        refused: Mapping[int, tuple[int, BaseException]] | None = None,
    ) -> None:
        # Records of it refused for their content: counted with the ack, once.
        # A sink's counts may come from a journal that is damaged: never more
        # than the batch holds, none below nothing.
        failed = sum(max(0, count) for count, _ in (refused or {}).values())
        failed = min(failed, batch.records)
        why = next(iter(refused.values()))[1] if refused else None
        self.journal.ack(
            self.name,
            inflight.last_seq,
            failed=failed,
            reason=None if why is None else _describe(why),
        )
        self._forget_apart(inflight.last_seq)
        if why is not None:
            self._on_loss(self.name, why)
        self._moved()
        # Grow back gradually after journal write failures: on a full disk the
        # batch that fits is small, and a full-size one would fail again.
        self._shrink = max(1, self._shrink // 2)
        self._isolate = None
        if self._fit is not None:
            self._fit = None if self._fit * 2 >= self.sink.max_entries else self._fit * 2
        if batch.counters:
            self.journal.update_meta(
                {k: int(self.journal.get_meta(k, 0) or 0) + v for k, v in batch.counters.items()}
            )
        with self._progress:
            self._scanned = max(self._scanned, inflight.last_seq)
            st = self.state
            st.strikes = 0
            st.batches_sent += 1
            st.records_sent += batch.records - failed
            st.bytes_sent += len(inflight.body)
            self._changed()
        resident.after_batch()

    def _rejected(self, inflight: InFlight, batch: Prepared[Any], exc: BaseException) -> None:
        """A batch refused for its content. Where the sink allows it, only the
        bad records fail: those the sink sets apart (records repeating an
        id: ``_set_apart``), else the batch is cut before the line the server
        names (or halved when it names none) and sent anew; the one record
        left that is still refused fails alone. Its batch mates are not lost."""
        records = batch.records
        if _too_large(exc) and records > 1:
            # Over the platform's (or a proxy's) size limit, whatever the sink:
            # half as many records go next, down to one.
            self._fit = max(1, records // 2)
            self._send_anew(inflight)
            log.info("%s: a batch of %d was too large (%s); halving it", self.name, records, exc)
            return
        if not self.sink.isolates_rejections or records <= 1:
            self._fail_records(inflight.last_seq, records, exc)
            self._isolate = None
            return
        if self._set_apart(inflight, batch, exc):
            return
        line = _rejected_line(exc, records)
        if line == 1:  # the first record is the bad one: it fails alone
            self._fail_records(inflight.first_seq, 1, exc)
            self._isolate = None
            return
        self._send_anew(inflight)
        self._isolate = line - 1 if line else records // 2
        log.info(
            "%s: a batch of %d was refused (%s); isolating the bad record", self.name, records, exc
        )

    def _set_apart(self, inflight: InFlight, batch: Prepared[Any], exc: BaseException) -> bool:
        """Set apart the records the sink names of a refused batch (a sink's
        ``set_apart(body, progress, exc)``: the 1-based lines, each one
        entry, to send no more), and send the rest anew, in one batch: the
        lines are known by seq once it is made (``_without_apart``), and
        counted as failed, with ``exc``, as it is acknowledged. Whether it
        named any: none found, the batch is cut or halved instead."""
        find = getattr(self.sink, "set_apart", None)
        if find is None:
            return False
        recorded = batchstate.apart_of(inflight.state, batch.records)
        if len(self._apart_through(inflight.last_seq)) != (0 if recorded is None else recorded[0]):
            # A batch an earlier process recorded without records it set
            # apart, which this one does not know: its lines are not the
            # entries' in order. Halved (made again, with them: found again).
            return False
        try:
            named = find(inflight.body, batch.progress, exc)
        except Exception:  # a bug there must not stop the shipping: halved instead
            log.exception("%s: the refused records could not be found", self.name)
            return False
        # Each line once, of the body: whatever the sink says, never more.
        lines = sorted({n for n in named if isinstance(n, int) and 1 <= n <= batch.records})
        if not lines:
            return False
        self._send_anew(inflight)
        self._isolate = None
        why = batchstate.bounded_why(exc)
        self._apart_lines = _ApartLines(inflight.first_seq, tuple(lines), why)
        log.info(
            "%s: a batch of %d was refused (%s); sending it without the %d records it names",
            self.name,
            batch.records,
            why,
            len(lines),
        )
        return True

    def _forget_apart(self, last_seq: int) -> None:
        """The records set apart up to ``last_seq`` are counted (or the
        batch's range was counted whole): nothing to keep of them."""
        for seq in self._apart_through(last_seq):
            del self._apart[seq]

    def _send_anew(self, inflight: InFlight) -> None:
        """Drop a batch refused whole: nothing of it was stored, so a smaller
        batch of the same records is a new batch, not a resend. A sink that
        numbers its rows (rollouts, sample id ranges) goes back to where it
        was before the batch, so the records are numbered as they would have
        been."""
        before = batchstate.carry_before(inflight.state)
        if before is not None:
            self._save_carry(before)
            restore = getattr(self.sink, "restore", None)
            if restore is not None:
                # A part-carrying sink reads every part saved again: the
                # parts a batch changed need not hold all it numbered before
                # (an example the rollout numbering moved out of a chunk the
                # batch left as it was). Rare: a batch refused whole.
                # The parts it gives back as None (none before it) are named
                # too: removed from the journal, they must be from the sink.
                restore({**self._saved_parts(), **before} if self._carry_parts else before)
        self.journal.ack(self.name, self.journal.acked(self.name))

    def _lost_with(self, inflight: InFlight) -> int:
        """What a batch whose state is damaged loses: the entries of the
        sink's kinds in its range (read from their headers; an unreadable
        one among them), each one of its records. A journal is untrusted
        input, and the state's count of records, which may say fewer, is
        taken only from a sink that passes over entries (``Sink``): an entry
        of the range no record stands for (a step off the sample table's
        cadence) was dealt with. Never more than the entries, either way."""
        counts = self.journal.tally_range(inflight.first_seq - 1, inflight.last_seq)
        entries = ledger.records_left(counts, self.sink.kinds)
        if not getattr(self.sink, "passes_over_entries", False):
            return entries
        records = batchstate.records_of(inflight.state)
        return entries if records is None else min(records, entries)

    def _fail_records(self, last_seq: int, records: int, exc: BaseException) -> None:
        reason = _describe(exc)
        self.journal.ack(self.name, last_seq, failed=records, reason=reason)
        self._forget_apart(last_seq)
        self._on_loss(self.name, exc)
        with self._progress:
            self._scanned = max(self._scanned, last_seq)
            self._changed()

    def _strike(self, exc: BaseException) -> None:
        st = self.state
        self._on_failure(self.name, exc)
        with self._progress:
            if self._final:
                # The run is closing (revive came while this batch struck
                # out): retry until the close-out's deadline or stall instead.
                return
            st.strikes += 1
            if st.strikes < self._policy.strikes_to_retire:
                return
            if not self._training:
                reason = f"{st.strikes} failed batches in a row: {_describe(exc)}"
                self.state.active = False
                self.state.retired_reason = reason
            else:
                log.warning(
                    "%s: %d failed batches in a row; pausing %.0f s (backlog kept in the journal)",
                    self.name,
                    st.strikes,
                    self._policy.pause_s,
                )
                st.paused_until = time.monotonic() + self._policy.pause_s
                st.strikes = 0
            self._changed()
        self._record_standing()

    def _retire(self, reason: str) -> None:
        self._leave_reads()
        with self._progress:
            self.state.active = False
            self.state.retired_reason = reason
        self._record_standing()
        self._notify()

    def _leave_reads(self) -> None:
        """Reading no more (until revived): what is shared keeps nothing for it."""
        self._early = None  # made with the shared forms; made again if revived
        if self._reads is not None:
            self._reads.leave(self.name)
        if self._records is not None:
            self._records.leave()

    def _turn_off(self, exc: BaseException) -> None:
        reason = str(exc)
        log.info("%s: off (%s); not a loss", self.name, reason)
        self._leave_reads()
        if getattr(exc, "lasting", True):
            self.journal.set_meta(f"sink_off.{self.name}", reason)
            self.journal.drop_sink(self.name)
        with self._progress:
            self.state.active = False
            self.state.off_reason = reason
        self._record_standing()
        self._notify()


@dataclass(frozen=True)
class _ApartLines:
    """The records a sink set apart of a refused batch, by line (1-based, of
    its body), until the batch is made again: ``first_seq`` is its first
    entry's, ``why`` the refusal."""

    first_seq: int
    lines: tuple[int, ...]
    why: BaseException


# The service's message starts with the line it refused ("line 7: ..."); a
# "line N" elsewhere (inside a quoted id, say) names nothing.
_LINE = re.compile(r"(?:^|: )line (\d+)\b")


def carries_parts(sink: Sink) -> bool:
    """Whether ``sink``'s carry is the parts a batch changed (saved part by
    part), not its whole numbering (``Sink``)."""
    return bool(getattr(sink, "carries_parts", False))


def _rejected_line(exc: BaseException, records: int) -> int | None:
    """The 1-based line a rejection names ("line 7: episode id over ..."), if any."""
    match = _LINE.search(str(exc))
    if match is None:
        return None
    line = int(match.group(1))
    return line if 1 <= line <= records else None


def _too_large(exc: BaseException) -> bool:
    """A 413: the request was over a size limit, not wrong in its content."""
    return isinstance(exc, APIError) and exc.status_code == 413


def _describe(exc: BaseException) -> str:
    if isinstance(exc, APIError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def drain_all(shippers: Sequence[Shipper], target: int, deadline: float) -> bool:
    """Drain every shipper to ``target`` by ``deadline``; whether all were.

    Each one is waited for, whatever the ones before it answered: ``all()``
    over a generator stopped at the first sink that was off, and the run
    was closed while the sinks after it still had most of their backlog.
    """
    results = [shipper.drain(target, deadline) for shipper in shippers]
    return all(results)
