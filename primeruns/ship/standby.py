"""The uplink process of an evaluation, on standby until its run lives on.

An evaluation ships from threads in its producer first (``ship.startup``),
and most short ones are over before an uplink process would have done its
imports (~0.25 s of CPU, on a machine whose cores the producer and the
platform already use): those imports slowed the run they were for. So the
process is started as this script, run by path with ``-S`` (no site, no
package: only the standard library's built-in modules), which costs a
bare interpreter's start-up and then waits on its producer's wake pipe:

- ``WARM`` (the run lived on) or ``GO`` (hand over now), and it becomes the
  uplink process proper (``uplink_main``, which then waits for ``GO`` if it
  did not come yet);
- the pipe's end of file or its producer's death (pidfd; else its parent
  pid, looked at each second), and it becomes the uplink at once: the
  claim decides whether it ships (a dead producer's run is closed out as
  crashed, as ever).

A run finished meanwhile stops it (``UplinkProcess.claim_back``), having
loaded nothing; so does an ``init()`` that failed after starting it
(``Supervisor.abandon``). Nothing here touches the journal or the platform.
"""

from __future__ import annotations

import os
import select
import sys

# Bytes on the wake pipe besides ``ship.link``'s wake-up (b"\0"): HURRY
# (someone waits: send small batches now), GO (ship now: to an uplink
# started with --await-go, ``ship.startup``), WARM (do the imports: to one
# on standby). Defined here, where nothing of the package may be imported.
HURRY, GO, WARM = b"\1", b"\2", b"\3"
# A wake-up is passed on to the shippers no sooner than this after it was
# read: it covers the producer's appends made shortly after it (``ship.link``).
SETTLE_S = 0.005


def pause(seconds: float) -> None:
    """Sleep ``seconds``, by a poll of no descriptor rather than
    ``time.sleep``: Python's sleep waits for an absolute deadline of the
    monotonic clock (``clock_nanosleep``), which fails with EINVAL in a
    process run under a wall-clock shifter such as libfaketime (how a
    clock step is tested), and the uplink died of it; poll's timeout is
    relative. Every wait of the SDK's own that is not on an event or a
    descriptor takes it (a lifecycle call's retry: a run under such a
    shifter was left open after one 503 from its finalize)."""
    select.poll().poll(max(0.0, seconds) * 1000.0)


def wait_for_word(wake: int, producer: int, words: tuple[bytes, ...]) -> tuple[bytes | None, bool]:
    """Until one of ``words`` comes on the wake pipe (other bytes are passed
    over), the pipe's end of file or the producer's death: (the word, the
    first of ``words`` in the read that has several; None for the other
    two, whether a ``HURRY`` came after it in the same read). Also the
    uplink's own wait for go (``link.await_go``): one watch of the producer.

    The producer's death is told by its pidfd, else by the parent pid
    changing (looked at each second), and the parent pid only where the
    producer is this process's parent (checked after the pidfd is open: it
    is then the producer's). A stand-in for the interpreter that runs this
    as a child sits between: its pidfd tells then (none: taken for dead).
    """
    pidfd = None
    try:  # noqa: SIM105 (contextlib is one more import, on every run's path)
        pidfd = os.pidfd_open(producer)
    except (OSError, AttributeError):
        pass
    try:
        poller = select.poll()
        poller.register(wake, select.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        tick = None if pidfd is not None else 1000
        direct = os.getppid() == producer
        while os.getppid() == producer if direct else pidfd is not None:
            try:
                ready = {fd for fd, _ in poller.poll(tick)}
            except (OSError, ValueError):
                ready, tick = set(), 1000  # (not expected) the parent pid still tells
            if pidfd is not None and pidfd in ready:
                break
            if wake not in ready:
                continue
            try:
                data = os.read(wake, 4096)
            except BlockingIOError:
                continue
            except OSError:
                poller.unregister(wake)  # (not expected) its death still tells
                tick = 1000
                continue
            if not data:
                break
            for word in words:
                if word in data:
                    # Wake-ups read with it are passed on by the shippers'
                    # first read: no sooner than SETTLE_S after this read.
                    pause(SETTLE_S)
                    return word, HURRY in data[data.index(word) :]
        return None, False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def wait(argv: list[str]) -> list[str]:
    """Wait as the module doc says; the arguments for ``uplink_main``
    (``--await-go`` left out once there is nothing to wait for, ``--hurry``
    added when a hurry came with the go)."""
    wake = int(argv[argv.index("--wake-fd") + 1])
    producer = int(argv[argv.index("--producer") + 1])
    word, hurry = wait_for_word(wake, producer, (GO, WARM))
    if word != WARM:
        argv = [a for a in argv if a != "--await-go"]
    return [*argv, "--hurry"] if word == GO and hurry else argv


if __name__ == "__main__":
    args = wait(sys.argv[1:])
    import runpy
    import site

    site.main()  # the site-packages (the package's dependencies), as without -S
    sys.argv = ["primeruns-uplink", *args]
    runpy.run_module("primeruns.ship.uplink_main", run_name="__main__", alter_sys=True)
