"""A forked child's records: a journal of its own, attached to its parent's run.

A child of ``fork`` (``os.fork()``, multiprocessing's fork start) inherits its
parent's run handle but may not write the parent's journal: one writer per
journal, and an LMDB environment must never be used across fork (see
``journal.store``). So on its first record the child opens a journal of its
own in the same runs dir, attached to the parent's platform run, and ships it
with an uplink of its own (a process, so what the child journaled is shipped
even when the child ends with ``os._exit`` or is killed).

The child's journal names its parent (``K_FORK_PARENT`` in its meta): its
close-out never closes the platform run (the parent owns it, see
``ship.lifecycle``), its training samples draw ``sample_id`` ranges far from
the parent's, and the parent's ``finish()`` waits for a child that has exited
to be shipped before it closes the run (``wait_children``). Its name
never says it was made before its parent's, whatever the wall clock did
since (``journal.default_local_id``): the parent looks for its children
among the journals made since its own.

What is guaranteed: every record a child's ``log_*`` call returned for is in
the child's journal (durably as the parent's). A child that exits through
the interpreter's exit or multiprocessing's process exit (its finalizers)
ships its records before it exits, within the run's ``finish_timeout``; one
that ends otherwise (SIGTERM from ``Pool.terminate``, ``os._exit``, SIGKILL)
is shipped by its uplink process, which the parent's ``finish()`` waits for.
A child still alive when the parent finishes is waited for up to the end its
journal had then (what its calls had returned for), within the finish's
budget and while its shipping moves (the stall rule); what it logs later,
and what was not shipped in time, its uplink ships into the run after the
parent closed it, and the parent's warning says so, per child. A child forked
before the parent's run was registered, or from an offline run, keeps its
records all the same: its journal finds the parent's run when it ships
(``ship.family``): its uplink once the live parent registered the run, or
``primeruns sync``/``replay`` of the parent, which ship its children after it.
A child's ``update_summary`` stays in its journal (the parent's
summary is the run's), and with ``PRIME_RUNS_UPLINK=threads`` a child ended
by ``os._exit`` is shipped only by ``primeruns replay`` of its journal.
"""

from __future__ import annotations

import contextlib

# Imported with the parent's run, not on a child's first record: a thread of
# the parent importing it at the fork leaves its import lock held in the
# child, for good (its first record hung).
import multiprocessing.util
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from primeruns.logs import get_logger

from . import hooks, records, run_index
from .exceptions import JournalError
from .journal import EntryKind, Journal, delete_journal
from .journal.lock import OwnerInfo, owner_alive, read_owner
from .models import Mode, OnError, RunKind, RunStatus
from .platform import Settings
from .recorder import Recorder
from .run import Run
from .settings import SdkSettings
from .ship import ledger
from .ship.factory import sink_kinds
from .ship.family import K_FORK_PARENT, K_FORK_PARENT_PATH
from .ship.family import made_since as _made_since
from .ship.standby import pause
from .spec import SPEC_KEY, RunSpec
from .supervisor import go_online

__all__ = ["K_FORK_PARENT", "ForkOrigin", "open_child", "wait_children"]

log = get_logger("primeruns")

# The parent's finish() looks at its exited children this often while their
# uplinks ship (a wait on other processes' files: there is nothing to wake it).
_POLL_S = 0.05
# Before multiprocessing's other finalizers (its queues' feeder threads).
_EXIT_PRIORITY = 100
# How long a child's exit (or SIGTERM) waits for its records to ship, at most
# (and never past the run's finish_timeout): as long as the parent's exit.
_EXIT_GRACE = 30.0


# Serializes the opening of a child's journal; new in each child, since a
# thread of the parent may have held it at the fork.
_opening = threading.Lock()


def _after_fork_in_child() -> None:
    """Run by ``hooks``' after-fork handler (it keeps its place among the user's)."""
    global _opening
    _opening = threading.Lock()


@dataclass
class ForkOrigin:
    """What a forked child needs of its parent's run to open its own journal,
    captured by ``init()`` in the parent (the child cannot read the parent's
    journal). ``run_id`` is the platform run, noted before each fork."""

    spec: RunSpec
    settings: Settings
    tuning: SdkSettings
    durability: Any
    kind: RunKind
    on_error: OnError
    finish_timeout: float
    parent_id: str
    parent_path: str
    mode: Mode = "online"
    run_id: str | None = None
    forked: bool = False  # the parent forked since: its finish() looks for children
    # The parent's journal is in its memory (no folder took it, ``refuge``):
    # so is a child's, shipped by the child's threads before it exits.
    in_memory: bool = False
    _child: Run | None = field(default=None, repr=False)
    _child_pid: int | None = None  # the process _child belongs to
    _failed: bool = False

    def noted(self, run_id: str | None) -> None:
        """In the parent, about to fork: the platform run the child attaches to."""
        self.forked = True
        if run_id is not None:
            self.run_id = run_id

    def opened(self) -> Run | None:
        """This process's child run, if it opened one (never the parent's)."""
        return self._child if self._child_pid == os.getpid() else None

    def child_run(self) -> Run | None:
        """This child's run (opened on its first record), or None when there
        is no platform run to attach to or it could not be opened."""
        if self._child_pid == os.getpid() and (self._child is not None or self._failed):
            return self._child  # the common case: no lock
        with _opening:  # two threads of the child logging at once open one journal
            if self._child_pid != os.getpid():  # a new child (of the parent or of a child)
                self._child, self._child_pid, self._failed = None, os.getpid(), False
            if self._child is None and not self._failed:
                self._child = self._open_once()
            return self._child

    def _open_once(self) -> Run | None:
        self._failed = True  # one attempt: a failure is said once, not per call
        try:
            child = open_child(self)
        except Exception as exc:  # never into the child's loop
            log.warning("prime-runs: a forked child could not open its journal: %s", exc)
            return None
        self._failed = False
        return child

    def wait_children(self, own: Path, budget: float) -> None:
        """In the parent's finish(): wait up to ``budget`` seconds for what
        its children journaled to be shipped (``wait_children``), and say
        what was left."""
        if not self.forked or self.mode != "online" or self.in_memory:
            # Offline, nothing ships now: primeruns sync ships the children.
            # In memory, nothing of theirs can be seen from here: each ships
            # its own as it exits.
            return
        deadline = time.monotonic() + budget
        left = wait_children(
            own.parent, self.parent_id, own, deadline, self.kind, self.tuning.stall_s
        )
        if left:
            log.warning(
                "prime-runs: finishing run %s with records of its forked children not "
                "shipped yet: %s",
                self.run_id or self.parent_id,
                "; ".join(left),
            )


class ChildRun(Run):
    """A forked child's run: at exit it ships its records and leaves the
    platform run open (the parent closes it)."""

    def _at_exit(self, deadline: float) -> None:
        if self.finished or not self._recorder.owner_process():
            return
        wait = max(0.0, min(self._finish_timeout, deadline - time.monotonic()))
        try:
            self._finish_once(None, RunStatus.COMPLETED, None, None, wait=wait)
        except Exception as exc:
            log.warning("prime-runs: shipping a forked child's records at exit failed: %s", exc)

    def _on_sigterm(self) -> None:
        # Nothing to do in the signal handler: every record whose call
        # returned is in the child's journal, and its uplink process ships it
        # once the child is gone (the parent's finish() waits for that).
        # Shipping from the handler, inside a pool worker interrupted anywhere,
        # once held Pool.terminate() past a 300 s test timeout.
        return


def _exit_now(run: Run) -> None:
    run._at_exit(time.monotonic() + _EXIT_GRACE)


def open_child(origin: ForkOrigin) -> Run:
    # Without the run's id (forked before it was registered, or offline) the
    # run is found when the journal ships (ship.family).
    spec = replace(origin.spec, attach_id=origin.run_id, run_key=None)
    stored = spec.to_json()
    meta = {
        SPEC_KEY: stored,
        "state": "running",
        K_FORK_PARENT: origin.parent_id,
        K_FORK_PARENT_PATH: origin.parent_path,
    }
    if origin.in_memory:
        journal = _memory_journal(origin, meta)
    else:
        journal = Journal.create(
            origin.tuning.runs_dir,
            durability=origin.durability,
            max_bytes=origin.tuning.max_journal_bytes,
            meta=meta,
        )
        run_index.enter(journal.path, origin.run_id)
    journal.append(EntryKind.RUN_OPEN, [records.encode_record(stored, what="spec")], essential=True)
    recorder = Recorder(journal, kind=origin.kind, on_error=origin.on_error)
    supervisor = None
    if origin.mode == "online":
        try:
            supervisor, _ = go_online(
                journal, origin.settings, origin.kind, recorder.note, origin.tuning, siblings=False
            )
        except BaseException:
            journal.close()
            if not origin.in_memory:
                delete_journal(journal.path)  # nothing in it yet: leave no crashed run behind
            raise
    run = ChildRun(
        recorder,
        supervisor=supervisor,
        mode=origin.mode,
        name=spec.name,
        config={},
        finish_timeout=origin.finish_timeout,
        attached=True,
        local_id=journal.local_id,
        fork=_of_its_own(origin, journal),
    )
    hooks.register(run)
    # multiprocessing's children end with os._exit, past atexit: its own
    # finalizers are what runs at their exit.
    multiprocessing.util.Finalize(None, _exit_now, args=(run,), exitpriority=_EXIT_PRIORITY)
    return run


def _memory_journal(origin: ForkOrigin, meta: dict[str, Any]) -> Journal:
    """A child's journal kept in its memory, as its parent's is. Only with the
    run's id: with nothing on disk, a child forked before the parent
    registered has no way to find the run (``ship.family`` reads the
    parent's journal), so its records are dropped and counted as before."""
    if origin.run_id is None:
        raise JournalError(
            "its parent keeps the run's journal in memory and had not registered the "
            "run when it forked"
        )
    # Loaded already: the parent made its own journal with it.
    from .journal.memory import MemoryJournal

    return cast(Journal, MemoryJournal(max_bytes=origin.tuning.max_journal_bytes, meta=meta))


def _of_its_own(origin: ForkOrigin, journal: Journal) -> ForkOrigin:
    """What a child of this child (or of a joined worker) needs to log into
    the run: the run's own process's, as this journal's parent. A joined
    worker's run is the only handle its children inherit (a pool of the
    worker's own): without it, they had no journal to open and dropped
    every record."""
    return replace(
        origin,
        parent_id=journal.local_id,
        parent_path="" if origin.in_memory else str(journal.path),
        forked=False,
        _child=None,
        _child_pid=None,
        _failed=False,
    )


def wait_children(
    runs_dir: Path, parent_id: str, own: Path, deadline: float, kind: RunKind, stall_s: float
) -> list[str]:
    """Wait (until ``deadline``, monotonic) for what this run's forked
    children journaled before now to be shipped by their uplinks: an exited
    child's whole journal, a live one's up to its end as this call began (what
    it logs later, its uplink ships). A child whose shipping moves nothing
    for ``stall_s`` is not waited for any longer. Returns, per child with
    records left, a sentence saying what and why (for finish()'s warning)."""
    start = time.monotonic()
    try:
        candidates = _made_since(runs_dir, own)
    except OSError as exc:
        log.warning("prime-runs: could not look for the run's forked children: %s", exc)
        return []
    children: list[_Child] = []
    for path in candidates:
        with contextlib.suppress(JournalError, OSError):  # not ours to judge here
            journal = Journal.open(path, owner=False)
            try:
                if journal.get_meta(K_FORK_PARENT) == parent_id:
                    target = journal.last_seq()
                    children.append(_Child(path, journal, sink_kinds(kind), target, start))
                    continue
            except JournalError:
                pass
            journal.close()
    try:
        while True:  # one look at least: what is left is said even with no time to wait
            now = time.monotonic()
            if all(child.settled(now, stall_s) for child in children) or now >= deadline:
                break
            pause(_POLL_S)
        return [line for child in children if (line := child.left()) is not None]
    finally:
        for child in children:
            child.close()


@dataclass
class _Child:
    """One forked child's journal, read (never written) while the parent
    waits for it; ``target``: its end when the parent's finish began."""

    path: Path
    journal: Journal
    sinks: dict[str, frozenset[EntryKind]]
    target: int
    moved_at: float
    acked: dict[str, int] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)
    why: str | None = None  # why it is no longer waited for, records left

    def settled(self, now: float, stall_s: float) -> bool:
        """Nothing more to wait for: shipped up to the target, or not moving."""
        if self.why is not None:
            return True
        try:
            self._look(now)
        except JournalError as exc:
            self.why = f"its journal cannot be read ({exc})"
            return True
        if not self.pending:
            return True
        helper = _helper_state(self.path)
        if helper == "gone":
            self.why = "it has exited and no uplink ships its journal"
        elif now - self.moved_at >= stall_s:
            self.why = f"its uplink shipped nothing for {stall_s:.0f} s"
        return self.why is not None

    def _look(self, now: float) -> None:
        journal = self.journal
        if journal.get_meta("state") == "shipped":
            self.pending = {}
            return
        acked = journal.cursors()
        if acked != self.acked:
            self.acked, self.moved_at = acked, now
        pending = {}
        settled = True
        for name, kinds in self.sinks.items():
            standing = ledger.read_standing(journal, name)
            done = acked.get(name, 0)
            if standing.off is not None or done >= self.target:
                continue
            # What is left up to the target, counted over that range alone
            # (each look, for every sink). A sink at offset 0 also counts
            # what compaction removed: compaction waits for every sink the
            # child's uplink names, so it removed those entries while this
            # sink was not named, and never shipped them.
            between = journal.tally_range(done, self.target)
            if not done:
                between.update(journal.compacted())
            left = ledger.records_left(between, kinds)
            if left:
                pending[name] = left
                settled = settled and standing.settled
        self.pending = pending
        if pending and settled:
            self.why = "its sinks are retired or paused (see primeruns show)"

    def left(self) -> str | None:
        if not self.pending:
            return None
        owner = read_owner(self.path)
        who = f"pid {owner.pid}" if owner is not None else self.path.name
        counts = ", ".join(f"{k}: {v}" for k, v in self.pending.items())
        why = self.why or "the finish timeout passed first"
        if owner is not None and _child_alive(owner):
            then = "it is still running, and ships them into the run as it goes on"
        elif _helper_state(self.path) == "alive":
            then = "its uplink goes on shipping them into the run"
        else:
            then = f"ship them with: primeruns replay {self.path}"
        return f"forked child {who}: {counts} not shipped ({why}); {then}"

    def close(self) -> None:
        self.journal.close()


def _helper_state(path: Path) -> str:
    """Whether anybody ships the child's journal: "alive" (its uplink
    process), "child" (no uplink process, but the child lives: it ships from
    threads), "gone" (neither)."""
    owner = read_owner(path)
    if owner is None:
        return "gone"
    if owner.helper_pid is not None and owner_alive(replace(owner, producer_done=True)):
        return "alive"
    return "child" if _child_alive(owner) else "gone"


def _child_alive(owner: OwnerInfo) -> bool:
    return owner_alive(replace(owner, helper_pid=None, helper_start=None))
