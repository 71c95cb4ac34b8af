"""Power cuts for real: a producer logs on a file system that forgets what was
not synced (``cutfs``), the power is cut at a random point, and the journal
left on the "disk" is read.

With ``durability="fsync"`` every ``log_metrics`` call that returned before the
cut is in the journal. With ``"process"`` the journal holds a prefix of the
calls (no hole: an entry is never kept while one before it is lost), and what
it holds is read without error.

Needs root and ``/dev/fuse`` (a FUSE mount); without them the tests skip,
except under ``CI``, where they fail: a CI that cannot run them must say so.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import procs
import pytest

from primeruns.journal import EntryKind, Journal, torn

HERE = Path(__file__).parent
CUTFS = HERE / "cutfs.py"
PRODUCER = HERE / "powercut_producer.py"
TAG = "PRIMERUNS_POWERCUT_TAG"


def _need_fuse() -> None:
    why = None
    if os.geteuid() != 0:
        why = "power-cut tests mount a FUSE file system: they need root"
    elif not os.path.exists("/dev/fuse"):
        why = "power-cut tests need /dev/fuse"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (under CI this is a failure, not a skip)")
        pytest.skip(why)


class PowerCut:
    """A ``cutfs`` mount of ``backing`` at ``mount``, and the processes on it."""

    def __init__(self, tmp_path: Path, mode: str, seed: int, extra: list[str]) -> None:
        self.backing = tmp_path / "disk"
        self.mount = tmp_path / "mnt"
        self.backing.mkdir(parents=True)
        self.mount.mkdir()
        self.tag = uuid.uuid4().hex
        self.fs = procs.start(
            [sys.executable, str(CUTFS), str(self.backing), str(self.mount),
             "--mode", mode, "--seed", str(seed), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.fs.stdout is not None
        line = self.fs.stdout.readline()
        if line.strip() != "ready":
            self.fs.wait(timeout=30)
            if os.environ.get("CI"):
                pytest.fail(f"cutfs could not mount ({line!r})")
            pytest.skip(f"cutfs could not mount a FUSE file system here ({line!r})")
        self.lost = ""

    def start(self, args: list[str]) -> subprocess.Popen[str]:
        env = {**os.environ, TAG: self.tag, "PRIME_RUNS_ALLOW_NETWORK_FS": "1"}
        proc: subprocess.Popen[str] = procs.start(
            [sys.executable, *args], stdout=subprocess.PIPE, text=True, env=env
        )
        return proc

    def cut(self, *, now: bool = True) -> None:
        """Power off (``now``; or wait for the file system to cut by itself):
        the disk keeps what was synced; every process on it dies."""
        assert self.fs.stdin is not None and self.fs.stdout is not None
        if now:
            self.fs.stdin.write("cut\n")
            self.fs.stdin.flush()
        self.lost = self.fs.stdout.readline().strip()
        assert self.lost.startswith("cut"), self.lost
        self._kill_tagged()
        self.close()

    def _kill_tagged(self) -> None:
        # The producer and any process it started (its uplink, in its own
        # session) carry the tag in their environment.
        needle = f"{TAG}={self.tag}".encode()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    os.kill(int(pid), signal.SIGKILL)

    def close(self) -> None:
        if self.fs.poll() is None:
            assert self.fs.stdin is not None
            with contextlib.suppress(OSError):
                self.fs.stdin.write("exit\n")
                self.fs.stdin.close()
            self.fs.wait(timeout=60)

    def on_disk(self, path: Path) -> Path:
        """Where ``path`` (on the mount) is on the disk."""
        return self.backing / path.relative_to(self.mount)


@contextlib.contextmanager
def powercut(
    tmp_path: Path, mode: str, seed: int, extra: tuple[str, ...] = ()
) -> Iterator[PowerCut]:
    _need_fuse()
    fs = PowerCut(tmp_path, mode, seed, list(extra))
    try:
        yield fs
    finally:
        fs._kill_tagged()
        fs.close()


def _steps(journal: Path) -> list[int]:
    """The steps of the metric rows the journal holds, in its order."""
    steps = []
    with Journal.open(journal, owner=False) as j:
        after = 0
        while True:
            got = j.read(after, max_entries=10**6, max_bytes=1 << 40)
            assert got.damaged == [], got.damaged
            for entry in got.entries:
                if entry.kind == EntryKind.METRICS:
                    steps.append(json.loads(entry.payload)["step"])
            if got.next_after <= after:
                return steps
            after = got.next_after


def _cut_a_producer(
    tmp_path: Path, durability: str, mode: str, seed: int
) -> tuple[int, list[int], Path]:
    """(the last step whose call returned before the cut, the steps the
    journal holds after it, the journal on the disk)."""
    rng = random.Random(seed)
    with powercut(tmp_path, mode, seed) as fs:
        proc, journal = _start_producer(fs, durability)
        assert proc.stdout is not None
        target = rng.randint(1, 3000)
        returned = -1
        for line in proc.stdout:
            returned = int(line)
            if returned >= target:
                break
        fs.cut()
        for line in proc.stdout:  # calls that returned before the cut, printed after it
            returned = max(returned, int(line))
        proc.wait(timeout=60)
        return returned, _steps(fs.on_disk(journal)), fs.on_disk(journal)


def _start_producer(fs: PowerCut, durability: str) -> tuple[subprocess.Popen[str], Path]:
    proc = fs.start([str(PRODUCER), str(fs.mount / "runs"), durability])
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("journal "), first
    return proc, Path(first.split(" ", 1)[1].strip())


def _torn_reported(journal: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The damage the journal reports once "rebooted" (the test cannot reboot:
    the boot id is made another): its torn tails, if any, and nothing else."""
    with Journal.open(journal, owner=False) as j:
        assert j.damage() == []  # same boot: a torn tail is a writer's crash
        with monkeypatch.context() as m:
            m.setattr(torn, "boot_id", lambda: "the boot after the power cut")
            reported = [d.what for d in j.damage()]
    assert all("a torn tail of" in what for what in reported), reported
    return reported


def _check(
    tmp_path: Path, durability: str, mode: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    returned, steps, journal = _cut_a_producer(tmp_path, durability, mode, seed)
    assert returned >= 0
    # A prefix, whatever the durability: no hole, no repeat.
    assert steps == list(range(len(steps))), f"seed {seed}: not a prefix"
    if durability == "fsync":
        assert len(steps) > returned, f"seed {seed}: {returned + 1} returned, {len(steps)} kept"
    _torn_reported(journal, monkeypatch)


@pytest.mark.parametrize("durability", ["fsync", "process"])
def test_power_cut(tmp_path: Path, durability: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _check(tmp_path, durability, "drop", 7, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["drop", "torn"])
@pytest.mark.parametrize("durability", ["fsync", "process"])
@pytest.mark.parametrize("seed", range(8))
def test_power_cut_seeds(
    tmp_path: Path, durability: str, mode: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check(tmp_path, durability, mode, seed, monkeypatch)


@pytest.mark.slow
def test_a_torn_tail_left_by_a_power_cut_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writeback got part of the last appends to the disk: the journal keeps
    the whole ones and, once rebooted, names the torn rest as damage."""
    reported: list[str] = []
    for seed in range(20):  # the first seed whose cut tore a spool's tail
        _, steps, journal = _cut_a_producer(tmp_path / str(seed), "process", "torn", seed)
        assert steps == list(range(len(steps)))
        reported = _torn_reported(journal, monkeypatch)
        if reported:
            break
    assert reported, "no cut tore a tail in 20 seeds"


def test_power_cut_as_a_spool_segment_is_deleted(tmp_path: Path) -> None:
    """The mover deletes a spool segment once LMDB holds its entries: the
    commit must be on disk first, or a cut right after the delete loses them
    from both (a hole, with "process", where LMDB is synced once a second)."""
    with powercut(tmp_path, "drop", 0, ("--cut-on-unlink", "spool-")) as fs:
        proc, journal = _start_producer(fs, "process")
        fs.cut(now=False)
        proc.wait(timeout=60)
        steps = _steps(fs.on_disk(journal))
    assert steps, "nothing was kept"
    assert steps == list(range(len(steps)))


def _copy_with_a_raw_tail(path: Path) -> int:
    """A copy of a journal at ``path``: 300 episodes its mover compressed
    (with the dictionary it trained), then 5 its producer spooled and was
    killed before they moved. Returns its last seq."""
    from spooled import killed_segment

    with Journal.create(path.parent, local_id=path.name) as journal:
        for i in range(300):
            journal.append(EntryKind.EPISODE, [_episode(i)])
    journal = Journal.open(path, owner=True)
    journal._mover.stop()
    for i in range(300, 305):
        journal.append(EntryKind.EPISODE, [_episode(i)])
    killed_segment(journal)
    return 305


def _episode(i: int) -> bytes:
    turns = [{"role": "user", "content": f"Question {i}: what is {i} plus {i * 7}?"}] * 8
    return json.dumps({"id": f"ep-{i:06d}", "turns": turns}).encode()


def test_power_cut_after_a_sync_journal_stored_a_copys_frames_as_they_are(
    tmp_path: Path,
) -> None:
    """The import stores the copy's compressed frames in the sync journal's
    LMDB, past its spool, then appends the copy's raw tail to a new spool
    segment. A cut before LMDB was synced must leave a prefix: a segment
    named past the frames, on the disk while they are not, made them a
    hole, and the next sync, importing after its end, never brought them."""
    copy = tmp_path / "copies" / "run"
    last = _copy_with_a_raw_tail(copy)
    with Journal.open(copy, owner=False) as source:
        want = {e.seq: e.payload for e in source.read(0, max_entries=10_000).entries}
    assert len(want) == last
    with powercut(tmp_path, "drop", 0) as fs:
        proc = fs.start([str(HERE / "powercut_import.py"), str(copy), str(fs.mount / "synced")])
        assert proc.stdout is not None
        said = proc.stdout.readline().split()
        assert said[:2] == ["imported", str(last)], said
        synced = fs.on_disk(Path(said[2]))
        fs.cut()
        proc.wait(timeout=60)
    with Journal.open(synced, owner=False) as j:
        kept = j.read(0, max_entries=10_000)
        assert kept.damaged == [], kept.damaged  # a prefix: no hole
        assert [e.seq for e in kept.entries] == list(range(1, len(kept.entries) + 1))
    # Synced again from the copy: every entry, once.
    with Journal.open(copy, owner=False) as source, Journal.open(synced, owner=True) as sync:
        from primeruns.ship.mirror import import_new

        done = import_new(source, sync, final=True)
        assert done.stopped is None and done.upto == last
        got = {e.seq: e.payload for e in sync.read(0, max_entries=10_000).entries}
    assert got == want
