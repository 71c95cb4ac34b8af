"""flush() on a full disk: a record held for it, logged before the call, is
shipped when the flush returns True, whenever the overflow's thread stores it.

The overflow's thread stores a held append (under the appender's lock), then
tells the run its seq (``Recorder.held_stored``: the flush's targets, the
uplink's wake-up) outside that lock. A flush called between the two found
nothing held and targets without that record, and returned True before it
was shipped.
"""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import module_platform
import pytest
import workloads
from sdk_helpers import API_KEY, platform_episode_ids, point_at

import primeruns as pr
from primeruns.exceptions import JournalFullError
from primeruns.journal.overflow import Overflow
from primeruns.journal.spool import SpoolWriter
from primeruns.recorder import Recorder

_server, local_platform = module_platform.fixtures()

_WAIT_S = 60.0  # a bound on a wait for another thread, never a pace


def test_a_flush_while_a_held_record_is_told_waits_for_its_shipping(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")
    full = threading.Event()
    write = SpoolWriter.write

    def refused(writer: SpoolWriter, first_seq: int, frames: list[bytes]) -> None:
        if full.is_set():
            raise JournalFullError(f"no space left on device ({errno.ENOSPC})")
        write(writer, first_seq, frames)

    monkeypatch.setattr(SpoolWriter, "write", refused)
    # The overflow's thread, once it stored the held record, tells the run
    # only when let: a flush comes in between.
    telling, let_tell = threading.Event(), threading.Event()
    held_stored = Recorder.held_stored

    def told(recorder: Recorder, kind: int, last: int) -> None:
        telling.set()
        assert let_tell.wait(_WAIT_S)
        held_stored(recorder, kind, last)

    monkeypatch.setattr(Recorder, "held_stored", told)
    # Let the tell go on once the flush waits on the overflow, or returned.
    wait_watched = Overflow.wait_watched

    def waiting(overflow: Overflow, *args: Any) -> bool:
        let_tell.set()
        return bool(wait_watched(overflow, *args))

    monkeypatch.setattr(Overflow, "wait_watched", waiting)

    episodes = workloads.gsm8k(2)
    run = pr.init(
        environments=["gsm8k"],
        model="m",
        api_key=API_KEY,
        base_url=local_platform.url,
        runs_dir=runs,
    )
    try:
        run.log_episodes(episodes[:1])
        assert run.flush(timeout=_WAIT_S)
        full.set()
        run.log_episodes(episodes[1:])  # held in memory for the full disk
        assert run.dropped_records == 0
        full.clear()  # the overflow's thread stores it, then tells
        assert telling.wait(_WAIT_S)
        done = run.flush(timeout=_WAIT_S)
        stored = platform_episode_ids(local_platform.data_dir, run.id)
        let_tell.set()
        assert done
        assert stored == {episodes[0]["id"]: 1, episodes[1]["id"]: 1}
    finally:
        let_tell.set()
        run.finish(timeout=_WAIT_S)
