"""A producer that ends in a chosen way, for tests of run endings.

Usage: python endings_script.py RUNS_DIR BASE_URL HOW
HOW: exit (returns without finish: atexit closes the run as crashed),
     exit_quick (prints "ready", returns without finish after a line on stdin, with
     the exit grace cut to 1 s: for a platform that is down by then),
     sigterm (prints "ready" and waits to be terminated),
     fork (a forked child logs to the parent's run, then the parent finishes),
     flush_stalled (after a line on stdin, logs the rest and flushes while a
     thread of its own takes a SIGTERM: CPython only flags it for the main
     thread, as it does one landing on a wait's way in).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import workloads

import primeruns as pr


def main() -> None:
    runs_dir, base_url, how = sys.argv[1], sys.argv[2], sys.argv[3]
    run = pr.init(
        environments=["gsm8k"],
        model="m",
        api_key="test-key-0123456789",
        base_url=base_url,
        runs_dir=runs_dir,
        # A stalled platform's close-out waits all of it (and a grace).
        **({"finish_timeout": 2.0} if how == "flush_stalled" else {}),
    )
    episodes = workloads.gsm8k(6)
    run.log_episodes(episodes[:3])
    print(f"run {run.id}", flush=True)
    if how == "exit":
        return
    if how == "exit_quick":
        import primeruns.hooks

        primeruns.hooks._EXIT_GRACE = 1.0  # the mechanism under test, at a test's scale
        print("ready", flush=True)
        sys.stdin.readline()
        return
    if how == "sigterm":
        print("ready", flush=True)
        threading.Event().wait(120)
        return
    if how == "flush_stalled":
        print(f"journal {run.journal_path}", flush=True)
        print("ready", flush=True)
        sys.stdin.readline()
        run.log_episodes(episodes[3:])
        threading.Thread(target=_signal_in_drain, daemon=True).start()
        run.flush(timeout=110)
        print("flush returned", flush=True)
        return
    if how == "fork":
        pid = os.fork()
        if pid == 0:
            run.log_episodes(episodes[3:])  # into a journal of its own: never the parent's
            print(f"child dropped {run.dropped_records}", flush=True)
            run.finish()  # ships the child's records; a child never closes the parent's run
            os._exit(0)
        os.waitpid(pid, 0)
        run.finish(timeout=60)
        print(f"parent {run.status.value}", flush=True)


def _signal_in_drain() -> None:
    """Once the main thread waits in the flush's drain (and a moment more, so
    that a wait taken whole is inside its system call), take a SIGTERM in
    this thread, which does not block it: its handler is only flagged."""
    from primeruns.supervisor import Supervisor

    main = threading.main_thread().ident
    assert main is not None

    def in_drain() -> bool:
        frame = sys._current_frames().get(main)
        while frame is not None:
            if frame.f_code is Supervisor.drain.__code__:
                return True
            frame = frame.f_back
        return False

    while not in_drain():
        time.sleep(0.01)
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)


if __name__ == "__main__":
    main()
