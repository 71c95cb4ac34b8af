"""The journal's API as the SDK and the shippers use it."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import procs
import pytest

from primeruns.exceptions import JournalError, JournalLockedError
from primeruns.journal import (
    EntryKind,
    InFlight,
    Journal,
    default_runs_dir,
    delete_journal,
    fsinfo,
    list_journals,
)
from primeruns.journal.capacity import K_COMPACTED_KINDS
from primeruns.journal.lock import lock_held


def _rec(i: int, size: int = 20) -> bytes:
    return json.dumps({"i": i, "pad": "x" * size}).encode()


def test_append_read_dense_and_kind_filter(tmp_path: Path) -> None:
    with Journal.create(tmp_path) as j:
        assert j.append(EntryKind.METRICS, [_rec(1), _rec(2)]).first_seq == 1
        r = j.append(EntryKind.EPISODE, [_rec(3, 50_000)])
        assert (r.first_seq, r.count, r.dropped) == (3, 1, 0)
        j.append(EntryKind.METRICS, [_rec(4)])
        assert j.last_seq() == 4
        got = j.read(0, kinds=[EntryKind.METRICS])
        assert [e.seq for e in got.entries] == [1, 2, 4]
        assert got.next_after == 4 and got.damaged == []
        assert json.loads(got.entries[2].payload) == {"i": 4, "pad": "x" * 20}
        eps = j.read(0, kinds={EntryKind.EPISODE})
        assert [(e.seq, e.kind) for e in eps.entries] == [(3, EntryKind.EPISODE)]
        assert eps.next_after == 4  # passed over the metrics entry after it
        assert j.get(3) is not None and j.get(3).payload == _rec(3, 50_000)  # type: ignore[union-attr]
        assert j.get(99) is None


def test_read_limits_return_at_least_one(tmp_path: Path) -> None:
    with Journal.create(tmp_path) as j:
        j.append(EntryKind.EPISODE, [_rec(i, 1000) for i in range(10)])
        first = j.read(0, max_entries=3)
        assert [e.seq for e in first.entries] == [1, 2, 3] and first.next_after == 3
        tiny = j.read(3, max_bytes=1)
        assert [e.seq for e in tiny.entries] == [4] and tiny.next_after == 4


def test_an_inflight_body_is_compressed_where_its_start_shrinks_and_reads_back_as_sent(
    tmp_path: Path,
) -> None:
    """A sample table's JSON is stored compressed; a body that is gzip past
    its first bytes (Prime Traces') is stored as it is, zstd not run over it
    all for nothing; either way a restart reads back the exact body."""
    table = json.dumps([{"sample": i, "text": "the answer is 42"} for i in range(20_000)])
    bodies = {
        "eval_samples": table.encode(),
        "traces": b"--b\r\n{}\r\n--b\r\n" + gzip.compress(os.urandom(200_000).hex().encode()),
    }
    with Journal.create(tmp_path) as j:
        j.append(EntryKind.EPISODE, [_rec(i) for i in range(2)])
        for sink, body in bodies.items():
            frame = j.inflight_frame(body)
            assert frame[2] == (1 if sink == "eval_samples" else 0)  # FLAG_ZSTD or none
            assert len(frame) < len(body) // 4 if sink == "eval_samples" else True
            j.set_inflight(sink, InFlight(1, 2, body, {}), frame=frame)
    with Journal.open(j.path) as j2:
        for sink, body in bodies.items():
            batch = j2.cursor(sink).inflight
            assert batch is not None and batch.body == body


def test_cursor_inflight_ack_and_losses(tmp_path: Path) -> None:
    with Journal.create(tmp_path) as j:
        j.append(EntryKind.EPISODE, [_rec(i) for i in range(5)])
        assert j.cursor("traces").acked == 0 and j.cursor("traces").inflight is None
        body = os.urandom(3000)
        j.set_inflight("traces", InFlight(1, 3, body, {"key": "k1", "attempts": 0}))
        j.update_inflight_state("traces", {"attempts": 1})
    with Journal.open(j.path) as j2:  # the batch survives a restart byte-identical
        st = j2.cursor("traces")
        assert st.inflight is not None and st.inflight.body == body
        assert st.inflight.state == {"key": "k1", "attempts": 1}
        assert j2.acked("traces") == 0 and j2.acked("metrics") == 0  # with a batch in flight
        j2.ack("traces", 3, failed=2, reason="422 bad record")
        assert j2.cursor("traces").acked == 3 and j2.cursor("traces").inflight is None
        assert j2.acked("traces") == 3
        j2.record_loss("encode", 1, "not JSON")
        assert j2.losses() == {
            "traces": {"count": 2, "reasons": ["422 bad record"]},
            "encode": {"count": 1, "reasons": ["not JSON"]},
        }
        with pytest.raises(ValueError):
            j2.ack("traces", 2)  # backwards
        with pytest.raises(JournalError):
            j2.update_inflight_state("traces", {"x": 1})  # nothing in flight


def test_a_shipper_may_ack_an_entry_it_read_before_its_append_returned(
    tmp_path: Path,
) -> None:
    """A shipper thread beside the appender (threads mode) reads an append's
    entries from the spool as soon as they are written, which is before the
    append records the log's new end. Acking them then is acking what exists:
    it used to raise ("cannot ack 2: the last entry is 1"), which stopped the
    sink and left its records unshipped."""
    with Journal.create(tmp_path) as j:
        j.append(EntryKind.METRICS, [_rec(1)])
        writer = j._appender._spool  # type: ignore[union-attr]
        write = writer.write
        seen: list[int] = []

        def write_then_ship(first_seq: int, frames: list[bytes]) -> None:
            write(first_seq, frames)
            # Another thread's turn, between the write and the new end.
            got = j.read(j.cursor("metrics").acked)
            seen.extend(e.seq for e in got.entries)
            j.ack("metrics", got.next_after)

        writer.write = write_then_ship  # type: ignore[method-assign]
        j.append(EntryKind.METRICS, [_rec(2)])
        assert seen == [1, 2]
        assert j.cursor("metrics").acked == 2 and j.last_seq() == 2


def test_nothing_is_journaled_after_the_finish_entry(tmp_path: Path) -> None:
    # The close-out ships up to the finish entry: a record after it would be
    # left behind by a run closed as complete. Another thread's call that was
    # past its check when the finish came is refused instead.
    from primeruns.exceptions import RunFinishedError

    with Journal.create(tmp_path) as j:
        j.append(EntryKind.EPISODE, [_rec(1)])
        j.append(EntryKind.FINISH, [b'{"status": "completed"}'], essential=True, final=True)
        with pytest.raises(RunFinishedError, match="another thread"):
            j.append(EntryKind.EPISODE, [_rec(2)])
        assert j.last_seq() == 2
        assert j.read(0, kinds={EntryKind.FINISH}).entries[0].seq == 2


def test_meta_roundtrip(tmp_path: Path) -> None:
    with Journal.create(tmp_path, local_id="run-a", meta={"spec": {"kind": "eval"}}) as j:
        assert j.local_id == "run-a" and j.path == tmp_path / "run-a"
        j.set_meta("state", "running")
        j.update_meta({"platform": {"run_id": "r1"}, "state": "finished"})
        assert j.get_meta("spec") == {"kind": "eval"}
        assert j.get_meta("state") == "finished"
        assert j.get_meta("missing", 7) == 7


def test_several_meta_values_are_read_at_once_and_a_damaged_one_is_named(
    tmp_path: Path,
) -> None:
    """``get_metas`` (the shipper reads the parts a batch changes with it):
    absent keys are left out, and a value whose frame is damaged is named
    rather than raised, the others read."""
    with Journal.create(tmp_path, local_id="run-a") as j:
        j.update_meta({"a": [1, 2], "b": None, "c": {"x": 1}})
        with j._tx.lock, j._tx.store.begin(write=True) as txn:
            txn.put(b"c", b"\x00garbage", db=j._tx.dbs["meta"])
        assert j.get_metas(["a", "b", "c", "missing"]) == ({"a": [1, 2], "b": None}, ["c"])


def test_meta_values_are_removed_with_others_stored(tmp_path: Path) -> None:
    """``update_meta``'s ``drop`` (the rollout numbering's emptied parts):
    the keys named are gone, absent ones no error, the values stored."""
    with Journal.create(tmp_path, local_id="run-a") as j:
        j.update_meta({"a": 1, "b": 2})
        j.update_meta({"c": 3}, drop=["a", "missing"])
        assert j.get_metas(["a", "b", "c"]) == ({"b": 2, "c": 3}, [])
        assert "a" not in j.all_meta()


def test_compact_keeps_last_seq_and_density(tmp_path: Path) -> None:
    with Journal.create(tmp_path) as j:
        j.append(EntryKind.METRICS, [_rec(i) for i in range(10)])
        j.ack("a", 6)
        j.ack("b", 4)
        assert j.compact() == 4
        assert j.last_seq() == 10
        assert [e.seq for e in j.read(0).entries] == [5, 6, 7, 8, 9, 10]
        assert j.damage() == []
    with Journal.open(j.path) as j2:
        assert j2.last_seq() == 10
        assert j2.append(EntryKind.METRICS, [_rec(11)]).first_seq == 11


def test_an_untimed_wait_for_append_sees_a_condition_set_before_it_began(
    tmp_path: Path,
) -> None:
    # The shipper waits for appends with no timeout; its stop flag is looked
    # at under the log's condition, so a stop that lands between the
    # shipper's own check and its wait still ends the wait (else: a hang).
    with Journal.create(tmp_path) as j:
        stop = threading.Event()
        stop.set()
        assert j.wait_for_append(j.last_seq(), None, until=stop.is_set) is False
        stop.clear()
        done: list[bool] = []
        waiting = threading.Thread(
            target=lambda: done.append(j.wait_for_append(j.last_seq(), None, until=stop.is_set))
        )
        waiting.start()
        stop.set()
        j.wake_all()  # what Shipper.signal_stop does, after setting the flag
        waiting.join()
        assert done == [False]


def test_wait_for_append_and_wake_all(tmp_path: Path) -> None:
    with Journal.create(tmp_path) as j:
        assert j.wait_for_append(0, 0.01) is False
        results: list[bool] = []
        started = threading.Event()

        def waiter() -> None:
            after = j.last_seq()
            started.set()
            results.append(j.wait_for_append(after, 30))

        t = threading.Thread(target=waiter)
        t.start()
        started.wait()
        j.append(EntryKind.METRICS, [_rec(1)])
        t.join(30)
        assert results == [True]
        started.clear()
        t2 = threading.Thread(target=waiter)
        t2.start()
        started.wait()
        # wake_all may land before the waiter sleeps: repeat until it has returned.
        while t2.is_alive():
            j.wake_all()
            t2.join(0.05)
        assert results == [True, False]


def test_permissions_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with Journal.create(tmp_path / "runs") as j:
            j.append(EntryKind.METRICS, [_rec(1)])
            assert stat.S_IMODE(j.path.stat().st_mode) == 0o700
            for f in j.path.iterdir():
                assert stat.S_IMODE(f.stat().st_mode) == 0o600, f.name
    finally:
        os.umask(old)


_OWNER = """
import sys, time
from pathlib import Path
from typing import Any
from primeruns.journal import EntryKind, Journal
j = Journal.open(Path(sys.argv[1]))
j.append(EntryKind.METRICS, [b'{"from":"child"}'])
print("ready", flush=True)
sys.stdin.readline()
"""


def test_lock_refuses_second_owner_and_allows_readers(tmp_path: Path) -> None:
    j = Journal.create(tmp_path)
    path = j.path
    j.close()
    child = procs.start(
        [sys.executable, "-c", _OWNER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with pytest.raises(JournalLockedError) as info:
            Journal.open(path)
        assert info.value.owner is not None and f"pid {child.pid} on" in info.value.owner
        with pytest.raises(JournalLockedError):
            delete_journal(path)
        with Journal.open(path, owner=False) as ro:
            assert ro.last_seq() == 1 and ro.read(0).entries[0].payload == b'{"from":"child"}'
            with pytest.raises(JournalError):
                ro.append(EntryKind.METRICS, [b"{}"])
        (info_row,) = list_journals(tmp_path)
        assert info_row.owner_alive and info_row.last_seq == 1
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)
        if child.stdout is not None:
            child.stdout.close()
    with Journal.open(path) as j2:  # the dead owner's lock is free
        assert j2.last_seq() == 1
    row = list_journals(tmp_path)[0]
    assert row.owner_alive is False and row.owner is None
    delete_journal(path)
    assert not path.exists()


def test_open_non_journal_is_clear(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="not a prime-runs journal"):
        Journal.open(tmp_path)
    (tmp_path / "data.mdb").write_bytes(b"hello" * 100)
    with pytest.raises(JournalError, match="not"):
        Journal.open(tmp_path, owner=False)
    with pytest.raises(JournalError):
        delete_journal(tmp_path)  # never removes what is not a journal
    assert (tmp_path / "data.mdb").exists()


def test_budget_drops_counted_never_raise(tmp_path: Path) -> None:
    with Journal.create(tmp_path, max_bytes=1 << 20) as j:
        written = dropped = 0
        for i in range(400):
            r = j.append(EntryKind.EPISODE, [os.urandom(8000).hex().encode()[: 8000 + i]])
            written += r.count
            dropped += r.dropped
        assert written > 0 and dropped > 0
        assert j.losses()["journal"]["count"] == dropped
        assert j.last_seq() == written
        assert [e.seq for e in j.read(0, max_entries=10_000, max_bytes=1 << 30).entries] == list(
            range(1, written + 1)
        )
        j.ack("s", written)  # cursor writes still work (or the loss folds in later)
        assert j.compact() == written
        assert j.append(EntryKind.METRICS, [b"{}"]).count == 1  # space reused after compaction
        assert j.losses()["journal"]["count"] == dropped


_FORK = """
import os, sys, json
from pathlib import Path
from typing import Any
from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, Journal
j = Journal.create(Path(sys.argv[1]))
j.append(EntryKind.METRICS, [b'{"n":1}'])
pid = os.fork()
if pid == 0:
    try:
        j.append(EntryKind.METRICS, [b'{"n":"child"}'])
        os._exit(3)
    except JournalError:
        pass
    j.close()  # must not touch the parent's environment or lock
    try:
        Journal.open(j.path, owner=False)
        os._exit(4)
    except JournalError as exc:  # refused clearly: py-lmdb allows one env per file
        os._exit(0 if "forked child" in str(exc) else 5)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
j.append(EntryKind.METRICS, [b'{"n":2}'])
print(json.dumps([e.payload.decode() for e in j.read(0).entries]))
j.close()
"""


def test_fork_child_cannot_use_inherited_journal(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FORK, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ['{"n":1}', '{"n":2}']


_WRITER_WITH_A_CHILD = """
import os, sys
from pathlib import Path
from primeruns.journal import Journal
from primeruns.journal.lock import lock_held

j = Journal.create(Path(sys.argv[1]))
ready, said = os.pipe()
pid = os.fork()
if pid == 0:  # a worker of its own, alive after it
    os.write(said, b"x")
    sys.stdin.readline()  # until the test lets it go
    os._exit(0)
os.read(ready, 1)
print(j.path, lock_held(j.path), flush=True)
os._exit(0)  # killed: nothing of it runs at its end
"""


def test_a_journal_whose_writer_died_is_not_held_by_the_children_it_forked(
    tmp_path: Path,
) -> None:
    """A child forked by a journal's writer holds its lock's descriptor.
    Kept open, the writer's death (killed out of memory) left the journal
    held as long as the child lived: replayed, it was refused as still
    written; a run's primary waited for it as for a process still logging."""
    proc = procs.start(
        [sys.executable, "-c", _WRITER_WITH_A_CHILD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        path, held = proc.stdout.readline().split()
        assert proc.wait(timeout=60) == 0
        assert held == "True"  # while the writer lived, its child's copy closed
        assert not lock_held(Path(path))  # the child still lives: stdin is open
    finally:
        proc.stdin.close()  # the child ends
        proc.stdout.close()


def test_network_fs_warns_once_with_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsinfo, "network_fs_type", lambda _p: "nfs")
    monkeypatch.delenv(fsinfo.ALLOW_ENV, raising=False)
    with pytest.warns(fsinfo.NetworkFilesystemWarning, match="PRIME_RUNS_DIR"):
        Journal.create(tmp_path).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Journal.create(tmp_path).close()  # once per runs directory
        monkeypatch.setenv(fsinfo.ALLOW_ENV, "1")
        Journal.create(tmp_path / "other").close()


def test_creating_a_journal_starts_no_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its network filesystem check opens the C library by name: looking it
    up (``ctypes.util.find_library``) ran ``ldconfig`` in a child process,
    7-25 ms of every ``init()``."""
    from primeruns import libc

    def no_child(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a child process was started: {args[0] if args else kwargs}")

    libc.libc.cache_clear()  # as in a process that has not opened it yet
    monkeypatch.setattr(subprocess, "Popen", no_child)
    Journal.create(tmp_path).close()


def test_default_runs_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PRIME_RUNS_DIR", str(tmp_path / "r"))
    assert default_runs_dir() == tmp_path / "r"
    monkeypatch.delenv("PRIME_RUNS_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "s"))
    assert default_runs_dir() == tmp_path / "s" / "prime-runs" / "runs"


def test_compaction_keeps_the_entries_that_decide_how_a_run_is_closed(tmp_path: Path) -> None:
    """Found by an adversarial review: space-pressure compaction deleted the
    summary entry, and a replay of the killed run closed it with an empty
    summary. The spec, summaries and finish are never compacted."""
    journal = Journal.create(tmp_path / "runs", local_id="r")
    try:
        journal.append(EntryKind.RUN_OPEN, [b'{"kind":"eval"}'])
        journal.append(EntryKind.SUMMARY, [b'{"accuracy":0.75,"pad":"' + b"x" * 5000 + b'"}'])
        journal.append(EntryKind.EPISODE, [b'{"id":"e%d"}' % i for i in range(50)])
        journal.append(EntryKind.FINISH, [b'{"status":"completed"}'])
        journal.ack("traces", journal.last_seq())
        assert journal.compact(sinks=["traces"]) == 50
        left = journal.read(0, max_entries=1000).entries
        assert [e.kind for e in left] == [EntryKind.RUN_OPEN, EntryKind.SUMMARY, EntryKind.FINISH]
        assert journal.damage() == []
    finally:
        journal.close()


def test_the_probe_takes_directory_names_with_newlines(tmp_path: Path) -> None:
    """Found by an adversarial review: names were sent to the probe's child one
    per line, so a name holding a newline shifted every verdict after it."""
    from primeruns.journal.probe import probe_many

    healthy = Journal.create(tmp_path, local_id="healthy")
    healthy.append(EntryKind.EPISODE, [b'{"id":"e"}'])
    healthy.close()
    odd = tmp_path / "a\nhealthy"
    shutil.copytree(tmp_path / "healthy", odd)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "data.mdb").write_bytes(b"\x00" * 16384)
    verdicts = probe_many([odd, garbage])
    assert verdicts[odd] is None
    assert verdicts[garbage] is not None


def test_a_journal_opened_unwalked_for_want_of_a_child_is_walked_once_one_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an adversarial review: when no child could be started (fork
    failed: EAGAIN at a process limit, ENOMEM), the journal was opened
    unwalked, as meant, but that "healthy" was kept as a walk's verdict for
    the process's life: every later open of the same file, with children to
    spare again, mapped it unwalked, and a damaged page aborted the process."""
    import errno
    import subprocess

    from primeruns.journal import probe

    garbage = tmp_path / "garbage"
    garbage.mkdir(mode=0o700)
    (garbage / "data.mdb").write_bytes(b"\x00" * 16384)
    real_run = subprocess.run  # (the probe imports it when it starts a child)

    def no_child(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess, "run", no_child)
    assert probe.probe(garbage) is None  # opened unchecked, as before
    monkeypatch.setattr(subprocess, "run", real_run)
    assert probe.probe(garbage) is not None


def test_a_malformed_compaction_count_never_stops_compaction(tmp_path: Path) -> None:
    """The counts are for display: a value another version wrote differently
    must not cost the journal its space."""
    with Journal.create(tmp_path) as j:
        j.append(EntryKind.METRICS, [_rec(i) for i in range(10)])
        j.set_meta(K_COMPACTED_KINDS, {"4": None, "x": 3, "2": "many"})
        j.ack("a", 6)
        assert j.compact() == 6
        assert dict(j.tally()[0]) == {int(EntryKind.METRICS): 10}


def test_the_terminal_state_of_a_journal_longer_than_one_reads_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # replay and sync label a journal by its last finish entry: one past a
    # read's scan limit is still found (else a finished run reads as crashed).
    from primeruns.journal import reading
    from primeruns.ship.uplink import terminal_state

    monkeypatch.setattr(reading, "_MAX_SCAN", 16)
    with Journal.create(tmp_path, local_id="run") as j:
        j.append(EntryKind.METRICS, [_rec(i) for i in range(100)])
        j.append(EntryKind.FINISH, [json.dumps({"status": "completed"}).encode()])
        assert terminal_state(j)[0] == "completed"


def test_a_crashed_runs_close_out_reads_its_last_summary_from_the_logs_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The close-out of a crash looked for a finish entry over every header,
    # then took the last summary: a run that updates its summary each step
    # paid a pass over its whole journal (200 ms at 100,000 steps). Read from
    # the end, it decodes the last summary alone and passes over no header
    # from the log's start.
    from primeruns.ship.uplink import terminal_state

    with Journal.create(tmp_path, local_id="run") as j:
        for step in range(50):
            j.append(EntryKind.METRICS, [_rec(step)])
            j.append(EntryKind.SUMMARY, [json.dumps({"step": step}).encode()])
        passes: list[int] = []
        decoded: list[int] = []
        read, get = j.read, j.get

        def counted_read(after_seq: int, **kw: Any) -> Any:
            if after_seq == 0:
                passes.append(1)
            return read(after_seq, **kw)

        def counted_get(seq: int) -> Any:
            decoded.append(seq)
            return get(seq)

        monkeypatch.setattr(j, "read", counted_read)
        monkeypatch.setattr(j, "get", counted_get)
        assert terminal_state(j)[2] == {"step": 49}
        assert passes == []
        assert decoded == [j.last_seq()]


def test_the_start_up_scan_names_crashed_runs_and_leaves_a_journal_taken_over_unopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A requeued job shipping in threads takes its predecessor's journal over
    # in this process while init's scan for crashed runs lists the others: a
    # journal open read-only here cannot be opened to write in it, so the
    # scan opening it cost the take-over (its backlog waited for a replay).
    import logging

    from primeruns import opening
    from primeruns.journal import listing

    runs = tmp_path / "runs"
    online = {"spec": {"kind": "train", "mode": "online"}}
    crashed = Journal.create(runs, local_id="crashed", meta=online)
    taken = Journal.create(runs, local_id="taken", meta=online)
    crashed.close()
    taken.close()
    opened: list[Path] = []
    real_info = listing._info

    def recording(path: Path, **kwargs: Any) -> Any:
        opened.append(path)
        return real_info(path, **kwargs)

    monkeypatch.setattr(listing, "_info", recording)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        opening._mention_crashed_runs(runs, {taken.path})
    assert taken.path not in opened
    assert "crashed before they were shipped" in caplog.text
    assert "crashed" in caplog.text and "taken" not in caplog.text


def test_the_start_up_scan_does_not_call_a_run_that_finished_crashed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An earlier run that finished, but whose close-out did not reach the
    platform, was named among runs that "crashed before they were shipped"."""
    import logging

    from primeruns import opening

    runs = tmp_path / "runs"
    online = {"spec": {"kind": "eval", "mode": "online"}}
    with Journal.create(runs, local_id="finished", meta=online) as finished:
        finished.append(EntryKind.FINISH, [b'{"status": "completed"}'])
    Journal.create(runs, local_id="killed", meta=online).close()
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        opening._mention_crashed_runs(runs, set())
    assert "1 earlier run(s) in" in caplog.text, caplog.text
    assert "crashed before they were shipped and closed out (killed)" in caplog.text
    assert "finished but were not shipped and closed out (finished)" in caplog.text


def test_the_probe_works_in_a_plain_virtual_environment(tmp_path: Path, monkeypatch) -> None:
    """Found by installing the declared floors (tools/floors.py) in a fresh venv:
    the probe's child ran with primeruns/journal/ first on sys.path, whose
    types.py shadowed the standard library's where nothing had imported it yet,
    so every journal of a user who installed the wheel read as damaged."""
    from primeruns.journal import probe

    journal = Journal.create(tmp_path / "runs", local_id="plain")
    journal.append(EntryKind.EPISODE, [b'{"id":"e"}'])
    journal.close()
    # An interpreter started without site hooks (as in a plain venv, nothing
    # imports `types` before the script runs), with lmdb still importable.
    import lmdb

    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH={Path(lmdb.__file__).parent.parent} exec {sys.executable} -S "$@"\n'
    )
    python.chmod(0o755)
    monkeypatch.setattr(probe.sys, "executable", str(python))
    assert probe.probe_many([tmp_path / "runs" / "plain"]) == {tmp_path / "runs" / "plain": None}
