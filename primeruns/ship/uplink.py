"""The uplink: one journal to the platform, for every way a run is shipped.

A live run's uplink process, its thread fallback, a requeued run shipping its
predecessor's journal, ``primeruns replay`` and ``primeruns sync`` all run
this code: register the run if it never was, start one shipper per sink from
its acknowledged offset (a recorded in-flight batch first, byte-identical),
and close the run out. One rule decides how (``terminal_state``): with the
status the producer's finish entry recorded, or as crashed when there is
none. A run already closed out is left as it is, so shipping twice is
harmless.

What the producer needs to know (sink standing, failures, how the close-out
went) is written to the journal (``ledger``), never sent to it directly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from urllib.parse import urlsplit

from primeruns.logs import get_logger

from .. import ranks, run_index
from ..exceptions import JournalError, PrimeRunsError
from ..journal import EntryKind, Journal
from ..journal.by_kind import last_entry
from ..loopback_owner import served_by_another_user, taken_by_another_user
from ..models import CRASH_ERROR
from ..platform import PlatformClient, Settings, resolve_settings
from ..platform.plain import importing
from ..platform.settings import split_api_root
from ..settings import is_loopback
from ..spec import RunSpec, spec_or_default, supply_spec
from ..threads import start_daemon
from . import handover, ledger
from .deadline import budget_left
from .factory import make_shippers
from .handover import take_over
from .lifecycle import K_FORK_PARENT, Lifecycle
from .mirror import sync_root
from .policy import UNREACHED_S, RetryPolicy
from .shipper import Shipper, drain_all

if TYPE_CHECKING:
    from ..sinks.step_ranges import Block

__all__ = [
    "CRASH_ERROR",
    "K_FOLLOWS",
    "UNREADABLE_FINISH",
    "Earlier",
    "Progress",
    "Uplink",
    "earlier_journals",
    "ending_of",
    "journal_settings",
    "json_object",
    "terminal_state",
]

log = get_logger("primeruns.uplink")

# After the producer died without finishing, the uplink ships what is left
# for at most this long (it stops sooner once a sink is stuck: RetryPolicy.stuck).
_ORPHAN_DEADLINE_S = 3600.0
_MAX_ERRORS = 1000
# Sample id ranges a rank may use per step before the next rank's (one per
# Parquet object of the step: a handful in practice).
_RANK_BLOCK = 256


@dataclass
class Progress:
    """How far a shipment got, for a progress bar."""

    records: int = 0
    bytes: int = 0
    sent: dict[str, int] = field(default_factory=dict)
    """Per sink, the records it had acknowledged since shipping began."""
    stopped: dict[str, str] = field(default_factory=dict)
    """Per sink that will ship no more now (turned off or retired), why."""


class ProducerLink(Protocol):
    """The uplink's view of its producer (``ship.link``)."""

    @property
    def producer_gone(self) -> bool: ...

    def wait(self, timeout: float | None) -> None:
        """Until the producer appends, finishes or dies (or ``timeout``; None: none)."""


#: The error a close-out sends for a finish record it cannot read.
UNREADABLE_FINISH = "the run's finish record could not be read from its journal"


def json_object(payload: bytes) -> dict[str, Any] | None:
    """``payload`` as a JSON object; None when it is not one. A journal is
    untrusted input (a copy, damaged or crafted): not JSON, another type,
    or nested past the parser's recursion are all answered, never raised."""
    try:
        record = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def ending_of(record: dict[str, Any] | None) -> tuple[str, str | None, dict[str, Any]]:
    """``(status, error, summary)`` of a finish record (None: one that could
    not be read, closed out as failed with ``UNREADABLE_FINISH``), each field
    of the type a close-out sends."""
    if record is None:
        return "failed", UNREADABLE_FINISH, {}
    error, summary = record.get("error"), record.get("summary")
    return (
        str(record.get("status", "failed")),
        error if error is None or isinstance(error, str) else str(error),
        summary if isinstance(summary, dict) else {},
    )


def terminal_state(journal: Journal) -> tuple[str, str | None, dict[str, Any]]:
    """``(status, error, summary)`` from the journal's finish entry, or a
    crash (with the last summary update) when the producer never finished.

    The newest intact entry of the two kinds decides, found from the log's
    end (``by_kind.last_entry``): a finish entry is the last a run appends
    (its journal refuses any after it), so a crash costs the entries past
    its last summary, not a pass over the whole log. A summary after a
    finish, which no run writes, is read as a crash closed out with it."""
    entry = last_entry(journal, (EntryKind.FINISH, EntryKind.SUMMARY))
    if entry is not None and entry.kind == EntryKind.FINISH:
        return ending_of(json_object(entry.payload))
    summary = None if entry is None else json_object(entry.payload)
    return "crashed", CRASH_ERROR, summary or {}


def journal_settings(
    journal: Journal,
    *,
    base_url: str | None = None,
    traces_url: str | None = None,
    spec: RunSpec | None = None,
) -> Settings:
    """Settings to ship ``journal`` with: the API key from this environment
    (never from the journal), and the platform the run was bound to, unless
    overridden. ``spec``: the user's, for a journal whose own was lost."""
    spec = spec_or_default(journal, spec)
    bound = journal.get_meta("platform") or {}
    current = resolve_settings(base_url=base_url)
    own = current
    chosen: list[str] = []  # the loopback URLs the journal chose: checked at each connection
    if base_url is None:
        recorded = bound.get("base_url") or (
            spec.base_url if current.sources.get("base_url") == "default" else None
        )
        if recorded:
            current = resolve_settings(base_url=str(recorded))
            if _refuse_unless_own("platform", current.origin, own):
                chosen.append(current.origin)
    traces = traces_url
    if traces is None and current.sources.get("traces_url") == "default":
        # An explicit --base-url moves Prime Traces along with the API (the
        # recorded traces URL is the old platform's), unless the environment
        # names one.
        traces = split_api_root(base_url)[0] if base_url else spec.traces_url
        if (
            traces
            and not base_url
            and _refuse_unless_own("Prime Traces", str(traces), own, current)
        ):
            chosen.append(str(traces).rstrip("/"))
    if traces:
        current = replace(current, traces_url=str(traces).rstrip("/"))
    return replace(current, journal_chosen=tuple(chosen)) if chosen else current


def _refuse_unless_own(what: str, url: str, *own: Settings) -> bool:
    """Raise JournalError unless ``url``, which the journal names, is where
    the user's own settings send the key (``own``) or this machine (a local
    platform). A journal is untrusted input: one handed over by someone
    else named where this environment's API key went, on the first request.
    True where it is taken as a local platform: no other user serves its
    port now, and each new connection to it is to be checked again
    (``Settings.journal_chosen``)."""
    if _site(url) in {_site(s.origin) for s in own} | {_site(s.traces_url) for s in own}:
        return False
    if is_loopback(url):
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:  # (a journal's traces URL is not checked as settings are)
            port = -1
        if port is None:
            port = 443 if parts.scheme == "https" else 80
        neighbour = served_by_another_user(port) if port >= 0 else None
        if port >= 0 and neighbour is None:
            return True
        if neighbour is None:
            raise JournalError(
                f"the run was recorded for the {what} at {url}, which has no port this "
                "machine serves: pass --base-url with the platform to ship it to"
            )
        raise JournalError(taken_by_another_user(what, url, neighbour))
    raise JournalError(
        f"the run was recorded for the {what} at {url}, not the one your settings "
        f"name ({own[0].origin}): a journal does not choose where your API key goes; pass "
        "--base-url with the platform to ship it to"
    )


def _site(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


# Meta: the names of the run's earlier journals a requeued process passed
# over, nothing left in them to ship (``earlier_journals``). It follows them
# all the same: a step it logs again draws its sample id ranges far from
# theirs (``_ranges_of``), as it does beside those it takes over.
K_FOLLOWS = "follows"


class Earlier(NamedTuple):
    """The journals of a runs directory that log to one platform run, besides
    the caller's (``earlier_journals``)."""

    left: list[Path]
    """Their processes gone, records or the run's close-out left: taken over."""
    finished: list[Path]
    """Their processes gone, nothing left (``handover.left_nothing``), or all
    of it shipped through their sync journals (``handover.shipped_by_its_sync_journal``)."""
    live: list[str]
    """The owners still logging to the run."""


def earlier_journals(runs_dir: Path, run_id: str, *, exclude: Path | None = None) -> Earlier:
    """Journals under ``runs_dir`` of platform run ``run_id``, found by the
    index by run (``run_index``: not by reading every past run). One that
    finished and shipped everything, or that an earlier requeue took over
    and shipped, is not taken over: a run key's requeues each took over
    every earlier one again, each costing more."""
    found = Earlier([], [], [])
    for info in run_index.journals_of(runs_dir, run_id, skip=[exclude] if exclude else []):
        if run_id in run_index.runs_of(info):
            if info.owner_alive:
                found.live.append(str(info.owner or info.path))
            elif handover.left_nothing(info) or handover.shipped_by_its_sync_journal(info):
                found.finished.append(info.path)
            else:
                found.left.append(info.path)
    return found


class Uplink:
    """Ships one journal (and the backlogs of its predecessors) and closes its run out."""

    def __init__(
        self,
        journal: Journal,
        settings: Settings,
        *,
        policy: RetryPolicy | None = None,
        notify: Callable[[], None] | None = None,
        log_level: int = logging.WARNING,
    ) -> None:
        """``notify`` is called on progress and on every change the producer
        may wait for; ``log_level``: of the line each failure logs (the CLI
        reports failures itself)."""
        self.journal = journal
        self._log_level = log_level
        self.client = PlatformClient(settings)
        self.policy = policy or RetryPolicy.from_env()
        self._notify = notify or (lambda: None)
        self.lifecycle = Lifecycle(
            journal, self.client, policy=self.policy, on_failure=self._on_failure
        )
        self.errors: list[str] = []
        self.shippers: list[Shipper] = []
        self.adopted: list[tuple[Journal, list[Shipper]]] = []
        self._closing = threading.Event()
        self._errors_lock = threading.Lock()
        # Standing down (``stand_down``) and closing out exclude each other:
        # which one ``serve`` does is decided once, under this lock.
        self._deciding = threading.Lock()
        self._standing_down = False
        self._hurry_on_start = False

    # -- failures ------------------------------------------------------------
    def _on_failure(self, what: str, exc: BaseException) -> None:
        self._record_failure(self.journal, what, exc)

    def _on_loss(self, what: str, exc: BaseException) -> None:
        self._record_failure(self.journal, what, exc, counted=True)

    def _record_failure(
        self, journal: Journal, what: str, exc: BaseException, *, counted: bool = False
    ) -> None:
        """Say a failure (``run.errors``, the log). ``counted``: records the
        platform refused for their content, counted lost with the reason in
        the journal's losses: said, but not among ``errors``, what a sync or
        replay left undone (a retry would not ship them)."""
        text = f"{what}: {type(exc).__name__}: {exc}"
        with self._errors_lock:
            if not counted and len(self.errors) < _MAX_ERRORS:
                self.errors.append(text)
        log.log(self._log_level, "prime-runs: %s failed: %s: %s", what, type(exc).__name__, exc)
        # A closed or full journal: the log line above still says it.
        with contextlib.suppress(JournalError, ValueError):
            ledger.record_error(journal, what, exc)
        self._notify()

    # -- shipping --------------------------------------------------------------
    def start(self, predecessors: Sequence[Path] = ()) -> None:
        """Start a shipper per sink, and ship the backlog of ``predecessors``
        (earlier processes of the same run) alongside."""
        # A forked child logs the steps its parent logs; the predecessors of
        # a requeued job, or the earlier attempts of a run key, may have
        # logged a step it logs again (resumed from a checkpoint).
        far = (
            bool(predecessors)
            or bool(self.journal.get_meta(K_FOLLOWS))
            or bool(self.journal.get_meta(K_FORK_PARENT))
            or self.lifecycle.spec.run_key is not None
        )
        self.shippers = make_shippers(
            self.journal,
            self.client,
            self.lifecycle,
            opted_out=self.lifecycle.spec.traces_opt_out,
            policy=self.policy,
            on_failure=self._on_failure,
            on_loss=self._on_loss,
            # (A training run's only: an evaluation never loads its sinks.)
            ranges=_ranges_of(self.journal, far, attached=self.lifecycle.spec.attach_id is not None)
            if self.lifecycle.spec.kind == "train"
            else None,
            on_progress=self._notify,
        )
        for shipper in self.shippers:
            shipper.start()
            if self._hurry_on_start:
                shipper.hurry()
        if not predecessors:
            return  # (and no sync root is looked up: a job without a home has none)
        for old in take_over(predecessors, sync_root(), self.journal.local_id):
            self._adopt(old)

    def _adopt(self, old: Journal) -> None:
        """Ship ``old``, the sync journal of an earlier process's journal (``handover``)."""
        try:
            old.set_meta("continued_by", self.journal.local_id)
            if supply_spec(old, self.lifecycle.spec):
                # Its own spec lost or damaged (``{}`` names no kind): it is
                # this run's, its run key or id found it, and read with the
                # default kind a training run's records would go to an
                # evaluation's sinks.
                log.warning(
                    "prime-runs: the spec of %s is damaged: shipping it as this run's", old.path
                )
            lifecycle = Lifecycle(
                old,
                self.client,
                policy=self.policy,
                on_failure=lambda what, exc: self._record_failure(self.journal, what, exc),
            )
            if lifecycle.binding() is None and lifecycle.spec.attach_id:
                # A predecessor that never bound the run (offline on its node):
                # binding an attached run sends nothing.
                lifecycle.register()
            binding = lifecycle.binding()
            if binding is not None:
                handover.remember(old, binding.run_id)
            shippers = make_shippers(
                old,
                self.client,
                lifecycle,
                opted_out=lifecycle.spec.traces_opt_out,
                policy=self.policy,
                on_failure=lambda what, exc: self._record_failure(self.journal, what, exc),
                on_loss=self._on_loss,
                # Far, as a requeued process's own: the earlier process may have
                # logged a step another process of the run logged too (both
                # resumed from one checkpoint), and numbered from a block's start
                # its samples would take the ids of the first process's.
                ranges=_ranges_of(old, True) if lifecycle.spec.kind == "train" else None,
            )
        except JournalError as exc:
            log.info("prime-runs: not taking over %s: %s", old.path, exc)
            old.close()
            return
        for shipper in shippers:
            shipper.start()
        self.adopted.append((old, shippers))

    def register_in_background(self) -> None:
        """Retry registration until the platform answers (it was unreachable
        when the run started) or the close-out begins; shippers start
        shipping once it does."""
        if self.lifecycle.binding() is not None:
            return
        start_daemon(self._register_until_closing, "primeruns-register")

    def _register_until_closing(self) -> None:
        try:
            bound = self.lifecycle.register_retrying(stop=self._closing)
        except JournalError:
            if not self.journal.closed:
                raise
            # In threads of the producer, whose finish() returned while a
            # request here still waited on the platform, and closed the
            # journal: the run registers when the journal is replayed.
            log.info("prime-runs: the background registration ended with the run's journal")
            return
        if bound is not None:
            log.info("prime-runs: run registered: %s", self.lifecycle.binding())
            self._registered()

    def _registered(self) -> None:
        for shipper in self.shippers:
            shipper.poke()
        self._notify()

    def _ensure_registered(self, deadline: float) -> float | None:
        """Register before the close-out ships (``Lifecycle.register_retrying``);
        the seconds spent when it gave up, else None."""
        if self.lifecycle.binding() is not None:
            return None
        started = time.monotonic()
        if self.lifecycle.register_retrying(deadline=deadline) is None:
            spent = time.monotonic() - started
            # Stuck (or never reached: the shorter allowance), not refused.
            return spent if spent >= min(self.policy.stall_s, UNREACHED_S) else None
        self._registered()
        return None

    def hurry(self) -> None:
        """The producer waits (flush): send what is queued without lingering
        (the shippers to come, too, when there is none yet)."""
        self._hurry_on_start = True
        for shipper in self.everyone():
            shipper.hurry()

    def everyone(self) -> list[Shipper]:
        return self.shippers + [s for _, group in self.adopted for s in group]

    # -- the live run ------------------------------------------------------------
    def serve(self, link: ProducerLink, predecessors: Sequence[Path] = ()) -> None:
        """Ship a live run until its producer finishes or dies, then close it
        out: with the finish the producer journaled, or as crashed."""
        self.start(predecessors)
        self.register_in_background()
        checked = 0
        finish: dict[str, Any] | None = None
        finished = False
        while not finished and not self._standing_down:
            found = self.journal.read(checked, kinds={EntryKind.FINISH}, max_entries=1)
            if found.entries:
                finish, finished = json_object(found.entries[-1].payload), True
                break
            if found.next_after > checked:
                checked = found.next_after
                continue  # the read stopped short of the log's end (a scan's limit): go on
            if link.producer_gone:
                break
            link.wait(None)
        with self._deciding:
            standing_down = self._standing_down
            if not standing_down:
                self._closing.set()
        if standing_down:
            self.stop_shipping()
            return
        if finished:
            status, error, summary = ending_of(finish)
            left = budget_left(finish or {}, _ORPHAN_DEADLINE_S)
        else:
            status, error, summary = terminal_state(self.journal)
            left = _ORPHAN_DEADLINE_S
            log.warning(
                "prime-runs: the producer of run %s stopped without finishing it; shipping "
                "what it logged and closing it as crashed",
                self.journal.local_id,
            )
        self.close_out(status, error, summary, deadline=time.monotonic() + left, live=True)

    def stand_down(self, *, for_good: bool = False) -> bool:
        """From another thread: make ``serve`` stop shipping and return
        without closing the run out (another uplink takes the journal over
        from its offsets, as after a crash); False once the close-out began.
        The caller wakes ``serve``'s link and waits for it to return.
        ``for_good``: no uplink takes over now (``init()`` failed)."""
        with self._deciding:
            # Not before the run is registered: a registration in flight
            # would land here after another uplink began registering it.
            # (For good, none begins: it stops with the close-out's flag.)
            unbound = self.lifecycle.binding() is None and not for_good
            if self._closing.is_set() or unbound:
                return False
            self._standing_down = True
            return True

    def stop_shipping(self) -> None:
        """Stop every shipper after its attempt in flight (each records its
        outcome first) and let go of the platform: nothing here writes to
        the journal after this returns. Also where ``serve`` failed: its
        shippers must not go on beside the uplink that ships next."""
        with self._deciding:
            self._closing.set()  # (a background registration stops too; stand_down refuses)
        everyone = self.everyone()
        for shipper in everyone:
            shipper.signal_stop()
        for shipper in everyone:
            shipper.join()
        for shipper in everyone:
            shipper.forget_standing()
        self.client.close()

    # -- closing out ---------------------------------------------------------------
    def close_out(
        self,
        status: str,
        error: str | None,
        summary: dict[str, Any],
        *,
        deadline: float,
        live: bool,
        progress: Callable[[Progress], None] | None = None,
        finalize: bool = True,
    ) -> ledger.Closeout:
        """Ship what is left (until ``deadline``, or until nothing moves for
        the policy's stuck rule), stop the shippers and finalize the run.

        ``live``: a run closing now (its finish, or its producer's death):
        sinks retry until the deadline rather than strike out, and the run is
        finalized even with records left (they stay in the journal for
        replay). Otherwise (replay, sync) the run is finalized only once
        everything is shipped, so a later replay still ships the rest first.
        ``finalize=False``: ship and stop, leaving the run open (a copy of a
        journal whose producer may still be writing it).
        """
        journal = self.journal
        everyone = self.everyone()
        if live:
            for shipper in everyone:
                shipper.revive(final=True)  # the platform may be back: retry until the deadline
        stalled = self._ensure_registered(deadline)
        last = journal.last_seq()
        if self.lifecycle.binding() is None:
            drained = False  # nothing can ship before the run is registered
        else:
            drained, stalled = _drain_while_moving(self.shippers, last, deadline, progress)
        for old, adopted in self.adopted:
            more, stuck = _drain_while_moving(adopted, old.last_seq(), deadline, None)
            drained = drained and more
            stalled = stalled or stuck
        self._report_left_behind(everyone)
        for shipper in everyone:
            shipper.signal_stop()
        for shipper in everyone:
            shipper.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        for old, adopted in self.adopted:
            with contextlib.suppress(JournalError):
                if not any(shipper.pending_records() for shipper in adopted):
                    old.set_meta("state", "shipped")
        pending = self.pending()
        summary = dict(summary)
        if self.lifecycle.spec.kind == "eval":
            ledger.stamp_episodes_written(summary, journal)
        finalized = self.lifecycle.finalized or bool(journal.get_meta("continued_by"))
        ready = live or not pending
        binding = self.lifecycle.binding()
        others_left: dict[str, str] = {}
        if finalize and not finalized and binding is not None and ready:
            if self.lifecycle.closes_run(status):
                # The run's other processes on this host ship theirs first.
                crashed = status == "crashed"  # no finish waited for its forked children
                others_left = self._wait_for_others(binding.run_id, deadline, crashed=crashed)
            # After a stalled drain the platform is likely down, as the drain
            # just spent the stall allowance showing: the close-out gets the
            # shorter allowance of a platform never reached, not the rest of
            # the deadline nor a second stall allowance (a platform gone
            # mid-run made finish() take two, 120 s, where the vendor's SDK
            # gave up in 45, keeping nothing). The journal keeps the finish:
            # ``replay`` or ``sync`` closes the run later.
            close_by = deadline
            if not drained:
                allowance = min(self.policy.stall_s, UNREACHED_S)
                close_by = min(deadline, time.monotonic() + allowance)
            try:
                self.lifecycle.finalize(status, error, summary, deadline=close_by)
            except Exception as exc:
                self._on_failure("finalize", exc)
            finalized = self.lifecycle.finalized
        self._close_adopted()
        if finalized and not pending:
            journal.set_meta("state", "shipped")
        outcome = ledger.Closeout(
            drained=drained,
            stalled_s=stalled,
            pending=pending,
            finalized=finalized,
            registered=self.lifecycle.binding() is not None,
            others_left=others_left,
        )
        with contextlib.suppress(JournalError):
            ledger.record_closeout(journal, outcome)
        self.client.close()
        self._notify()
        return outcome

    def _close_adopted(self) -> None:
        """Close the sync journals taken over, each marked closed out once
        this process closed the run: theirs is this run, closed once. Left
        unmarked, a later ``replay --all`` took each for a crashed run still
        to close, said it closed it as crashed, and ``ls`` said so too."""
        closed = self.journal.get_meta("finalized") if self.lifecycle.finalized else None
        for old, shippers in self.adopted:
            if isinstance(closed, dict) and not old.get_meta("finalized"):
                with contextlib.suppress(JournalError):
                    old.set_meta("finalized", {**closed, "by": self.journal.local_id})
            # What it leaves now, for its record (one a replay left records
            # in named them): deleted by hand later, it is not said to have
            # left records this take-over shipped.
            with contextlib.suppress(JournalError, OSError):
                handover.remember_left(old, {s.name: s.pending_records() for s in shippers})
            old.close()

    def _wait_for_others(self, run_id: str, deadline: float, *, crashed: bool) -> dict[str, str]:
        """Before the primary closes the run: wait for the run's other
        processes on this host to be done (``ranks.wait_for_others``), its
        own forked children too when its producer ``crashed``; what they
        left behind, per journal."""
        try:
            others = ranks.others_of(self.journal, run_id, own_children=crashed)
        except (JournalError, OSError) as exc:
            log.info("prime-runs: could not look for the run's other processes: %s", exc)
            return {}
        if not others:
            return {}
        log.info("prime-runs: waiting for %d other process(es) of run %s", len(others), run_id)
        return ranks.wait_for_others(others, deadline=deadline, stall_s=self.policy.stall_s)

    def _report_left_behind(self, shippers: Sequence[Shipper]) -> None:
        """Say why a sink leaves records behind (its last failure, or its
        pause), in ``run.errors``, not only how many: a closing sink retries
        rather than striking out, so nothing else recorded the failure."""
        for shipper in shippers:
            st = shipper.state
            if st.off_reason is not None or st.retired_reason is not None:
                continue  # its failure was recorded when it stopped
            if st.last_error is None and st.paused_until <= time.monotonic():
                continue
            if shipper.pending_records() == 0:
                continue
            why = st.last_error or "paused after failed batches in a row"
            self._on_failure(
                shipper.name, PrimeRunsError(f"records left unshipped at the close-out: {why}")
            )

    def pending(self) -> dict[str, int]:
        """Per sink still on, how many records it has not shipped."""
        out: dict[str, int] = {}
        for shipper in self.shippers:
            if shipper.state.off_reason is None:
                left = shipper.pending_records()
                if left:
                    out[shipper.name] = left
        return out


def _ranges_of(journal: Journal, far: bool, *, attached: bool = False) -> Block:
    """Where this journal's training sample ids start, in range indexes
    (``sinks.step_ranges``). A requeued job (by id, or one attempt of a run
    key) may log a step its predecessor logged too, and a forked child the
    steps its parent logs: ``far`` draws ranges far from the ones they use.
    Ranks of one run log the same steps at once: rank N takes its own block
    of ``_RANK_BLOCK`` ranges per step, past which it goes on far at random
    (never into rank N+1's), and a process that is not the primary and has
    no rank draws at random; so does rank 0 where it is not the primary (its
    run's creator is, on its host: ``ranks.resolve_role``), whose numbering
    from 0 is in rank 0's block. A primary without a rank that ``attached``
    to a run by id is not its creator, which numbered from 0: it draws far
    too, its predecessors' journals found or not (another node's runs
    directory, or deleted by ``gc``)."""
    with importing():  # lazily, as the sinks are (``factory.make_shippers``)
        from ..sinks.step_ranges import Block

    if far:
        return Block(_far())
    role = ranks.Role.of(journal)
    if role is None:
        return Block(_far()) if attached else Block()
    if role.rank == 0 and not role.primary:
        return Block(_far())  # the primary numbers in rank 0's block (below)
    if role.rank is not None and role.rank < (1 << 20) // _RANK_BLOCK:
        start = role.rank * _RANK_BLOCK
        return Block(start, start + _RANK_BLOCK, _far())
    # A primary without a rank numbers from 0, where rank 0's block is.
    return Block(0, _RANK_BLOCK, _far()) if role.primary and not attached else Block(_far())


def _far() -> int:
    """A range index far from every rank's block, at random."""
    return random.randrange(1 << 20, 1 << 21)


def _drain_while_moving(
    shippers: Sequence[Shipper],
    target: int,
    deadline: float,
    progress: Callable[[Progress], None] | None,
) -> tuple[bool, float | None]:
    """``drain_all`` until ``deadline``, or until every shipper still owing
    entries is stuck (``Shipper.stuck_for``): (whether all drained, seconds
    stalled when it gave up)."""
    tick = 0.25 if progress is not None else 1.0
    while True:
        now = time.monotonic()
        done = drain_all(shippers, target, min(deadline, now + tick))
        if progress is not None:
            progress(
                Progress(
                    records=sum(s.state.records_sent for s in shippers),
                    bytes=sum(s.state.bytes_sent for s in shippers),
                    sent={s.name: s.state.records_sent for s in shippers},
                    stopped={
                        s.name: str(s.state.off_reason or s.state.retired_reason)
                        for s in shippers
                        if s.state.off_reason or s.state.retired_reason
                    },
                )
            )
        if done:
            return True, None
        waiting = [s for s in shippers if not s.settled(target)]
        if not waiting:
            return False, None  # retired or paused: nothing more will happen by waiting
        now = time.monotonic()
        if now >= deadline:
            return False, None
        stuck = [s.stuck_for(now) for s in waiting]
        if all(idle is not None for idle in stuck):
            idle = min(i for i in stuck if i is not None)
            log.info("prime-runs: nothing shipped for %.0f s; not waiting any longer", idle)
            return False, idle
