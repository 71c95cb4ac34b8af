"""Where a slow ``log_*`` step waits: the journal's locks, timed in the loop.

Run ``python tools/bench/lock_waits.py`` from the repository root. It runs
``uplink_loop.py``'s loop (250 steps of ~20 ms of pure-Python work, then
``log_episodes`` of 8 gsm8k episodes and one ``log_metrics`` row) online against
a local platform, in this process, with two timers patched in: the wait for
LMDB's write transaction (its cross-process writer lock) and, on the main
thread, the wait for the journal's in-process lock. It prints the step p50 and
p99 and, for the 8 slowest steps, how much of each was spent in either wait.
A diagnostic, not a benchmark: it changes what it measures a little.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import benchlib
from loop_worker import step_batches, work
from uplink_loop import WORK

from primeruns.journal import store

STEPS = 250
writer_waits: list[float] = []
lock_waits: list[float] = []


class _TimedLock:
    """The store's RLock, timing how long the main thread waits for it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> _TimedLock:
        t = time.perf_counter()
        self._lock.acquire()
        if threading.current_thread() is threading.main_thread():
            lock_waits.append(time.perf_counter() - t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return self._lock.acquire(*args, **kwargs)

    def release(self) -> None:
        self._lock.release()


def _patch() -> None:
    begin, init = store.Store._begin, store.Store.__init__

    def timed_begin(self: store.Store, write: bool, buffers: bool) -> Any:
        t = time.perf_counter()
        txn = begin(self, write, buffers)
        if write and threading.current_thread() is threading.main_thread():
            writer_waits.append(time.perf_counter() - t)
        return txn

    def timed_init(self: store.Store, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.lock = _TimedLock()  # type: ignore[assignment]

    store.Store._begin = timed_begin  # type: ignore[method-assign]
    store.Store.__init__ = timed_init  # type: ignore[method-assign]


def main() -> None:
    _patch()
    import primeruns as pr

    episodes = [json.loads(line) for line in benchlib.raw_lines("gsm8k-eval")[:400]]
    steps: list[float] = []
    waits: list[tuple[float, float]] = []
    with benchlib.isolated_env(None) as scratch, benchlib.local_platform(scratch / "p") as lp:
        os.environ["PRIME_TRACES_URL"] = lp.url
        run = pr.init(
            kind="train",
            model="m",
            team_id="team",
            api_key=benchlib.API_KEY,
            base_url=lp.url,
            runs_dir=str(scratch / "runs"),
            training=pr.TrainingSpec(max_steps=STEPS),
        )
        for step, batch in enumerate(step_batches(episodes, STEPS)):
            work(WORK)
            w0, l0, t = len(writer_waits), len(lock_waits), time.perf_counter()
            run.log_episodes(batch)
            run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
            steps.append(time.perf_counter() - t)
            waits.append((sum(writer_waits[w0:]), sum(lock_waits[l0:])))
        run.finish()
    p50, p99 = benchlib.pcts(steps)
    print(f"step p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")
    for i in sorted(range(STEPS), key=lambda i: -steps[i])[:8]:
        print(
            f"step {i}: {steps[i] * 1e3:.2f} ms; LMDB writer lock {waits[i][0] * 1e3:.2f} ms; "
            f"the journal's in-process lock {waits[i][1] * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
