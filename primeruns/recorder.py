"""The recorder: what a ``log_*`` call does in the producer's thread.

It checks the producer's input (naming the field and the fix), encodes each
record once, appends the encoded records to the run's journal and keeps the
counts a user reads back (records dropped, records that could not be
encoded, the newest entry of each kind that ``flush()`` waits for). It never
touches the network: after an append it calls its ``wake`` callback, which
for an online run wakes the uplink without blocking.

Thread-safe: many threads may log at once; counts are exact. In a forked
child the journal belongs to the parent's process: a record goes to the
child's own journal (``forked_target``, :mod:`primeruns.forkchild`), or is
dropped and counted where the child has none.
"""

from __future__ import annotations

import contextlib
import operator
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from primeruns.logs import get_logger

from . import hooks, records, screening
from .exceptions import (
    FINISHED_WHILE_LOGGING,
    JournalError,
    JournalMovedError,
    RunFinishedError,
)
from .journal import EntryKind, Journal
from .journal.frames import MAX_ENTRY_BYTES
from .journal.fullness import full_cause, full_remedy
from .journal.overflow import Watch
from .journal.types import loss_counts
from .models import OnError, RunKind
from .ship import ledger

if TYPE_CHECKING:
    from .rehoming import Rehomer

__all__ = ["Recorder"]

log = get_logger("primeruns")

_MAX_ERRORS = 1000
# The kind log_metrics journals, read off its class once: on Python 3.11 an
# enum member read off its class is an unspecialized lookup (~0.2 us here),
# on every call.
_METRICS = EntryKind.METRICS
# A field's name in warnings without list indices: episodes[3].blob and
# episodes[0].blob are one field, said once.
_INDEX = re.compile(r"\[\d+\]")


class Recorder:
    """Validates, encodes and journals a run's records; keeps its counts.

    ``journal`` is None for a disabled run: input is still checked (a bad
    call is reported the same way), nothing is written.
    """

    def __init__(self, journal: Journal | None, *, kind: RunKind, on_error: OnError) -> None:
        self.journal = journal
        self.kind: RunKind = kind
        self.on_error: OnError = on_error
        self.summary: dict[str, Any] = {}
        self.errors: list[str] = []
        # Wakes an online run's uplink after an append (None: nothing to wake).
        self.wake: Callable[[], None] | None = None
        # In a forked child: the recorder of the child's own journal, opened
        # on its first record (None: the child has none; records are dropped).
        self.forked_target: Callable[[], Recorder | None] | None = None
        # Set by init() for a journal it owns: notices the journal's directory
        # deleted or moved and carries the run over (``primeruns.rehoming``).
        self.rehomer: Rehomer | None = None
        self.lock = threading.Lock()
        self._pid = os.getpid()
        self._closing = False  # finish() began: calls are refused from now on
        self._deferred: BaseException | None = None
        self._dropped = 0
        self._encode_failed = 0
        self._forked_dropped = 0
        # Records held for a full disk and let go (the journal's count, read at the finish).
        self._held_lost = 0
        # The newest seq appended of each entry kind: what flush() waits for.
        self._last_by_kind: dict[int, int] = {}
        self._warned: set[str] = set()
        self._fields_said: set[str] = set()  # fields dropped and said once
        self._raised = 0  # uplink failures already raised (on_error="raise")
        self._final_losses: dict[str, dict[str, Any]] | None = None
        self._final_errors: list[dict[str, Any]] | None = None

    # -- what the user reads back ------------------------------------------------
    @property
    def dropped(self) -> int:
        return self._dropped + self._forked_dropped + self._held_lost

    @property
    def encode_failed(self) -> int:
        return self._encode_failed

    def targets(self) -> dict[int, int]:
        """The newest seq journaled of each entry kind (by kind number)."""
        with self.lock:
            return dict(self._last_by_kind)

    def losses(self) -> dict[str, dict[str, Any]]:
        """Per sink, what it counted as lost (from the journal; frozen at close)."""
        if self._final_losses is not None:
            return self._final_losses
        if self.journal is None or not self.owner_process():
            return {}
        try:
            return self.journal.losses()
        except JournalError:
            return {}

    def uplink_errors(self) -> list[dict[str, Any]]:
        """The uplink's failures, as it recorded them in the journal (frozen at close)."""
        if self._final_errors is not None:
            return self._final_errors
        if self.journal is None or not self.owner_process():
            return []
        try:
            return ledger.read_errors(self.journal)
        except JournalError:
            return []

    def all_errors(self) -> list[str]:
        """``run.errors``: what this process noted, then the uplink's failures."""
        return list(self.errors) + [ledger.error_text(e) for e in self.uplink_errors()]

    def failed_records(self) -> dict[str, int]:
        """``run.failed_records``: per sink, from the journal's loss counts."""
        out: dict[str, int] = {}
        if self._encode_failed:
            out["encode"] = self._encode_failed
        for sink, count in loss_counts(self.losses()).items():
            if sink != "journal" and count:
                out[sink] = out.get(sink, 0) + count
        return out

    def owner_process(self) -> bool:
        return self._pid == os.getpid()

    # -- the calls ---------------------------------------------------------------
    def begin_closing(self) -> None:
        """``finish()`` began: every later call raises ``RunFinishedError``."""
        self._closing = True

    @property
    def closing(self) -> bool:
        return self._closing

    def log(self, kind: EntryKind, items: Iterable[Any], what: str) -> None:
        """Encode and journal ``items``; bad ones are counted and reported,
        the good ones of the same call journaled either way."""
        if self._closing:
            raise _finished(f"log_{what}")
        if type(items) is not list and isinstance(items, Mapping | str | bytes):
            self.refuse(
                TypeError(
                    f"log_{what}: pass a list of records, not a single {type(items).__name__}"
                )
            )
            return
        if self.journal is None:
            return
        payloads: list[bytes] = []
        first_error: BaseException | None = None
        try:
            for index, item in enumerate(items):
                try:
                    payloads.append(_encode(kind, item, f"{what}[{index}]"))
                except Exception as exc:  # any user object's method may raise
                    error = _as_encode_error(exc, f"{what}[{index}]")
                    with self.lock:  # counts must be exact under many threads
                        self._encode_failed += 1
                    if self.on_error != "raise":
                        self.say_field(error)
                    first_error = first_error or error
        except Exception as exc:  # not iterable, or the producer's generator raised
            error = TypeError(
                f"log_{what}: could not iterate the records ({type(exc).__name__}: {exc}); "
                "pass a list of records"
            )
            if self.on_error != "raise":
                self.note("record", error)
            first_error = first_error or error
        if payloads:
            self.append(kind, payloads)
        if first_error is not None and self.on_error == "raise":
            raise first_error

    def log_traces(self, traces: Iterable[Any]) -> None:
        """Bare traces; an episode among them is journaled as an episode, in order."""
        if self._closing:
            raise _finished("log_traces")
        if self.journal is None or isinstance(traces, Mapping | str | bytes):
            self.log(EntryKind.TRACE, traces, "traces")
            return
        try:
            items = list(traces)
        except Exception:  # not iterable: log() says so
            self.log(EntryKind.TRACE, traces, "traces")
            return
        bare: list[Any] = []
        for item in items:
            if _looks_like_episode(item):
                if bare:
                    self.log(EntryKind.TRACE, bare, "traces")
                    bare = []
                self.log(EntryKind.EPISODE, [item], "traces")
            else:
                bare.append(item)
        if bare:
            self.log(EntryKind.TRACE, bare, "traces")

    def log_metrics(self, values: Mapping[str, Any], step: int | None) -> None:
        if self._closing:
            raise _finished("log_metrics")
        if type(values) is not dict and not isinstance(values, Mapping):
            self.refuse(
                TypeError(f"log_metrics: values must be a mapping, got {type(values).__name__}")
            )
            return
        if step is not None:
            if type(step) is not int:  # (a plain int, the common step, needs no look)
                try:
                    if isinstance(step, bool):
                        raise TypeError
                    step = operator.index(step)  # numpy and torch integers too
                except Exception:
                    self.refuse(
                        TypeError(f"log_metrics: step must be an int, got {type(step).__name__}")
                    )
                    return
            if not records.FIRST_STEP <= step <= records.LAST_STEP:
                self.refuse(ValueError(records.step_out_of_range("log_metrics: step", step)))
                return
        if self.kind != "train" or self.journal is None:
            return
        row = screening.plain_row(values)  # the common row: nothing to drop
        rejected: tuple[records.RecordEncodeError, ...] = ()
        if row is None:
            row, rejected = screening.metrics_row(values)
        given = row.get("step")
        if given is not None:  # the values' own step is sent in place of step=
            # Only an int beyond the range: a step of another type is the
            # platform's to judge (as the vendor's SDK leaves it; it may
            # coerce 10.0), and one it refuses is counted lost with its reason.
            if type(given) is int and not records.FIRST_STEP <= given <= records.LAST_STEP:
                self.refuse(
                    ValueError(records.step_out_of_range("log_metrics: values['step']", given))
                )
                return
        elif step is not None and "step" not in row:
            row["step"] = step
        row.setdefault("_timestamp", time.time())
        try:
            payload = records.encode_metrics_row(row)
        except (TypeError, ValueError) as exc:  # what the screen let through, refused
            self.refuse(exc)
        else:
            self.append(_METRICS, [payload])
        if rejected:
            self.drop_fields(rejected)

    def update_summary(self, values: Mapping[str, Any]) -> None:
        if self._closing:
            raise _finished("update_summary")
        rejected = self.merge_summary(values, "update_summary")
        if rejected is None:
            return
        if self.journal is not None:
            self.append(EntryKind.SUMMARY, [records.encode_record(self.clean_summary())])
        self.drop_fields(rejected)

    def merge_summary(
        self, values: Any, what: str, *, defer: bool = False
    ) -> tuple[records.RecordEncodeError, ...] | None:
        """Screen ``values`` and merge what it keeps into the summary; return
        the fields left out (for ``drop_fields``), or None when ``values`` is
        not a mapping at all (counted and said here)."""
        if not isinstance(values, Mapping):
            self.refuse(
                TypeError(f"{what}: values must be a mapping, got {type(values).__name__}"),
                defer=defer,
            )
            return None
        screened = screening.summary(values, what=what)
        with self.lock:
            self.summary.update(screened.kept)
        return screened.rejected

    def clean_summary(self, *, defer: bool = False) -> dict[str, Any]:
        """A copy of the live summary that encodes. The user may have edited
        it in place (``run.summary[k] = ...``): a field that cannot be
        journaled is taken out of it, counted and said."""
        with self.lock:
            summary = dict(self.summary)
        screened = screening.summary(summary, what="summary")
        if screened.rejected:
            with self.lock:  # out of the live summary too, unless replaced meanwhile
                for key, value in summary.items():
                    if key not in screened.kept and self.summary.get(key) is value:
                        del self.summary[key]
            self.drop_fields(screened.rejected, defer=defer)
        return screened.kept

    def encodable(self, values: dict[str, Any], what: str) -> dict[str, Any]:
        """``values`` without the keys whose values cannot be encoded, each
        dropped one noted (raised under ``on_error="raise"``)."""
        try:
            records.encode_record(values, what=what)
            return values
        except (TypeError, ValueError):
            pass
        kept: dict[str, Any] = {}
        for key, value in values.items():
            try:
                records.encode_record({key: value}, what=what)
            except (TypeError, ValueError) as exc:
                self.bad_input(exc)
                continue
            kept[key] = value
        return kept

    def append(
        self,
        kind: EntryKind,
        payloads: Sequence[bytes],
        *,
        essential: bool = False,
        final: bool = False,
    ) -> None:
        """Journal encoded records; never raises into the loop but for a call
        that lost the race with another thread's ``finish()``."""
        journal = self.journal
        if journal is None:
            return
        if self._pid != hooks.PID:  # (``owner_process``, inline: every log call)
            target = self.forked_target() if self.forked_target is not None else None
            if target is not None:
                target.append(kind, payloads, essential=essential, final=final)
                return
            with self.lock:
                self._forked_dropped += len(payloads)
            self.warn_once(
                "fork",
                "a forked child logged to its parent's run and could not open a journal "
                "of its own; its records are dropped and counted in run.dropped_records. "
                "Log from the parent, or call pr.init() in the child for a run of its own.",
            )
            return
        try:
            rehomer = self.rehomer
            # Its time gate compared here: a look is due once every 50 ms,
            # and a call on every append only to learn that cost each one.
            if rehomer is not None and (final or time.monotonic() >= rehomer.next_look):
                journal = self.journal = rehomer.current(force=final)
            try:
                result = journal.append(kind, payloads, essential=essential, final=final)
            except JournalMovedError:  # moved by another thread meanwhile: append there
                journal = self.journal
                assert journal is not None
                result = journal.append(kind, payloads, essential=essential, final=final)
        except ValueError as exc:  # a payload over the per-entry limit (checked earlier)
            with self.lock:
                self._encode_failed += len(payloads)
            self.note("record", exc)
            return
        except JournalError as exc:
            if self._closing and not final:
                # Closed by another thread's finish while this call encoded
                # (the appender refuses a record after the finish likewise).
                raise RunFinishedError(FINISHED_WHILE_LOGGING) from None
            with self.lock:
                self._dropped += len(payloads)
            self.warn_once("journal", f"the journal refused records: {exc}")
            return
        if result.first_seq is not None and result.count:
            last = result.first_seq + result.count - 1
            k = int(kind)
            with self.lock:
                if last > self._last_by_kind.get(k, 0):
                    self._last_by_kind[k] = last
            if self.wake is not None:
                self.wake()
        if result.held:
            # The supervisor looks at its uplink on a wake-up (``Supervisor.wake``):
            # one that died while the disk holds records is all that frees room
            # for them, so a held append looks too, else nothing shipped again.
            if self.wake is not None:
                self.wake()
            self.warn_once(
                "held",
                f"the journal at {journal.path} is full: {full_cause(journal.path)}; records "
                "are held in memory until it has room again, as the uplink ships and frees "
                "it (past 64 MiB held, or at the run's finish, they are dropped and counted in "
                "run.dropped_records). " + full_remedy(journal.path, "Free inodes or disk space."),
            )
        if result.dropped:
            with self.lock:
                self._dropped += result.dropped
            self.warn_once(
                "budget",
                f"the journal at {journal.path} is full: {full_cause(journal.path)}; records "
                "are being dropped and counted in run.dropped_records. "
                + full_remedy(
                    journal.path,
                    "Free inodes or disk space, or raise the budget "
                    "(PRIME_RUNS_MAX_JOURNAL_BYTES).",
                ),
            )

    def held_stored(self, kind: int, last: int) -> None:
        """Records held for a full disk were journaled, up to seq ``last``
        (from the journal's thread): ``flush()`` waits for them, and the
        uplink is woken for them, as after an append."""
        with self.lock:
            if last > self._last_by_kind.get(int(kind), 0):
                self._last_by_kind[int(kind)] = last
        if self.wake is not None:
            self.wake()

    def watch_held(self) -> tuple[Journal, Watch] | None:
        """What is held for a full disk now (``flush()`` waits for it), with
        its journal; None where nothing is."""
        journal = self.journal
        if journal is None:
            return None
        try:
            watch = journal.watch_held()
        except JournalError:
            return None
        return None if watch is None else (journal, watch)

    def wait_watched(self, watched: tuple[Journal, Watch], within: float) -> dict[int, int] | None:
        """Wait up to ``within`` for the held records ``watched`` names to be
        journaled, never letting any go: the last seq of each kind they took
        (the flush's targets for them), or None if they are not all in."""
        journal, watch = watched
        try:
            done = journal.wait_watched(watch, within)
        except JournalError:
            return None
        return dict(watch.lasts) if done else None

    def settle_held(self, within: float, room_may_come: Callable[[], bool] | None = None) -> None:
        """At the finish: wait up to ``within`` for what is held for a full
        disk to be journaled (not once ``room_may_come`` says nothing may
        free room); what is not is dropped, counted, and said."""
        journal = self.journal
        if journal is None:
            return
        with contextlib.suppress(JournalError):
            lost = journal.settle_held(within, room_may_come)
            if lost:
                log.warning(
                    "prime-runs: %d record(s) held in memory for the full disk at %s could not "
                    "be journaled before the run finished; they are dropped and counted in "
                    "run.dropped_records",
                    lost,
                    journal.path,
                )
        self.count_held_lost()

    def count_held_lost(self) -> None:
        """Take the journal's count of held records it let go (``dropped``)."""
        journal = self.journal
        if journal is not None:
            with contextlib.suppress(JournalError):
                self._held_lost = journal.held_lost()

    # -- reporting ---------------------------------------------------------------
    def refuse(self, exc: BaseException, *, defer: bool = False) -> None:
        """A call's whole record refused: counted in ``failed_records["encode"]``,
        then reported as bad input (under ``on_error="raise"``, raised now or,
        with ``defer``, at the end of ``finish()``)."""
        with self.lock:
            self._encode_failed += 1
        if defer and self.on_error == "raise":
            self.defer(exc)
            return
        self.bad_input(exc)

    def drop_fields(
        self, errors: Sequence[records.RecordEncodeError], *, defer: bool = False
    ) -> None:
        """Fields a screen left out: each counted in ``failed_records["encode"]``
        every time, each named in one warning per run. Under
        ``on_error="raise"`` the first is raised (with ``defer``, at the end of
        ``finish()``) after the rest of the record was journaled."""
        if not errors:
            return
        with self.lock:
            self._encode_failed += len(errors)
        if self.on_error == "raise":
            if defer:
                self.defer(errors[0])
                return
            raise errors[0]
        for error in errors:
            self.say_field(error)

    def say_field(self, error: BaseException) -> None:
        """Warn about a dropped field (or record) once per field per run."""
        path = getattr(error, "path", None)
        if isinstance(path, str):
            field = _INDEX.sub("[]", path)
            with self.lock:
                if field in self._fields_said or len(self._fields_said) >= _MAX_ERRORS:
                    return
                self._fields_said.add(field)
        self.note("record", error)

    def defer(self, exc: BaseException) -> None:
        """Keep ``exc`` to raise at the end of the call under way (``finish()``)."""
        with self.lock:
            if self._deferred is None:
                self._deferred = exc

    def bad_input(self, exc: BaseException) -> None:
        if self.on_error == "raise":
            raise exc
        self.note("record", exc)

    def note(self, what: str, exc: BaseException, *, warn: bool = True) -> None:
        """Record a failure for ``run.errors`` (kept to be raised later under
        ``on_error="raise"`` unless it is bad input, raised at once)."""
        text = f"{what} failed: {type(exc).__name__}: {exc}"
        with self.lock:
            if len(self.errors) < _MAX_ERRORS:
                self.errors.append(text)
            if (
                self._deferred is None
                and self.on_error == "raise"
                and not isinstance(exc, TypeError | ValueError)
            ):
                self._deferred = exc
        if warn:
            log.warning("prime-runs: %s", text)

    def note_text(self, text: str) -> None:
        """Add ``text`` to ``run.errors``: something the caller must know that
        is no failure of this process's calls (never raised, not logged here)."""
        with self.lock:
            if len(self.errors) < _MAX_ERRORS:
                self.errors.append(text)

    def raise_deferred(self) -> None:
        """Under ``on_error="raise"``: raise the first failure not raised yet,
        noted here or recorded by the uplink."""
        if self.on_error != "raise":
            return
        with self.lock:
            exc, self._deferred = self._deferred, None
        if exc is not None:
            raise exc
        found = self.uplink_errors()
        with self.lock:
            fresh, self._raised = found[self._raised :], len(found)
        if fresh:
            raise ledger.error_from_record(fresh[0])

    def warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning("prime-runs: %s", message)

    # -- life --------------------------------------------------------------------
    def close(self) -> None:
        """Freeze what the journal says (losses, the uplink's errors) and close it."""
        journal = self.journal
        if journal is None:
            return
        self.settle_held(0.0)  # what is still held is lost with the journal's close: counted
        self._final_losses = self.losses()
        self._final_errors = self.uplink_errors()
        journal.close()

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock, since a thread of the parent may
        have held this one at the fork."""
        self.lock = threading.Lock()


def _finished(what: str) -> RunFinishedError:
    return RunFinishedError(f"{what}: the run is finished; start a new run with pr.init()")


def _as_encode_error(exc: BaseException, where: str) -> BaseException:
    """A record's failure as the ``TypeError``/``ValueError`` ``on_error`` handles."""
    if isinstance(exc, TypeError | ValueError):
        return exc
    return records.RecordEncodeError(
        where,
        f"encoding it raised {type(exc).__name__}: {exc}",
        "fix the record's object or log its mapping instead",
    )


def _encode(kind: EntryKind, item: Any, where: str) -> bytes:
    """One record's journal payload, or TypeError/ValueError naming ``where``."""
    if kind is EntryKind.EPISODE and not _has_trace_list(item):
        raise records.RecordEncodeError(
            where,
            "it is not an episode: it has no 'traces' list, so Prime Traces "
            "would refuse it and the sample table would get no row from it",
            "log what verifiers' Episode.to_record() returns ({'id': ..., "
            "'traces': [...], ...}), or bare traces with log_traces",
        )
    if kind is EntryKind.EPISODE or kind is EntryKind.TRACE:
        _check_work_steps(item, where)
    payload = records.encode_record(item, what=where)
    if len(payload) > MAX_ENTRY_BYTES:
        raise records.RecordEncodeError(
            where,
            f"it is {len(payload):,} bytes as JSON, over the journal's "
            f"{MAX_ENTRY_BYTES >> 20} MiB per-record limit",
            "split it into smaller records or leave out its largest fields",
        )
    return payload


def _check_work_steps(item: Any, where: str) -> None:
    """A record whose ``run.work.step`` (its own, or one of its traces') the
    platform cannot keep is refused here, naming the field: a step beyond 64
    bits made the local platform answer 500 to the upload holding it, each
    time, and every record after it waited (the sample table's step is an
    int64 too). Read from the record as given (keys of a mapping, attributes
    of an object): a record's own ``to_record`` is not called twice. Only an
    int beyond the range: a step of another type is the platform's to judge
    (it may coerce 10.0), and the sample table takes no row of it.

    This runs on every record logged, so plain dicts are read directly and
    a trace without a ``run`` block costs one lookup."""
    if type(item) is dict:
        step = _run_step(item.get("run"))
        members = item.get("traces")
    else:
        step = _run_step(records.get_field(item, "run"))
        members = records.get_field(item, "traces")
    if type(step) is int and not records.FIRST_STEP <= step <= records.LAST_STEP:
        raise ValueError(records.step_out_of_range(f"{where}.run.work.step", step))
    if type(members) is not list and not isinstance(members, tuple):
        return
    for index, member in enumerate(members):
        run = member.get("run") if type(member) is dict else records.get_field(member, "run")
        if run is None:
            continue
        step = _run_step(run)
        if type(step) is int and not records.FIRST_STEP <= step <= records.LAST_STEP:
            what = f"{where}.traces[{index}].run.work.step"
            raise ValueError(records.step_out_of_range(what, step))


def _run_step(run: Any) -> Any:
    """``run.work.step`` of a record's ``run`` block, None where a part is missing."""
    if type(run) is dict:
        work = run.get("work")
    elif run is None:
        return None
    else:
        work = records.get_field(run, "work")
    if type(work) is dict:
        return work.get("step")
    return records.get_field(work, "step")


def _has_trace_list(item: Any) -> bool:
    """Whether ``item`` (a mapping or an episode object) carries a list of traces."""
    if type(item) is dict or isinstance(item, Mapping):  # (no ABC check for a dict)
        return isinstance(item.get("traces"), list | tuple)
    to_record = getattr(item, "to_record", None)
    if callable(to_record) or not hasattr(item, "traces"):
        return True  # its record decides; the encoder checks the rest
    return isinstance(item.traces, list | tuple)


def _looks_like_episode(item: Any) -> bool:
    if isinstance(item, Mapping):
        return "traces" in item
    return hasattr(item, "traces")
