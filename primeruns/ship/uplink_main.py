"""The uplink process of a live run: ``python -m primeruns.ship.uplink_main``.

Started by ``init()`` (``ship.link.UplinkProcess``), never by hand. Its
standard input carries the settings (the API key among them: never on a
command line, where other users can read it), the SDK's tuning the producer
resolved (retry policy, network filesystems: its environment has no
``PRIME_*`` variable to read) and the journals of earlier processes of the
same run; its arguments carry only paths and descriptor numbers. It ships
the run until the producer finishes or dies, closes the run out, and exits;
unless the producer claimed the shipping back before this process got to
it (``ship.link``: a run that finished while this one was starting), in
which case it exits at once, having touched nothing.

Its log lines go to ``uplink.log`` in the run's directory from the start
(``UplinkProcess`` opens it as this process's standard error; standard output
is /dev/null): it never holds the producer's stdout or stderr, so a pipeline
the producer wrote into (``python train.py | tee log``) or a caller reading
its pipes ends with the producer instead of waiting for the uplink's
close-out. Once the producer is gone the log is opened again at the
journal's path (the run's directory may have been re-created meanwhile).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from . import lean

if __name__ == "__main__":
    # The uplink process itself (not a test importing this module), before
    # anything that could load httpx (a presigned upload, a call that
    # failed): see ``lean``.
    lean.mark_absent()

from ..journal import Journal
from ..settings import SdkSettings, adopt_settings
from . import resident
from .link import (
    PipeProducerLink,
    await_go,
    open_uplink_log,
    settings_from_handover,
    take_claim,
)
from .policy import RetryPolicy
from .uplink import Uplink


def _log_to_file(journal_path: Path) -> None:
    """Point this process's standard error at the uplink's log beside the
    journal, letting go of the producer's (to nowhere where that log cannot
    be opened as a file of our own)."""
    fd = open_uplink_log(journal_path)
    if fd == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.dup2(fd, 2)
    os.close(fd)


def _collect_less() -> None:
    """Spare shipping most of the cyclic garbage collector's passes.

    A batch builds hundreds of containers per episode (its record parsed,
    stamped, projected), alive together until the batch is sent, then freed
    by reference counting: none is part of a cycle. Yet every 700 of them
    started a collection, which walked them again as they aged, and the
    imports' objects with them: 6% of the uplink's CPU in a fast evaluation
    (0.31 s of 5.2 s for 5,000 episodes; 0.09 s with this). What exists once
    the uplink is set up lives as long as the process, so it is frozen out
    of every collection, and collections come 100 times less often (a cycle,
    rare here, is freed a little later). Here only: this process runs no
    user code.
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(70_000, older, oldest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="primeruns-uplink")
    parser.add_argument("--journal", required=True, type=Path)
    parser.add_argument("--producer", required=True, type=int)
    parser.add_argument("--wake-fd", required=True, type=int)
    parser.add_argument("--progress-fd", required=True, type=int)
    parser.add_argument("--lock-fd", required=True, type=int)
    parser.add_argument("--claim-fd", type=int, default=None)
    parser.add_argument("--await-go", action="store_true")
    parser.add_argument("--hurry", action="store_true")  # came with the go (``ship.standby``)
    args = parser.parse_args(argv)
    # Its producer may ship from threads until this process is ready
    # (``ship.startup``): it then says when to go on.
    hurried = args.hurry or (
        args.await_go and await_go(args.wake_fd, args.progress_fd, args.producer)
    )
    # First of all: nothing is touched before it is known that this
    # process ships, not its producer.
    if not take_claim(args.claim_fd):
        return 0
    # A hangup or an interrupt meant for the terminal's job is the
    # producer's to handle; the uplink stops when its work is done.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    resident.enable()  # a long run's batches must not pile up in the allocator
    handover = json.loads(sys.stdin.buffer.read() or b"{}")
    settings = settings_from_handover(handover["settings"])
    tuning = SdkSettings.from_handover(handover["sdk"])
    adopt_settings(tuning)  # for what reads settings without being handed them
    predecessors = [Path(p) for p in handover.get("predecessors") or []]
    journal = Journal.open(args.journal, lock_fd=args.lock_fd)
    try:
        journal.take_over_moving()  # the producer handed that over: it only appends
        link = PipeProducerLink(
            journal,
            args.wake_fd,
            args.progress_fd,
            args.producer,
            on_gone=lambda: _log_to_file(args.journal),
            every_s=tuning.linger_s,
        )
        uplink = Uplink(
            journal, settings, policy=RetryPolicy.from_settings(tuning), notify=link.notify
        )
        link.on_hurry = uplink.hurry
        if hurried:
            uplink.hurry()  # a flush() waits (the go carried it)
        _collect_less()
        uplink.serve(link, predecessors)
    finally:
        journal.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
