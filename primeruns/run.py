"""The ``Run`` handle, made by ``init()`` (:mod:`primeruns.opening`): the public
surface and nothing more. Each job behind it is a part of its own: the
:class:`~primeruns.recorder.Recorder` (checks, encodes and journals each call,
keeps the counts), the :class:`~primeruns.supervisor.Supervisor` of an online
run's uplink, and :mod:`primeruns.closing` (the finish entry, the wait, what is
said at the end). A ``log_*`` call returns once its records are journaled; the
producer never waits on the network, and under ``on_error="warn"`` never sees
a platform failure (they are in ``run.errors``; the journal keeps what was not
shipped). Modes: ``online`` (journal + upload), ``offline`` (journal only, for
``primeruns sync``) and ``disabled`` (nothing is written anywhere).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from primeruns.logs import get_logger

from . import closing, hooks, timeouts
from .exceptions import ConfigurationError
from .journal import EntryKind, in_memory
from .models import CONFIG_SOURCE_KEY, ConfigSource, Mode, RunKind, RunStatus
from .recorder import Recorder
from .rehoming import Rehomer
from .supervisor import Supervisor

if TYPE_CHECKING:
    from .forkchild import ForkOrigin
    from .joining import RunHandle

__all__ = ["Run"]

log = get_logger("primeruns")

_SIGTERM_GRACE = 20.0
_FLUSH_TIMEOUT = 30.0  # flush()'s default wait, as the vendor's
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
        recorder: Recorder,
        *,
        mode: Mode,
        name: str | None,
        config: dict[str, Any],
        finish_timeout: float,
        attached: bool,
        local_id: str,
        supervisor: Supervisor | None = None,
        fork: ForkOrigin | None = None,
    ) -> None:
        self._recorder = recorder
        # An online run's: what a forked child needs to log into it (forkchild).
        self._fork = fork
        self._supervisor = supervisor
        self._mode: Mode = mode
        self._name = name
        self._config = config
        self._finish_timeout = finish_timeout
        self._attached = attached
        self._local_id = local_id
        self._status = RunStatus.RUNNING
        self._finish_lock = threading.Lock()
        self._finished = False
        if supervisor is not None:
            recorder.wake = supervisor.wake
            if recorder.journal is not None and not in_memory(recorder.journal):
                # Its uplink ships and compacts the journal: room a full disk
                # refused comes back, so what it refused waits in memory.
                recorder.journal.when_held_stored(recorder.held_stored)
                recorder.journal.hold_when_full()
        if recorder.journal is not None and not in_memory(recorder.journal):
            recorder.rehomer = Rehomer(recorder.journal, supervisor)
        if fork is not None:
            recorder.forked_target = self._child_recorder

    # -- identity ------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The platform's run id once registered; the local journal id before."""
        bound = self._supervisor.binding() if self._supervisor else None
        return bound.run_id if bound else self._local_id

    @property
    def url(self) -> str | None:
        """The run's dashboard page, or None until the platform registered it."""
        bound = self._supervisor.binding() if self._supervisor else None
        return bound.url if bound else None

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def kind(self) -> RunKind:
        return self._recorder.kind

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
        """It continues a platform run by id (``init(id=...)``); a disabled
        run, which keeps the id it was given, continues none."""
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
        return self._recorder.summary

    @property
    def errors(self) -> list[str]:
        """What went wrong: bad input here, and the uplink's failures (from the journal)."""
        return self._recorder.all_errors()

    @property
    def journal_path(self) -> Path | None:
        """The run's journal directory (for ``primeruns replay``); None when
        disabled, or when no folder could take it (kept in memory)."""
        journal = self._recorder.journal
        return journal.path if journal is not None and not in_memory(journal) else None

    @property
    def dropped_records(self) -> int:
        """Records never journaled: the journal's byte budget or the disk was full,
        or a forked child could not open a journal of its own (``primeruns.forkchild``)."""
        return self._recorder.dropped

    @property
    def failed_records(self) -> dict[str, int]:
        """Per sink, records it could not store (with reasons in ``errors``);
        ``encode`` counts records that could not be encoded at all, and fields
        left out of a metrics row or a summary."""
        return self._recorder.failed_records()

    def __repr__(self) -> str:
        return f"<Run {self.kind} id={self.id!r} mode={self._mode} status={self._status.value}>"

    # -- logging ---------------------------------------------------------------------
    def log_episodes(self, episodes: Iterable[Any]) -> None:
        """Journal finished episodes (objects with ``to_record()``, mappings,
        pydantic/attrs/dataclass instances). Returns once they are journaled."""
        with hooks.sigterm_deferred:
            self._recorder.log(EntryKind.EPISODE, episodes, "episodes")

    def log_traces(self, traces: Iterable[Any]) -> None:
        """Journal bare traces (episodes given here are journaled as episodes)."""
        with hooks.sigterm_deferred:
            self._recorder.log_traces(traces)

    def log_metrics(self, values: Mapping[str, Any], *, step: int | None = None) -> None:
        """Journal one metrics row (training runs; a no-op for evaluations).

        Values are numbers (nested groups of numbers too). Non-finite numbers
        are dropped; a field that is not a number or cannot be journaled is
        left out, counted in ``failed_records["encode"]`` and named once;
        ``step`` is sent unless ``values`` already has one; ``_timestamp``
        is the time of this call.
        """
        with hooks.sigterm_deferred:
            self._recorder.log_metrics(values, step)

    def update_summary(self, values: Mapping[str, Any]) -> None:
        """Merge values into the run's summary (non-finite numbers dropped; a
        field that cannot be journaled is left out, counted and named)."""
        with hooks.sigterm_deferred:
            self._recorder.update_summary(values)

    # -- waiting and closing -----------------------------------------------------------
    def flush(self, timeout: float | None = _FLUSH_TIMEOUT) -> bool:
        """Wait until every live sink shipped what was logged before this call
        (records a full disk holds in memory included: they are journaled
        first, as the shipping frees room), by any thread; never for what
        other threads log while it waits, held or not.

        Returns False if the timeout passed first, or once a sink is retired
        or paused. Under ``on_error="raise"`` the first failure recorded so
        far is raised here. ``timeout``: seconds, of any number type; None
        or an infinity (an int past a float's range too) wait without a
        limit, a negative one not at all, and NaN or what is not a number
        waits the default 30 s, with a warning.
        """
        timeout = timeouts.flush_timeout(timeout, _FLUSH_TIMEOUT)
        done = True
        child = self._fork.opened() if self._fork is not None else None
        if child is not None:  # in a forked child: its own journal's records
            done = child.flush(timeout)
        elif self._supervisor is not None and self._recorder.owner_process():
            deadline = None if timeout is None else time.monotonic() + timeout
            # Records a full disk refused wait in memory for room the shipping
            # frees; they were logged before this call too: once journaled,
            # they are shipped as well. Not those held after it (another
            # thread logging on): waited for, they kept a flush going as long
            # as that thread logged (``Overflow.watch``). Watched before the
            # targets are read: one stored in between is in the targets then.
            held = self._recorder.watch_held()
            targets = self._recorder.targets()
            done = self._supervisor.drain(targets, timeout)
            if held is not None:
                # (Waited for at no length once the drain failed: the wait ends the watch.)
                left = 1e9 if deadline is None else max(0.0, deadline - time.monotonic())
                lasts = self._recorder.wait_watched(held, left if done else 0.0)
                done = done and lasts is not None
                if done and lasts:
                    left = 1e9 if deadline is None else max(0.0, deadline - time.monotonic())
                    kinds = {*targets, *lasts}
                    targets = {k: max(targets.get(k, 0), lasts.get(k, 0)) for k in kinds}
                    done = self._supervisor.drain(targets, left)
        self._recorder.raise_deferred()
        return done

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
        names the command that ships it. Of several processes attached to one
        run (ranks), only the primary's finish closes it, once the others on
        its host are done; the others' ship their records and leave it open
        (:mod:`primeruns.ranks`). A ``timeout`` the vendor's SDK reads
        (text, a negative number as 0) is taken so, with a warning; NaN, an
        infinity or what is not a number is ``finish_timeout``, with a warning.
        """
        if timeout is not None:
            timeout = timeouts.given_seconds("finish", "timeout", timeout, self._finish_timeout)
        self._finish_once(summary, closing.terminal(status), error, timeout, wait=None)
        self._recorder.raise_deferred()

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
        status, error = closing.ending_of(exc)
        try:
            self.finish(status=status, error=error)
        except Exception as finish_exc:
            if exc is None:
                raise
            log.warning("prime-runs: closing the run failed: %s", finish_exc)
        return False

    def _finish_once(
        self,
        summary: Mapping[str, Any] | None,
        status: RunStatus,
        error: str | BaseException | None,
        timeout: float | None,
        *,
        wait: float | None,
    ) -> None:
        """The first caller closes the run; any later or concurrent one returns."""
        recorder = self._recorder
        with self._finish_lock:
            if self._finished or recorder.closing:
                return
            recorder.begin_closing()
            try:
                self._status = status
                message = closing.settle(recorder, summary, status, error)
                child = self._fork.opened() if self._fork is not None else None
                if child is not None:  # a forked child: ships its own, leaves the run open
                    child._finish_once(None, RunStatus.COMPLETED, None, timeout, wait=wait)
                if recorder.journal is None or not recorder.owner_process():
                    return
                hooks.unregister(self)
                if self.kind == "eval" and not self._attached:
                    closing.store_edited_config(recorder, self._config)
                budget = self._finish_timeout if timeout is None else timeout
                if self._fork is not None:  # its exited children shipped first, in the budget
                    started = time.monotonic()
                    self._fork.wait_children(
                        recorder.journal.path, budget if wait is None else min(budget, wait)
                    )
                    spent = time.monotonic() - started
                    budget = max(0.0, budget - spent)
                    wait = None if wait is None else max(0.0, wait - spent)
                closing.finish_journal(
                    recorder,
                    self._supervisor,
                    status=status,
                    message=message,
                    budget=budget,
                    wait=wait,
                    run_id=self.id,
                )
            finally:
                self._finished = True

    def handle(self) -> RunHandle:
        """A picklable handle for worker processes that were not forked from
        this one (multiprocessing's spawn and forkserver starts, a
        subprocess): a worker passes it to ``pr.join()`` and logs into this
        run through a journal of its own; its ``finish()`` leaves the run
        open, and this run's ``finish()`` waits for the workers' records
        (:mod:`primeruns.joining`). Forked children need none: they log
        through the run they inherited."""
        from .joining import handle_of

        if self._fork is None and self._mode != "disabled":
            raise ConfigurationError(
                "handle: only the process that opened the run with init() can hand it to workers"
            )
        self.before_fork()  # the platform run, as a forked child gets it
        return handle_of(self._fork if self._mode != "disabled" else None, self.id, self.kind)

    # -- process hooks (primeruns.hooks) --------------------------------------------------
    def before_fork(self) -> None:
        """In the parent, about to fork: note the platform run for the child."""
        if self._fork is not None and not self._finished:
            bound = self._supervisor.binding() if self._supervisor else None
            self._fork.noted(bound.run_id if bound else None)

    def _child_recorder(self) -> Recorder | None:
        child = self._fork.child_run() if self._fork is not None else None
        return child._recorder if child is not None else None

    def reset_after_fork(self) -> None:
        """In a forked child: fresh locks (a thread of the parent may have held
        one at the fork). The parent keeps the run: the child's ``log_*``
        calls go to a journal of its own (``primeruns.forkchild``), and its
        exit never closes the run."""
        self._finish_lock = threading.Lock()
        self._recorder.reset_after_fork()

    def _at_exit(self, deadline: float) -> None:
        # Not while a finish is under way in this thread (its lock is not reentrant).
        if self._finished or self._recorder.closing or not self._recorder.owner_process():
            return
        wait = max(0.0, min(self._finish_timeout, deadline - time.monotonic()))
        if self._supervisor is not None:
            closing.warn_unfinished(self._supervisor, self.id, wait)
        try:
            # The uplink may go on after the interpreter exits (up to the run's
            # finish_timeout); the exit itself waits only ``wait``.
            self._finish_once(None, RunStatus.CRASHED, _CRASHED, None, wait=wait)
        except Exception as exc:
            log.warning("prime-runs: closing the run at exit failed: %s", exc)

    def _on_sigterm(self) -> None:
        if self._finished or self._recorder.closing or not self._recorder.owner_process():
            return
        try:
            self.finish(
                status=RunStatus.CANCELLED,
                error="terminated by SIGTERM",
                timeout=min(self._finish_timeout, _SIGTERM_GRACE),
            )
        except Exception as exc:
            log.warning("prime-runs: closing the run on SIGTERM failed: %s", exc)


# Their frames on the stack are log calls under way (``hooks._Deferral``).
hooks.sigterm_deferred.defers(Run.log_episodes, Run.log_traces, Run.log_metrics, Run.update_summary)
