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
import sys
import threading

import procs
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
        from primeruns.supervisor import Supervisor

        # Once the main thread waits in the flush's drain, a SIGTERM only flagged.
        procs.signal_once_waiting_in(Supervisor.drain.__code__)
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


if __name__ == "__main__":
    main()
