"""Backlog: the platform is down while 20,000 episodes are logged.

Run ``python tools/bench/backlog.py`` (``--quick``: 2,000 episodes) from the
repository root. An online eval run is opened against a closed loopback port
(the platform is down from the start, so nothing ships and every record stays
in the journal), then the 2,000 gsm8k episodes are logged over and over with
fresh episode ids, one ``log_episodes([episode])`` call each. Reported:

- RSS growth: the peak RSS (VmHWM, reset just before the loop) minus the RSS
  before it, in this process, where the records themselves were already
  loaded (budget ≤ 64 MB: the backlog lives on disk, not in RAM);
- journal bytes on disk per raw JSON byte of what was logged (budget ≤ 0.25);
- the worst ``log_episodes`` call while the platform was down (DESIGN §7: it
  never waits on the network; < 10 ms), with the calls' p99 and p99.9 (one
  worst is noisy on a shared host: the percentiles move less from run to
  run), and the worst once the time each call
  spent runnable, waiting for a CPU, is taken out (Linux's schedstat; on a
  host with steal time or other work, the first is often the host's), with
  that call's own CPU time (a call that neither waited for a CPU nor ran
  waited on something else: a lock, the disk, or a virtual machine's CPU
  taken by its host, steal time, which neither figure sees).
- the calls over 5 ms, each put down to what took most of it: its wait
  for a CPU, an ``fdatasync`` on the loop's own thread, a garbage
  collection, the spool switch's wait for the sync of the full segment
  (``SegmentSyncer.await_sync``), or none of these (a lock, the disk under
  a write, steal time); with the count of ``fdatasync`` calls the loop's
  thread made inside ``log_episodes`` calls.

``replay.py`` reuses :func:`make_backlog` and then ships the journal.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import benchlib
import orjson
from benchlib import API_KEY, Table

import primeruns as pr
from primeruns.journal.lock import lock_held
from primeruns.journal.spoolsync import SegmentSyncer

_RSS_BUDGET_MB = 64.0
_DISK_BUDGET = 0.25
_SLOW_NS = 5_000_000  # a call over this is put down to a cause


@dataclass(frozen=True)
class Backlog:
    journal: Path
    port: int
    episodes: int
    raw_bytes: int
    journal_bytes: int
    rss_growth_kb: int
    worst_call_ms: float
    #: the log_episodes calls' 99th and 99.9th percentiles
    p99_ms: float
    p999_ms: float
    #: the worst call less its wait for a CPU, and that call's own CPU time
    worst_unwaited_ms: float
    worst_unwaited_cpu_ms: float
    log_s: float
    #: the calls over 5 ms by cause (``_Causes``), and the loop's own syncs
    slow: dict[str, int]
    worst_cause: str
    inline_syncs: int


class _CpuWait:
    """Nanoseconds this thread has spent runnable, waiting for a CPU (the
    second field of ``/proc/thread-self/schedstat``, read again with one
    ``pread`` per call); 0 where the system does not tell."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def ns(self) -> int:
        if self._fd is None:
            return 0
        return int(os.pread(self._fd, 128, 0).split()[1])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


class _Causes:
    """Nanoseconds the loop's thread spent, inside the ``log_episodes`` call
    being timed, in ``fdatasync``, in garbage collections, and in the spool
    switch's wait for a sync; each read by wrapping what makes it, which
    costs a call that makes none nothing."""

    def __init__(self) -> None:
        self.loop = threading.get_ident()
        self.timing = False
        self.sync_ns = self.gc_ns = self.switch_ns = 0
        self.syncs = 0
        self._gc_start = 0

    def start(self) -> None:
        self.sync_ns = self.gc_ns = self.switch_ns = 0
        self.timing = True

    def stop(self) -> None:
        self.timing = False

    def cause(self, took: int, waited: int) -> str:
        """What took most of a call: the largest share, if it is one."""
        shares = {
            "waiting for a CPU": waited,
            "an fdatasync on the loop's thread": self.sync_ns,
            "a garbage collection": self.gc_ns,
            "the switch's wait for the spool's sync": self.switch_ns,
        }
        name, ns = max(shares.items(), key=lambda item: item[1])
        return name if ns * 2 >= took else "none of these (a lock, the disk, steal)"

    def _timed(self, real: Callable[..., Any], field: str) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            if not self.timing or threading.get_ident() != self.loop:
                return real(*args)
            t0 = time.perf_counter_ns()
            try:
                return real(*args)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter_ns() - t0)
                if field == "sync_ns":
                    self.syncs += 1

        return timed

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        if not self.timing or threading.get_ident() != self.loop:
            return
        if phase == "start":
            self._gc_start = time.perf_counter_ns()
        else:
            self.gc_ns += time.perf_counter_ns() - self._gc_start

    @contextmanager
    def watching(self) -> Iterator[_Causes]:
        fdatasync, await_sync = os.fdatasync, SegmentSyncer.await_sync
        os.fdatasync = self._timed(fdatasync, "sync_ns")
        SegmentSyncer.await_sync = self._timed(await_sync, "switch_ns")  # type: ignore[method-assign]
        gc.callbacks.append(self._collected)
        try:
            yield self
        finally:
            os.fdatasync, SegmentSyncer.await_sync = fdatasync, await_sync  # type: ignore[method-assign]
            gc.callbacks.remove(self._collected)


def free_port() -> int:
    """A loopback port nothing listens on (the platform, down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_backlog(scratch: Path, n: int) -> Backlog:
    """Log ``n`` episodes online with the platform down; leave them in the journal."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    base = benchlib.records("gsm8k-eval")
    run = pr.init(
        name="bench-backlog",
        environments=["gsm8k"],
        model="Qwen/Qwen3-8B",
        framework="verifiers",
        api_key=API_KEY,
        base_url=url,
        runs_dir=scratch / "runs",
    )
    journal = run.journal_path
    assert journal is not None
    raw = 0
    took_ns: list[int] = []
    worst_unwaited, worst_unwaited_cpu = 0, 0
    waits = _CpuWait()
    slow: Counter[str] = Counter()
    worst, worst_cause = 0, "none over 5 ms"
    rss0, _ = benchlib.rss_kb()
    benchlib.reset_peak_rss()
    t0 = time.perf_counter()
    with _Causes().watching() as causes:
        for i in range(n):
            # A fresh episode each time (new episode and trace ids), same content.
            episode = benchlib.renew_ids(base[i % len(base)], f"bench-{i:08d}")
            w0, u0 = waits.ns(), time.thread_time_ns()
            causes.start()
            c0 = time.perf_counter_ns()
            run.log_episodes([episode])
            took = time.perf_counter_ns() - c0
            causes.stop()
            own, waited = time.thread_time_ns() - u0, waits.ns() - w0
            took_ns.append(took)
            if took - waited > worst_unwaited:
                worst_unwaited, worst_unwaited_cpu = took - waited, own
            if took > _SLOW_NS:
                slow[causes.cause(took, waited)] += 1
                if took > worst:
                    worst, worst_cause = took, causes.cause(took, waited)
            raw += len(orjson.dumps(episode))
    log_s = time.perf_counter() - t0
    took_ns.sort()
    waits.close()
    _, peak = benchlib.rss_kb()
    # Let the journal's background thread have its say (sync, dictionary), as it
    # would in a run that goes on.
    time.sleep(1.2)
    size = sum(p.stat().st_size for p in journal.iterdir() if p.name == "data.mdb")
    run.finish(timeout=1.0)  # the platform is still down: everything stays journaled
    # finish() returned, but the run's uplink process may stay a few seconds
    # (its close-out grace) holding the journal's owner lock: a replay started
    # now is refused (JournalLockedError), so wait for it to go.
    gone_by = time.monotonic() + 120
    while lock_held(journal) and time.monotonic() < gone_by:
        time.sleep(0.1)
    if run.dropped_records:
        raise RuntimeError(f"the journal dropped {run.dropped_records} records")
    return Backlog(
        journal,
        port,
        n,
        raw,
        size,
        peak - rss0,
        took_ns[-1] / 1e6,
        took_ns[min(n - 1, n * 99 // 100)] / 1e6,
        took_ns[min(n - 1, n * 999 // 1000)] / 1e6,
        worst_unwaited / 1e6,
        worst_unwaited_cpu / 1e6,
        log_s,
        dict(slow),
        worst_cause,
        causes.syncs,
    )


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    n = 2000 if quick else 20_000
    with benchlib.isolated_env(None) as scratch:
        result = make_backlog(scratch, n)
    return [table(result)]


def table(b: Backlog) -> Table:
    growth_mb = b.rss_growth_kb / 1024
    ratio = b.journal_bytes / b.raw_bytes
    t = Table(
        f"Backlog: {b.episodes:,} gsm8k episodes logged with the platform down",
        ["measure", "value", "budget", "absolute"],
    )
    t.add(
        "peak RSS growth",
        f"{growth_mb:.1f} MB",
        benchlib.verdict(growth_mb, _RSS_BUDGET_MB),
        f"{b.raw_bytes / 1e6:.0f} MB of JSON logged",
    )
    t.add(
        "journal bytes ÷ raw JSON bytes",
        f"{ratio:.3f}",
        benchlib.verdict(ratio, _DISK_BUDGET),
        f"{b.journal_bytes / 1e6:.1f} MB on disk",
    )
    t.add(
        "worst log_episodes call",
        f"{b.worst_call_ms:.1f} ms",
        benchlib.verdict(b.worst_call_ms, 10.0),
        f"{b.episodes / b.log_s:.0f} episodes/s logged; most of it: {b.worst_cause}",
    )
    t.add(
        "log_episodes call p99 / p99.9",
        f"{b.p99_ms:.2f} / {b.p999_ms:.2f} ms",
        "-",
        f"of {b.episodes:,} calls",
    )
    t.add(
        "worst log_episodes call, less its wait for a CPU",
        f"{b.worst_unwaited_ms:.1f} ms",
        benchlib.verdict(b.worst_unwaited_ms, 10.0),
        f"its own CPU {b.worst_unwaited_cpu_ms:.1f} ms",
    )
    t.add(
        "log_episodes calls over 5 ms, by cause",
        str(sum(b.slow.values())),
        "-",
        "; ".join(f"{cause}: {k}" for cause, k in sorted(b.slow.items())) or "none",
    )
    t.add(
        "fdatasync calls on the loop's thread",
        str(b.inline_syncs),
        "-",
        "inside log_episodes calls",
    )
    t.notes.append("RSS: VmHWM after the loop minus VmRSS before it (records preloaded); one run")
    return t


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
