"""The ``Run`` handle: the part of the SDK a producer touches (``init()``, in
:mod:`primeruns.opening`, makes it).

A ``log_*`` call encodes its records, appends them to the run's journal in one
transaction, wakes the run's uplink without blocking and returns; that is all
the producer ever waits for. The uplink (:mod:`primeruns.ship`, a process
beside this one) uploads the journal; ``flush()`` and ``finish()`` read how
far it got from the journal, and ``finish()`` journals the finish entry, which
the uplink drains up to and closes the run out with. Under the default
``on_error="warn"`` no platform failure ever reaches the producer: failures
are recorded in ``run.errors`` and the journal keeps what was not shipped,
for ``primeruns replay``.

Modes: ``online`` (journal + upload), ``offline`` (journal only, for
``primeruns sync`` later) and ``disabled`` (nothing is written anywhere).
"""

from __future__ import annotations

import logging
import operator
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from . import hooks, records
from .exceptions import (
    FINISHED_WHILE_LOGGING,
    JournalError,
    RunFinishedError,
)
from .journal import (
    EntryKind,
    Journal,
)
from .journal.frames import MAX_ENTRY_BYTES
from .models import (
    CONFIG_SOURCE_KEY,
    ConfigSource,
    Mode,
    OnError,
    RunKind,
    RunStatus,
)
from .platform import Settings
from .platform.binding import Binding
from .ship import ledger
from .ship.factory import sink_kinds
from .ship.lifecycle import Lifecycle
from .ship.link import UplinkHandle, UplinkThreads

__all__ = ["Run"]

log = logging.getLogger("primeruns")

_SIGTERM_GRACE = 20.0
# finish() waits this much past its timeout for the uplink's last steps
# (stopping its shippers, the close-out call) before it returns anyway.
_CLOSE_GRACE = 10.0
_CRASHED = "process exited without finishing the run"


class Run:
    """A run being tracked. Create it with :func:`init`.

    Thread-safe: ``log_*`` may be called from any thread or coroutine. What
    survives a crash: every ``log_*`` call that returned is in the journal at
    ``journal_path`` (with the default durability, a SIGKILL right after the
    call loses nothing; ``durability="fsync"`` also survives power loss).
    """

    def __init__(
        self,
        *,
        kind: RunKind,
        mode: Mode,
        name: str | None,
        config: dict[str, Any],
        on_error: OnError,
        finish_timeout: float,
        attached: bool,
        journal: Journal | None,
        settings: Settings | None,
        local_id: str,
    ) -> None:
        self._kind: RunKind = kind
        self._mode: Mode = mode
        self._name = name
        self._config = config
        self._on_error: OnError = on_error
        self._finish_timeout = finish_timeout
        self._attached = attached
        self._journal = journal
        self._settings = settings
        self._local_id = local_id
        self._status = RunStatus.RUNNING
        self._summary: dict[str, Any] = {}
        self._errors: list[str] = []
        self._deferred: BaseException | None = None
        self._dropped = 0
        self._encode_failed = 0
        self._forked_dropped = 0
        self._lock = threading.Lock()
        self._finish_lock = threading.Lock()
        self._finishing = False
        self._finished = False
        self._pid = os.getpid()
        self._lifecycle: Lifecycle | None = None  # reads the binding from the journal
        self._uplink: UplinkHandle | None = None
        self._uplink_replaced = False
        # The newest seq appended of each entry kind: what flush() waits for.
        self._last_by_kind: dict[int, int] = {}
        self._raised = 0  # uplink failures already raised (on_error="raise")
        self._warned: set[str] = set()
        self._bound: Binding | None = None
        self._final_losses: dict[str, dict[str, Any]] | None = None
        self._final_errors: list[dict[str, Any]] | None = None

    # -- identity ----------------------------------------------------------
    @property
    def id(self) -> str:
        """The platform's run id once registered; the local journal id before."""
        binding = self._binding()
        return binding.run_id if binding is not None else self._local_id

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def url(self) -> str | None:
        """The run's dashboard page, or None until the platform registered it."""
        binding = self._binding()
        return binding.url if binding is not None else None

    @property
    def kind(self) -> RunKind:
        return self._kind

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def status(self) -> RunStatus:
        return self._status

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def attached(self) -> bool:
        return self._attached

    @property
    def config(self) -> dict[str, Any]:
        """The run's config, live: an evaluation's edits before ``finish()``
        are stored with it (as the vendor's SDK does)."""
        return self._config

    @property
    def config_source(self) -> ConfigSource | None:
        stored = self._config.get(CONFIG_SOURCE_KEY)
        return ConfigSource.from_mapping(stored) if isinstance(stored, Mapping) else None

    @property
    def summary(self) -> dict[str, Any]:
        """The run's summary, live: edits before ``finish()`` are sent with it."""
        return self._summary

    @property
    def errors(self) -> list[str]:
        """What went wrong: bad input here, and the uplink's failures (from the journal)."""
        return list(self._errors) + [ledger.error_text(e) for e in self._uplink_errors()]

    def _uplink_errors(self) -> list[dict[str, Any]]:
        if self._final_errors is not None:
            return self._final_errors
        if self._journal is None or self._uplink is None or not self._owner_process():
            return []
        try:
            return ledger.read_errors(self._journal)
        except JournalError:
            return []

    @property
    def journal_path(self) -> Path | None:
        """The run's journal directory (for ``primeruns replay``); None when disabled."""
        return self._journal.path if self._journal is not None else None

    @property
    def dropped_records(self) -> int:
        """Records never journaled: the journal's byte budget or the disk was full,
        or a forked child logged to its parent's run."""
        return self._dropped + self._forked_dropped

    @property
    def failed_records(self) -> dict[str, int]:
        """Per sink, records it could not store (with reasons in ``errors``);
        ``encode`` counts records that could not be encoded at all."""
        out: dict[str, int] = {}
        if self._encode_failed:
            out["encode"] = self._encode_failed
        for sink, loss in self._losses().items():
            if sink != "journal" and loss.get("count"):
                out[sink] = out.get(sink, 0) + int(loss["count"])
        return out

    def _losses(self) -> dict[str, dict[str, Any]]:
        if self._final_losses is not None:
            return self._final_losses
        if self._journal is None or not self._owner_process():
            return {}
        try:
            return self._journal.losses()
        except JournalError:
            return {}

    def __repr__(self) -> str:
        return f"<Run {self._kind} id={self.id!r} mode={self._mode} status={self._status.value}>"

    # -- logging -------------------------------------------------------------
    def log_episodes(self, episodes: Iterable[Any]) -> None:
        """Journal finished episodes (objects with ``to_record()``, mappings,
        pydantic/attrs/dataclass instances). Returns once they are journaled."""
        self._log(EntryKind.EPISODE, episodes, "episodes")

    def log_traces(self, traces: Iterable[Any]) -> None:
        """Journal bare traces (episodes given here are journaled as episodes)."""
        self._check_live("log_traces")
        if self._journal is None or not self._owner_process():
            self._log(EntryKind.TRACE, traces, "traces")
            return
        bare: list[Any] = []
        for item in traces:
            if _looks_like_episode(item):
                if bare:
                    self._log(EntryKind.TRACE, bare, "traces")
                    bare = []
                self._log(EntryKind.EPISODE, [item], "traces")
            else:
                bare.append(item)
        if bare:
            self._log(EntryKind.TRACE, bare, "traces")

    def log_metrics(self, values: Mapping[str, Any], *, step: int | None = None) -> None:
        """Journal one metrics row (training runs; a no-op for evaluations).

        Non-finite numbers are dropped; ``step`` is sent unless ``values``
        already has one; ``_timestamp`` is the time of this call.
        """
        self._check_live("log_metrics")
        if type(values) is not dict and not isinstance(values, Mapping):
            self._bad_input(
                TypeError(f"log_metrics: values must be a mapping, got {type(values).__name__}")
            )
            return
        if step is not None:
            try:
                if isinstance(step, bool):
                    raise TypeError
                step = operator.index(step)  # numpy and torch integers too
            except TypeError:
                self._bad_input(TypeError(f"log_metrics: step must be an int, got {step!r}"))
                return
        if self._kind != "train" or self._journal is None:
            return
        try:
            row = records.clean_metrics(values)
        except (TypeError, ValueError) as exc:
            self._bad_input(exc)
            return
        if step is not None and "step" not in row:
            row["step"] = step
        row.setdefault("_timestamp", time.time())
        self._append(EntryKind.METRICS, [records.encode_metrics_row(row)])

    def update_summary(self, values: Mapping[str, Any]) -> None:
        """Merge values into the run's summary (non-finite numbers dropped)."""
        self._check_live("update_summary")
        try:
            cleaned = self._encodable(records.clean_metrics(values), "update_summary")
        except (TypeError, ValueError) as exc:
            self._bad_input(exc)
            return
        with self._lock:
            self._summary.update(cleaned)
            summary = dict(self._summary)
        if self._journal is not None:
            self._append(EntryKind.SUMMARY, [records.encode_record(summary, what="update_summary")])

    def _encodable(self, values: dict[str, Any], what: str) -> dict[str, Any]:
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
                self._bad_input(exc)
                continue
            kept[key] = value
        return kept

    def _log(self, kind: EntryKind, items: Iterable[Any], what: str) -> None:
        self._check_live(f"log_{what}")
        if isinstance(items, Mapping | str | bytes):
            self._bad_input(
                TypeError(
                    f"log_{what}: pass a list of records, not a single {type(items).__name__}"
                )
            )
            return
        if self._journal is None:
            return
        payloads: list[bytes] = []
        first_error: BaseException | None = None
        try:
            for index, item in enumerate(items):
                try:
                    if kind is EntryKind.EPISODE and not _has_trace_list(item):
                        raise records.RecordEncodeError(
                            f"{what}[{index}]",
                            "it is not an episode: it has no 'traces' list, so Prime Traces "
                            "would refuse it and the sample table would get no row from it",
                            "log what verifiers' Episode.to_record() returns ({'id': ..., "
                            "'traces': [...], ...}), or bare traces with log_traces",
                        )
                    payload = records.encode_record(item, what=f"{what}[{index}]")
                    if len(payload) > MAX_ENTRY_BYTES:
                        raise records.RecordEncodeError(
                            f"{what}[{index}]",
                            f"it is {len(payload):,} bytes as JSON, over the journal's "
                            f"{MAX_ENTRY_BYTES >> 20} MiB per-record limit",
                            "split it into smaller records or leave out its largest fields",
                        )
                    payloads.append(payload)
                except (TypeError, ValueError) as exc:
                    with self._lock:  # counts must be exact under many threads
                        self._encode_failed += 1
                    if self._on_error != "raise":
                        self._note("record", exc)
                    first_error = first_error or exc
        except Exception as exc:  # not iterable, or the producer's generator raised
            error = TypeError(
                f"log_{what}: could not iterate the records ({type(exc).__name__}: {exc}); "
                "pass a list of records"
            )
            if self._on_error != "raise":
                self._note("record", error)
            first_error = first_error or error
        if payloads:  # the good records of the call are journaled either way
            self._append(kind, payloads)
        if first_error is not None and self._on_error == "raise":
            raise first_error

    def _append(
        self,
        kind: EntryKind,
        payloads: Sequence[bytes],
        *,
        essential: bool = False,
        final: bool = False,
    ) -> None:
        journal = self._journal
        if journal is None:
            return
        if not self._owner_process():
            with self._lock:
                self._forked_dropped += len(payloads)
            self._warn_once(
                "fork",
                "a forked child logged to its parent's run; its records are dropped and "
                "counted in run.dropped_records. Log from the parent, or call pr.init() "
                "in the child for a run of its own.",
            )
            return
        try:
            result = journal.append(kind, payloads, essential=essential, final=final)
        except ValueError as exc:  # a payload over the per-entry limit (checked earlier)
            with self._lock:
                self._encode_failed += len(payloads)
            self._note("record", exc)
            return
        except JournalError as exc:
            if (self._finishing or self._finished) and not final:
                # Closed by another thread's finish while this call encoded
                # (the appender refuses a record after the finish likewise).
                raise RunFinishedError(FINISHED_WHILE_LOGGING) from None
            with self._lock:
                self._dropped += len(payloads)
            self._warn_once("journal", f"the journal refused records: {exc}")
            return
        if result.first_seq is not None and result.count:
            last = result.first_seq + result.count - 1
            with self._lock:
                if last > self._last_by_kind.get(int(kind), 0):
                    self._last_by_kind[int(kind)] = last
            uplink = self._uplink
            if uplink is not None:
                uplink.wake()
        if result.dropped:
            with self._lock:
                self._dropped += result.dropped
            self._warn_once(
                "budget",
                f"the journal at {journal.path} is full (byte budget or disk); records are "
                "being dropped and counted in run.dropped_records. Free disk space or raise "
                "the budget (PRIME_RUNS_MAX_JOURNAL_BYTES).",
            )

    # -- waiting and closing ---------------------------------------------------
    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every live sink shipped what was journaled before this call.

        Returns False if the timeout passed first. Under ``on_error="raise"``
        the first failure recorded so far is raised here.
        """
        done = self._drain(timeout)
        self._raise_deferred()
        return done

    def _drain(self, timeout: float | None) -> bool:
        """Wait until every live sink acknowledged what was journaled before
        the call; False at the timeout, or once a sink is retired or paused."""
        if self._journal is None or not self._owner_process() or self._uplink is None:
            return True
        with self._lock:
            targets = dict(self._last_by_kind)
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        hurried = False
        while True:
            mark = self._uplink.progress_mark()  # before the look: no report is missed
            done, settled = self._sinks_caught_up(targets)
            if done:
                return True
            if settled:
                return False
            if not hurried:
                self._uplink.hurry()  # small batches go now: someone waits for them
                hurried = True
            self._replace_dead_uplink()
            left = deadline - time.monotonic()
            if left <= 0 or not self._uplink.alive():
                return False  # out of time, or nothing left to ship it
            self._uplink.wait_progress(mark, left)  # woken by the uplink's progress

    def _sinks_caught_up(self, targets: Mapping[int, int]) -> tuple[bool, bool]:
        """(every sink has what it owes up to ``targets``, the rest are retired or paused)."""
        journal = self._journal
        assert journal is not None
        done = settled = True
        try:
            for name, kinds in sink_kinds(self._kind).items():
                target = max((targets.get(int(k), 0) for k in kinds), default=0)
                if target == 0:
                    continue
                standing = ledger.read_standing(journal, name)
                if standing.off is not None or journal.cursor(name).acked >= target:
                    continue
                done = False
                settled = settled and standing.settled
        except JournalError:
            return False, True
        return done, settled and not done

    def _replace_dead_uplink(self) -> None:
        """If the uplink process died before closing the run out (killed, out
        of memory), ship from threads in this process from now on."""
        uplink, journal = self._uplink, self._journal
        if uplink is None or journal is None or self._uplink_replaced or uplink.alive():
            return
        if ledger.read_closeout(journal) is not None or self._settings is None:
            return  # it finished its work
        self._uplink_replaced = True
        log.warning(
            "prime-runs: the uplink process of run %s exited before the run was finished; "
            "shipping from threads in this process from now on (nothing is lost: it ships "
            "from the journal)",
            self.id,
        )
        uplink.release()
        journal.unshare_lock()
        journal.take_back_moving()
        self._uplink = UplinkThreads(journal, self._settings, [])

    def finish(
        self,
        summary: Mapping[str, Any] | None = None,
        *,
        status: RunStatus | str = RunStatus.COMPLETED,
        error: str | BaseException | None = None,
        timeout: float | None = None,
    ) -> None:
        """Close the run: journal the finish, drain the uploads (up to
        ``timeout``, default ``finish_timeout``), then finalize on the platform.

        Idempotent: the first call decides the status; later calls return at
        once. What could not be shipped stays in the journal, and the warning
        names the command that ships it.
        """
        try:
            final = RunStatus(status)
        except ValueError:
            raise ValueError(
                "finish: status must be one of completed, failed, cancelled, crashed; "
                f"got {status!r}"
            ) from None
        if final is RunStatus.RUNNING:
            raise ValueError("finish: status 'running' is not a terminal status")
        with self._finish_lock:
            if self._finished or self._finishing:
                return
            self._finishing = True
            try:
                self._finish_once(summary, final, error, timeout)
            finally:
                self._finished = True
        self._raise_deferred()

    def _finish_once(
        self,
        summary: Mapping[str, Any] | None,
        status: RunStatus,
        error: str | BaseException | None,
        timeout: float | None,
        wait: float | None = None,
    ) -> None:
        """``timeout``: how long the uplink may ship before it closes the run
        out; ``wait``: how long this call waits for it (default: as long)."""
        if summary:
            try:
                cleaned = records.clean_metrics(summary)
                cleaned = self._encodable(cleaned, "finish summary")
            except (TypeError, ValueError) as exc:
                self._note("summary", exc)
                cleaned = {}
            with self._lock:
                self._summary.update(cleaned)
        self._status = status
        message: str | None = None
        if error is not None:
            message = _describe(error)
        elif status is not RunStatus.COMPLETED and self._errors:
            message = self._errors[0]
        journal = self._journal
        if journal is None or not self._owner_process():
            return
        hooks.unregister(self)
        self._store_edited_config(journal)
        budget = self._finish_timeout if timeout is None else timeout
        waiting = budget if wait is None else min(wait, budget)
        record = {
            "status": status.value,
            "error": message,
            # The live summary may hold what the user put there: only what encodes.
            "summary": self._encodable(_finite_summary(self._summary), "summary"),
            "at": time.time(),
            "timeout": budget,  # the uplink's deadline: at + timeout
        }
        self._append(
            EntryKind.FINISH,
            [records.encode_record(record, what="finish")],
            essential=True,
            final=True,
        )
        uplink = self._uplink
        if self._mode != "online" or uplink is None:
            self._close_journal()
            return
        self._replace_dead_uplink()
        uplink = self._uplink
        assert uplink is not None
        uplink.closing()
        pending = self._pending()
        if pending:
            log.info(
                "prime-runs: finishing run %s: shipping %d record(s) (%s), for up to %.0f s",
                self.id,
                sum(pending.values()),
                ", ".join(f"{k}: {v}" for k, v in pending.items()),
                budget,
            )
        done_by = time.monotonic() + waiting + (_CLOSE_GRACE if wait is None else 0.0)
        while True:
            if uplink.wait_exit(max(0.0, done_by - time.monotonic())):
                self._replace_dead_uplink()  # it died before closing the run out
                if self._uplink is uplink:
                    break
                uplink = self._uplink
                assert uplink is not None
                uplink.closing()
            elif time.monotonic() >= done_by:
                break
        outcome = ledger.read_closeout(journal)
        if self._kind == "eval":
            written = int(journal.get_meta("episodes_written", 0) or 0)
            with self._lock:
                prime = dict(self._summary.get("prime_runs") or {})
                prime["traces_episodes_written"] = written
                self._summary["prime_runs"] = prime
        if outcome is None:
            log.warning(
                "prime-runs: run %s is still being shipped by its uplink (pid %s), which "
                "closes it out when done; everything is in the journal at %s (if the uplink "
                "is stopped, ship it with: primeruns replay %s)",
                self.id,
                uplink.pid,
                journal.path,
                journal.path,
            )
        else:
            if outcome.stalled_s is not None:
                log.warning(
                    "prime-runs: nothing shipped for %.0f s; not waiting any longer",
                    outcome.stalled_s,
                )
            if not outcome.drained or outcome.pending:
                log.warning(
                    "prime-runs: %d record(s) of run %s were not shipped (%s); they are kept "
                    "in the journal. Ship them with: primeruns replay %s",
                    sum(outcome.pending.values()),
                    self.id,
                    ", ".join(f"{k}: {v}" for k, v in outcome.pending.items())
                    or "finalize pending",
                    journal.path,
                )
            elif not outcome.finalized:
                log.warning(
                    "prime-runs: run %s is not closed out on the platform yet (it could not "
                    "be reached); everything is shipped. Close it out with: primeruns replay %s",
                    self.id,
                    journal.path,
                )
        self._close_journal()

    def _close_journal(self) -> None:
        journal = self._journal
        if journal is None:
            return
        self._binding()
        self._final_losses = self._losses()
        self._final_errors = self._uplink_errors()
        if self._uplink is not None:
            self._uplink.release()
        journal.close()

    def _pending(self) -> dict[str, int]:
        """Per sink still on, how many records it has not shipped (reads the journal)."""
        journal = self._journal
        if journal is None or self._uplink is None:
            return {}
        try:
            return ledger.pending_by_sink(journal, sink_kinds(self._kind))
        except JournalError:
            return {}

    def fail(self, error: str | BaseException, *, timeout: float | None = None) -> None:
        """Finish the run as failed with ``error`` as the reason."""
        self.finish(status=RunStatus.FAILED, error=error, timeout=timeout)

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        import asyncio

        try:
            if exc is None:
                self.finish()
            elif isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
                self.finish(status=RunStatus.CANCELLED, error="interrupted")
            else:
                self.finish(status=RunStatus.FAILED, error=exc)
        except Exception as finish_exc:
            if exc is None:
                raise
            log.warning("prime-runs: closing the run failed: %s", finish_exc)
        return False

    # -- internals -------------------------------------------------------------
    def _binding(self) -> Binding | None:
        # A binding never changes once made, so it is cached: the journal may be closed later.
        if self._bound is None and self._lifecycle is not None and not self._finished:
            try:
                self._bound = self._lifecycle.binding()
            except JournalError:
                return None
        return self._bound

    def _owner_process(self) -> bool:
        return self._pid == os.getpid()

    def _store_edited_config(self, journal: Journal) -> None:
        """An evaluation's ``config`` edited since ``init()``: the close-out
        sends it (the run's spec in the journal is what the uplink registers
        and closes the run with). A training run's config is the launcher's."""
        if self._kind != "eval" or self._attached:
            return
        try:
            spec = journal.get_meta("spec") or {}
        except JournalError as exc:
            self._note("config", exc)
            return
        if spec.get("config") == self._config:  # as registered: nothing to store
            return
        edited = self._encodable(dict(self._config), "config")
        try:
            journal.set_meta("spec", {**spec, "config": edited})
        except (JournalError, TypeError, ValueError) as exc:
            self._note("config", exc)

    def reset_after_fork(self) -> None:
        """In a forked child (called by the fork hook): fresh locks, since a
        thread of the parent may have held one at the fork. The parent keeps
        the run: the child's ``log_*`` calls are dropped and counted in
        ``dropped_records``, and its exit never closes the run."""
        self._lock = threading.Lock()
        self._finish_lock = threading.Lock()

    def _check_live(self, what: str) -> None:
        if self._finishing or self._finished:
            raise RunFinishedError(f"{what}: the run is finished; start a new run with pr.init()")

    def _bad_input(self, exc: BaseException) -> None:
        if self._on_error == "raise":
            raise exc
        self._note("record", exc, warn=True)

    def _note(self, what: str, exc: BaseException, *, warn: bool = True) -> None:
        text = f"{what} failed: {type(exc).__name__}: {exc}"
        with self._lock:
            if len(self._errors) < 1000:
                self._errors.append(text)
            if (
                self._deferred is None
                and self._on_error == "raise"
                and not isinstance(exc, (TypeError, ValueError))
            ):
                self._deferred = exc
        if warn:
            log.warning("prime-runs: %s", text)

    def _on_sink_failure(self, what: str, exc: BaseException) -> None:
        self._note(what, exc)

    def _raise_deferred(self) -> None:
        if self._on_error != "raise":
            return
        with self._lock:
            exc, self._deferred = self._deferred, None
        if exc is not None:
            raise exc
        found = self._uplink_errors()
        with self._lock:
            fresh = found[self._raised :]
            self._raised = len(found)
        if fresh:
            raise ledger.error_from_record(fresh[0])

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning("prime-runs: %s", message)

    def _at_exit(self, deadline: float) -> None:
        if self._finished or self._finishing or not self._owner_process():
            return
        wait = max(0.0, min(self._finish_timeout, deadline - time.monotonic()))
        if self._mode == "online":
            pending = sum(self._pending().values())
            log.warning(
                "prime-runs: run %s was not finished; closing it as crashed at exit, "
                "waiting up to %.0f s for %d unshipped record(s) (all are in the journal)",
                self.id,
                wait,
                pending,
            )
        try:
            self._finish_at_exit(wait)
        except Exception as exc:
            log.warning("prime-runs: closing the run at exit failed: %s", exc)

    def _finish_at_exit(self, wait: float) -> None:
        # The uplink may go on after the interpreter exits (up to the run's
        # finish_timeout); the exit itself waits only ``wait``.
        with self._finish_lock:
            if self._finished or self._finishing:
                return
            self._finishing = True
            try:
                self._finish_once(None, RunStatus.CRASHED, _CRASHED, None, wait=wait)
            finally:
                self._finished = True

    def _on_sigterm(self) -> None:
        if self._finished or self._finishing or not self._owner_process():
            return
        try:
            self.finish(
                status=RunStatus.CANCELLED,
                error="terminated by SIGTERM",
                timeout=min(self._finish_timeout, _SIGTERM_GRACE),
            )
        except Exception as exc:
            log.warning("prime-runs: closing the run on SIGTERM failed: %s", exc)


def _finite_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return records.clean_metrics(summary)
    except (TypeError, ValueError):
        return dict(summary)


def _describe(error: str | BaseException) -> str:
    if isinstance(error, BaseException):
        text = str(error)
        return f"{type(error).__name__}: {text}" if text else type(error).__name__
    return str(error)


def _has_trace_list(item: Any) -> bool:
    """Whether ``item`` (a mapping or an episode object) carries a list of traces."""
    if isinstance(item, Mapping):
        return isinstance(item.get("traces"), list | tuple)
    to_record = getattr(item, "to_record", None)
    if callable(to_record) or not hasattr(item, "traces"):
        return True  # its record decides; the encoder checks the rest
    return isinstance(item.traces, list | tuple)


def _looks_like_episode(item: Any) -> bool:
    if isinstance(item, Mapping):
        return "traces" in item
    return hasattr(item, "traces")
