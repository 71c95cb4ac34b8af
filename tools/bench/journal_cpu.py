"""The CPU time a producer spends in its run journal, timed on the real journal.

``end_to_end.py`` weighs the journal's own cost against the same SDK without
it. It used to run a second SDK whose journal was a hand-written in-memory
copy of the journal's API; that copy had to follow every change of the API
by hand, broke the benchmark whenever it fell behind (``wait_for_append``'s
``until`` and ``append``'s ``final``, caught up in 033700b) and was a
duplicate of the journal. This module copies none of the API: it times what
the journal package offers, as it is, in a producer that ships from threads
(so all of the journal's work is in the one measured process).

:func:`install`, after ``import primeruns`` and before ``init``, wraps:

- every method of each class ``primeruns.journal`` exports that does work
  (``Journal``: append, read, cursor, set_inflight, ack, meta, tally, sync,
  create, open, close with its final drain of the spool, ...; the value types
  are left alone);
- every function of the journal that the package or the rest of the SDK has
  bound by name (``list_journals``, ``delete_journal``, ...: found by a scan
  of the loaded modules, not listed here);
- every thread the journal starts through the SDK's ``start_daemon`` (the
  mover, which compresses the spool into LMDB, and the background sync): the
  whole CPU time of such a thread is the journal's.

A timed call adds the ``time.thread_time()`` (user and system CPU of the
calling thread) spent inside it to that thread's account. A call nested in a
timed call of the same thread (``set_meta`` calling ``update_meta``, the
background sync ticking the mover) is within the outer span and not counted
again. Waiting (``wait_for_append``, the journal threads' sleeps) costs no
CPU, so it adds nothing; the SDK's work outside the journal (encoding
records, shippers, HTTP, sinks) is never inside a span.

Each span's wall time is kept too: the producer thread's is how long the
journal held the caller of ``log_*``, ``init`` and ``finish`` (its waits for
the GIL inside a journal call included). What neither sees: a journal thread
holding the GIL delays the SDK's threads outside any span, and the shippers'
journal calls delay ``finish`` only where they are its critical path; so the
CPU figure is the journal's work, not its share of wall time, and the
producer thread's wall is a lower bound of that. The wrapper's own cost (its
clock reads and a Python call, :func:`wrapper_cost`) falls partly inside the
spans: ``calls × wrapper_cost`` bounds the error.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["JournalClock", "install", "wrapper_cost"]

PACKAGE = "primeruns.journal"
PRODUCER = "producer thread"
JOURNAL_THREADS = "journal threads"
OTHERS = "other threads"


def in_journal(module_name: str | None) -> bool:
    """Whether ``module_name`` is the journal package or one of its modules."""
    name = module_name or ""
    return name == PACKAGE or name.startswith(PACKAGE + ".")


class _Account:
    """One thread's time in the journal (written by that thread only)."""

    __slots__ = ("by_call", "calls", "group", "seconds", "wall")

    def __init__(self, group: str) -> None:
        self.group = group
        self.seconds = 0.0  # thread CPU time
        self.wall = 0.0  # wall time, waits included
        self.calls = 0
        self.by_call: dict[str, list[float]] = {}  # outermost entry point -> [CPU s, calls]


class JournalClock:
    """The CPU time spent in timed calls, per thread, summed by group of threads."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._accounts: list[_Account] = []
        self._open: dict[int, float] = {}  # thread ident -> thread_time at its span's start
        self.wrapped: set[int] = set()  # id() of every wrapper made

    def _account(self, group: str | None) -> _Account:
        account: _Account | None = getattr(self._local, "account", None)
        if account is None:
            if group is None:
                main = threading.current_thread() is threading.main_thread()
                group = PRODUCER if main else OTHERS
            account = self._local.account = _Account(group)
            self._accounts.append(account)
        return account

    def timed(self, fn: Callable[..., Any], *, group: str | None = None) -> Callable[..., Any]:
        """``fn``, adding the CPU time of the calling thread spent inside it
        to that thread's account, unless the thread is in a timed call already."""

        name = getattr(fn, "__qualname__", repr(fn))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            local = self._local
            if getattr(local, "inside", False):
                return fn(*args, **kwargs)  # the outer span counts it
            account = self._account(group)
            ident = threading.get_ident()
            local.inside = True
            start = self._open[ident] = time.thread_time()
            wall = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                account.wall += time.perf_counter() - wall
                spent = time.thread_time() - start
                account.seconds += spent
                account.calls += 1
                # Which entry point the CPU went to: where to look first.
                entry = account.by_call.get(name)
                if entry is None:
                    entry = account.by_call[name] = [0.0, 0]
                entry[0] += spent
                entry[1] += 1
                del self._open[ident]
                local.inside = False

        self.wrapped.add(id(wrapper))
        return wrapper

    def report(self) -> dict[str, Any]:
        """CPU seconds in the journal by group of threads (a span still open,
        a thread still inside a wait, is read from that thread's clock), wall
        seconds of the closed spans by group, the closed spans' CPU seconds and
        calls by group and outermost entry point, the number of timed calls and
        threads, and the journal functions bound somewhere unwrapped (a way
        around the clock; it should be empty)."""
        by_group: dict[str, float] = {}
        for ident, start in list(self._open.items()):
            try:
                now = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (OSError, ProcessLookupError):
                continue  # it ended meanwhile: its account holds the span
            by_group["open spans"] = by_group.get("open spans", 0.0) + now - start
        calls = 0
        threads: dict[str, int] = {}
        wall: dict[str, float] = {}
        by_call: dict[str, list[float]] = {}
        for account in list(self._accounts):
            for name, (seconds, count) in list(account.by_call.items()):
                total = by_call.setdefault(f"{account.group}: {name}", [0.0, 0])
                total[0] += seconds
                total[1] += count
            by_group[account.group] = by_group.get(account.group, 0.0) + account.seconds
            wall[account.group] = wall.get(account.group, 0.0) + account.wall
            threads[account.group] = threads.get(account.group, 0) + 1
            calls += account.calls
        return {
            "journal_cpu_s": sum(by_group.values()),
            "journal_cpu_by": by_group,
            "journal_wall_by": wall,
            "journal_threads": threads.get(JOURNAL_THREADS, 0),
            "journal_calls": calls,
            "journal_cpu_by_call": dict(sorted(by_call.items(), key=lambda kv: -kv[1][0])),
            "unwrapped": self.unwrapped(),
        }

    def unwrapped(self) -> list[str]:
        """``module.name`` of each journal function bound outside the journal
        without a wrapper."""
        return [
            f"{name}.{attr}"
            for name, module in list(sys.modules.items())
            if name.startswith("primeruns") and not in_journal(name)
            for attr, value in list(vars(module).items())
            if inspect.isfunction(value)
            and in_journal(value.__module__)
            and id(value) not in self.wrapped
        ]


def wrapper_cost(calls: int = 20_000) -> float:
    """Seconds a timed call adds to a call of a function that does nothing."""

    def nothing() -> None:
        return None

    timed = JournalClock().timed(nothing)
    t0 = time.perf_counter()
    for _ in range(calls):
        nothing()
    t1 = time.perf_counter()
    for _ in range(calls):
        timed()
    t2 = time.perf_counter()
    return max(0.0, (t2 - t1) - (t1 - t0)) / calls


def _does_work(cls: type) -> bool:
    return not (dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum))


def _wrap_class(clock: JournalClock, cls: type) -> None:
    for name, attr in list(vars(cls).items()):
        if isinstance(attr, classmethod | staticmethod):
            setattr(cls, name, type(attr)(clock.timed(attr.__func__)))
        elif inspect.isfunction(attr) and name != "__repr__":
            setattr(cls, name, clock.timed(attr))


def _starting_timed(clock: JournalClock, start: Callable[..., Any]) -> Callable[..., Any]:
    """``start_daemon`` as the journal's modules call it: the thread's target
    runs timed from its first instruction to its last."""

    @functools.wraps(start)
    def start_timed(target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return start(clock.timed(target, group=JOURNAL_THREADS), *args, **kwargs)

    return start_timed


def install() -> JournalClock:
    """Time the journal in this process from now on (call before ``primeruns.init``)."""
    # The modules whose bindings are wrapped: the package loads its names on
    # first use, so init's modules (and the journal's) are imported here.
    import primeruns.journal
    import primeruns.opening  # noqa: F401
    from primeruns.threads import start_daemon

    package = sys.modules[PACKAGE]
    clock = JournalClock()
    # The classes that do work, wrapped in place: every importer shares them.
    for name in package.__all__:
        value = getattr(package, name)
        if inspect.isclass(value) and in_journal(value.__module__) and _does_work(value):
            _wrap_class(clock, value)
    # The threads the journal starts, through the starter its modules bound.
    starters = 0
    for name, module in list(sys.modules.items()):
        if in_journal(name) and getattr(module, "start_daemon", None) is start_daemon:
            module.start_daemon = _starting_timed(clock, start_daemon)  # type: ignore[attr-defined]
            starters += 1
    if not starters:
        raise RuntimeError("no journal module starts threads with start_daemon: time them anew")
    # The journal's functions, where the package and the rest of the SDK bound them.
    wrappers: dict[int, Callable[..., Any]] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("primeruns") or (in_journal(name) and module is not package):
            continue
        for attr, value in list(vars(module).items()):
            if inspect.isfunction(value) and in_journal(value.__module__):
                if id(value) in clock.wrapped:
                    continue
                if id(value) not in wrappers:
                    wrappers[id(value)] = clock.timed(value)
                setattr(module, attr, wrappers[id(value)])
    return clock
