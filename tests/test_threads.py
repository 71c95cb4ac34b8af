"""The SDK's background threads keep the process's signals off themselves, so
a SIGTERM reaches the main thread even while it blocks in a wait."""

from __future__ import annotations

import signal
import threading

from primeruns.threads import start_daemon


def test_a_started_thread_blocks_the_users_signals_and_the_caller_keeps_its_mask() -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    seen: list[set[signal.Signals]] = []
    done = threading.Event()

    def body() -> None:
        seen.append(signal.pthread_sigmask(signal.SIG_BLOCK, set()))
        done.set()

    start_daemon(body, "test-mask").join(timeout=10)
    assert done.is_set()
    assert {signal.SIGTERM, signal.SIGINT} <= seen[0]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
