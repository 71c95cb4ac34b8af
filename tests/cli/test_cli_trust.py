"""Hostile neighbours on a shared disk: what another user plants in a runs
directory is never opened, written through or followed.

The attacker's files are owned by another uid (``nobody``) when the tests run
as root, as CI does; otherwise they are this user's own links, which the
checks refuse as well (a link where a journal's file should be).
"""

from __future__ import annotations

import contextlib
import grp
import http.server
import json
import os
import pwd
import re
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import httpx
import lmdb
import procs
import pytest
import second_uid
import workloads
import zstandard
from cli_helpers import cli
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, Journal
from primeruns.journal.frames import FLAG_ZSTD, MAX_ENTRY_BYTES, _assemble
from primeruns.journal.layout import META_KIND, put_entry
from primeruns.journal.trust import SwappableRunsDirWarning, UntrustedPathError
from primeruns.ship.uplink import journal_settings

NOBODY = 65534
VICTIM_BYTES = b"the victim's own data\n" * 400


def _as_attacker(path: Path) -> None:
    """Hand ``path`` to another user, where this process may (as root)."""
    if os.geteuid() == 0:
        os.lchown(path, NOBODY, NOBODY)


def _plant(runs: Path, victim: Path, linked: str) -> Path:
    """A journal-shaped folder whose ``linked`` file is a link to ``victim``."""
    honest = Journal.create(runs)
    honest.close()
    planted = runs / "20260101-000000-planted0"
    planted.mkdir()
    for name in ("data.mdb", "lock.mdb", "owner.lock"):
        source = honest.path / name
        if name == linked:
            os.symlink(victim, planted / name)
        elif source.exists():
            (planted / name).write_bytes(source.read_bytes())
    for child in planted.iterdir():
        _as_attacker(child)
    _as_attacker(planted)
    return planted


@pytest.mark.parametrize("linked", ["lock.mdb", "owner.lock", "data.mdb"])
def test_a_planted_journal_is_listed_with_the_reason_and_never_written_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], linked: str
) -> None:
    runs = tmp_path / "runs"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM_BYTES)
    planted = _plant(runs, victim, linked)
    code, out, _ = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
    assert code == 0
    rows = {row["local_id"]: row for row in json.loads(out)}
    assert any("not opened" in d for d in rows[planted.name]["damage"])
    for argv in (
        ["show", str(planted)],
        ["export", str(planted)],
        ["sync", str(planted)],
        ["replay", str(planted)],
        ["gc", "--runs-dir", str(runs), "--older-than", "0", "--force"],
    ):
        cli(capsys, *argv)
        assert victim.read_bytes() == VICTIM_BYTES, argv


@pytest.mark.parametrize("command", ["ls", "show", "gc", "sync"])
def test_a_named_pipe_planted_as_a_journals_lock_file_does_not_hang_a_command(
    tmp_path: Path, command: str
) -> None:
    """A journal folder whose ``owner.lock`` is a named pipe nobody writes:
    reading who owns the journal opened it and waited for a writer for
    ever, so ``ls``, ``show``, ``gc`` and ``sync`` of a runs directory
    holding it never returned. (In a child with a deadline: a command that
    waits for ever is the failure.)"""
    runs = tmp_path / "runs"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM_BYTES)
    planted = _plant(runs, victim, "data.mdb")
    os.unlink(planted / "owner.lock")
    os.mkfifo(planted / "owner.lock", 0o666)
    _as_attacker(planted / "owner.lock")
    argv = {
        "ls": ["ls", "--runs-dir", str(runs)],
        "show": ["show", str(planted)],
        "gc": ["gc", "--runs-dir", str(runs), "--older-than", "0", "--force"],
        "sync": ["sync", str(planted)],
    }[command]
    env = {**os.environ, "PRIME_API_KEY": API_KEY, "PRIME_API_BASE_URL": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, "-m", "primeruns", *argv],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert victim.read_bytes() == VICTIM_BYTES


def test_a_named_pipe_planted_as_a_journals_origin_file_is_read_without_waiting(
    tmp_path: Path,
) -> None:
    """A journal folder whose ``origin.json`` is a named pipe nobody writes:
    ``sync`` and ``replay`` read it first, to tell a copy from its original,
    and waited for a writer for ever. It reads as no origin. (In a child
    with a deadline: a read that waits for ever is the failure.)"""
    folder = tmp_path / "20260101-000000-planted0"
    folder.mkdir()
    os.mkfifo(folder / "origin.json", 0o666)
    _as_attacker(folder / "origin.json")
    script = (
        "import sys; from pathlib import Path; from primeruns.journal.origin import Origin; "
        "print(Origin.read_beside(Path(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(folder)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "None"), done.stderr


@pytest.mark.parametrize("linked", ["lock.mdb", "data.mdb"])
def test_the_offline_dashboard_shows_a_planted_journal_without_writing_through_it(
    tmp_path: Path, linked: str
) -> None:
    runs = tmp_path / "runs"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM_BYTES)
    planted = _plant(runs, victim, linked)
    serve = procs.start(
        [sys.executable, "-m", "primeruns.local", "--runs-dir", str(runs), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert serve.stdout is not None
    line = serve.stdout.readline()
    match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    assert match, line
    url = match.group(1)
    listing = httpx.get(f"{url}/", timeout=60)
    page = httpx.get(f"{url}/dashboard/evaluations/{planted.name}", timeout=60)
    assert victim.read_bytes() == VICTIM_BYTES
    assert listing.status_code == 200 and planted.name in listing.text
    assert page.status_code == 200 and "not opened" in page.text


#: A child that runs ``primeruns ARGV`` and then writes its peak RSS (MB) as
#: the last line of its stderr. ``VmHWM``, not ``ru_maxrss``: Linux carries
#: the latter over from the parent through fork and exec, and the test that
#: wrote the journal is the parent.
_PEAK_RSS_CHILD = """
import sys
from primeruns.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
with open("/proc/self/status") as status:
    peak = next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
print(peak / 1024, file=sys.stderr)
sys.exit(code)
"""


def _inflating_journal(runs: Path) -> Path:
    """A journal of ~60 KB whose meta and summary decode to gigabytes, as one
    copied from another machine could be: a 128 MiB JSON string packed by
    zstd into ~4 KB (the meta value ``notes``, and the run's summary), and
    2,000,000 empty lists packed into a few KB (``many``, 6 MB of text,
    ~130 MB once decoded). Every frame is valid and checksummed."""
    bomb_bytes = MAX_ENTRY_BYTES - 4096
    bomb = b'"' + b"x" * (bomb_bytes - 2) + b'"'
    values = {"notes": bomb, "many": b"[" + b"[]," * 2_000_000 + b"[]]"}
    summary = b'{"hostile": ' + bomb + b"}"
    spec = {"kind": "eval", "name": "inflating", "model": "m", "mode": "offline"}
    with Journal.create(runs, local_id="inflating", meta={"spec": spec}) as journal:
        tx = journal._tx
        zstd = zstandard.ZstdCompressor(level=3, write_content_size=True)
        frames = {
            key: _assemble(META_KIND, FLAG_ZSTD, 0, len(payload), zstd.compress(payload), None)
            for key, payload in values.items()
        }
        kind = int(EntryKind.SUMMARY)
        entry = _assemble(kind, FLAG_ZSTD, 0, len(summary), zstd.compress(summary), 1)
        del values, bomb, summary

        def put(txn: lmdb.Transaction) -> None:
            for key, frame in frames.items():
                txn.put(key.encode(), frame, db=tx.dbs["meta"])
            put_entry(txn, 1, entry, tx.dbs["entries"])

        tx.write(put)
        return journal.path


def test_a_journal_whose_meta_inflates_is_listed_with_its_damage_named_in_bounded_memory(
    tmp_path: Path,
) -> None:
    """A journal is untrusted input: ``ls`` decoded every meta value whole, and
    this journal of ~60 KB took it to ~420 MB (issue bounds46). Each value is
    now bounded before it is decompressed or parsed: the run is listed with
    what can be read (its spec), and each value left out is named, with the
    journal, as damage; ``show`` says the same, and of the run's summary
    (decoded whole, it took ``show`` to ~440 MB), with no traceback."""
    runs = tmp_path / "runs"
    path = _inflating_journal(runs)
    assert (path / "data.mdb").stat().st_size < 256 << 10
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS_CHILD, "ls", "--runs-dir", str(runs), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    peak_mb = float(done.stderr.strip().splitlines()[-1])
    assert peak_mb < 150, f"ls peaked at {peak_mb:.0f} MB"
    [row] = json.loads(done.stdout)
    assert (row["local_id"], row["name"], row["kind"]) == ("inflating", "inflating", "eval")
    listed = subprocess.run(
        [sys.executable, "-m", "primeruns", "ls", "--runs-dir", str(runs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    # The table itself has no room for damage: a line under it names the journal.
    assert "1 journal(s) with damage: inflating" in listed.stdout, listed.stdout
    for key in ("notes", "many"):
        assert any(str(path) in d and repr(key) in d for d in row["damage"]), row["damage"]
    shown = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS_CHILD, "show", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 4 and "Traceback" not in shown.stderr, shown.stderr[-3000:]
    assert float(shown.stderr.strip().splitlines()[-1]) < 150
    document = json.loads(shown.stdout)
    assert document["spec"]["name"] == "inflating"
    assert any("'notes'" in d for d in document["damage"]), document["damage"]
    assert any("entry 1 (summary)" in d for d in document["damage"]), document["damage"]
    assert document["summary"] == {}


def _inflating_metrics(runs: Path, bombs: int, wide: int) -> Path:
    """A journal of a few hundred KB whose metric rows decode to gigabytes: an
    honest row first and last; between them ``bombs`` rows of a 128 MiB string
    and ``wide`` rows of a 1,000,000-character one (within what a row may
    hold, each with a loss), every frame valid and checksummed."""
    bomb = b'"' + b"x" * (MAX_ENTRY_BYTES - 4096) + b'"'
    rows = [b'{"step": 0, "loss": 1.5}']
    rows += [b'{"step": 1, "hostile": ' + bomb + b"}"] * bombs
    rows += [b'{"step": 1, "loss": 1.0, "text": "' + b"y" * 1_000_000 + b'"}'] * wide
    rows += [b'{"step": 2, "loss": 0.5}']
    zstd = zstandard.ZstdCompressor(level=3, write_content_size=True)
    packed = {payload: zstd.compress(payload) for payload in set(rows)}
    del bomb
    kind = int(EntryKind.METRICS)
    with Journal.create(runs, local_id="metrics", meta={"spec": {"kind": "train"}}) as journal:
        tx = journal._tx

        def put(txn: lmdb.Transaction) -> None:
            for seq, payload in enumerate(rows, 1):
                frame = _assemble(kind, FLAG_ZSTD, 0, len(payload), packed[payload], seq)
                put_entry(txn, seq, frame, tx.dbs["entries"])

        tx.write(put)
        return journal.path


def test_show_reads_a_journals_metric_rows_in_bounded_memory(tmp_path: Path) -> None:
    """``show`` kept every metric row it read for the curves whole: 20 rows of
    a 128 MiB string (412 KB on disk) took it to 2.9 GB, and it reads up to
    2,000 rows. A row declaring more than a row is read within is named as
    damage and not decompressed; of the others only what the curves draw is
    kept, so rows of a megabyte of text each cost what one read of them holds."""
    path = _inflating_metrics(tmp_path / "runs", bombs=4, wide=600)
    assert (path / "data.mdb").stat().st_size < 2 << 20
    for full in ((), ("--full",)):
        shown = subprocess.run(
            [sys.executable, "-c", _PEAK_RSS_CHILD, "show", str(path), "--json", *full],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert shown.returncode == 4 and "Traceback" not in shown.stderr, shown.stderr[-3000:]
        peak_mb = float(shown.stderr.strip().splitlines()[-1])
        assert peak_mb < 200, f"show {full} peaked at {peak_mb:.0f} MB"
        document = json.loads(shown.stdout)
        for seq in range(2, 6):
            assert any(d.startswith(f"entry {seq} holds ") for d in document["damage"]), seq
        assert document["metrics"]["loss"]["points"] == 602
        assert document["metrics"]["loss"]["last"] == 0.5
        assert "text" not in document["metrics"]


def _exported_run(tmp_path: Path) -> Path:
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=tmp_path / "runs")
    run.log_episodes(workloads.agentic(1))
    run.finish()
    assert run.journal_path is not None
    return run.journal_path


@pytest.mark.parametrize("planted", ["link", "file", "hard link"])
def test_export_never_writes_through_what_another_user_planted_at_its_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], planted: str
) -> None:
    """``export -o /tmp/NAME`` on a shared scratch disk: the name may already
    be another user's link to the victim's file (which export truncated and
    filled), a hard link to it, or another user's file open to all (which
    then held the run's records for its owner to read). Export refuses each,
    naming it; a link of the user's own (``-o /dev/stdout``) is still
    written through."""
    journal = _exported_run(tmp_path)
    shared = tmp_path / "scratch"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM_BYTES)
    target = shared / "episodes.jsonl"
    if planted == "hard link":
        # Another name for the victim's file, which anyone may make where
        # fs.protected_hardlinks is off: the file is the victim's own.
        os.link(victim, target)
    else:
        second_uid.require()  # another user's link or file needs another uid
    if planted == "link":
        os.symlink(victim, target)
    elif planted == "file":
        target.write_bytes(b"")
        os.chmod(target, 0o666)
    if planted != "hard link":
        _as_attacker(target)
    code, _, err = cli(capsys, "export", str(journal), "-o", str(target))
    assert code != 0
    assert str(target) in err
    assert victim.read_bytes() == VICTIM_BYTES
    if planted == "file":
        assert target.read_bytes() == b""


def test_export_never_writes_into_another_users_named_pipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``export -o /tmp/NAME`` where another user made NAME a named pipe
    (open to all) and holds it open for reading: the open succeeded, the
    file was not a regular one so no owner was checked, and the run's
    records went down the pipe to its owner. Export refuses it, naming it,
    and writes nothing into it."""
    second_uid.require()  # another user's pipe needs another uid
    journal = _exported_run(tmp_path)
    shared = tmp_path / "scratch"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    target = shared / "episodes.jsonl"
    os.mkfifo(target, 0o666)
    _as_attacker(target)
    reader = os.open(target, os.O_RDONLY | os.O_NONBLOCK)  # the neighbour, listening
    keeper = os.open(target, os.O_WRONLY)  # a writer: the reader sees no end of file yet
    os.set_blocking(reader, True)
    leaked: list[bytes] = []
    listening = threading.Thread(target=_drain, args=(reader, leaked), daemon=True)
    listening.start()
    try:
        code, _, err = cli(capsys, "export", str(journal), "-o", str(target))
    finally:
        os.close(keeper)
        listening.join()
        os.close(reader)
    assert code != 0
    assert str(target) in err and "Traceback" not in err
    assert b"".join(leaked) == b""


def _drain(fd: int, into: list[bytes]) -> None:
    """Read ``fd`` to its end into ``into``: what the pipe's owner would get."""
    while chunk := os.read(fd, 1 << 16):
        into.append(chunk)


def test_export_writes_a_private_file_even_over_an_open_one_of_its_users(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = _exported_run(tmp_path)
    target = tmp_path / "episodes.jsonl"
    target.write_bytes(b"old")
    os.chmod(target, 0o644)
    code, _, _ = cli(capsys, "export", str(journal), "-o", str(target))
    assert code == 0
    assert len(target.read_text().splitlines()) == 1
    assert os.stat(target).st_mode & 0o777 == 0o600


def _folder(path: Path, mode: int) -> Path:
    """``path`` made with ``mode`` whatever the umask."""
    path.mkdir()
    os.chmod(path, mode)
    return path


def test_init_refuses_a_runs_directory_others_can_write_and_names_the_fix(
    tmp_path: Path,
) -> None:
    shared = _folder(tmp_path / "scratch", 0o777)
    _as_attacker(shared)
    with pytest.raises(UntrustedPathError) as raised:
        pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=shared)
    assert str(shared) in str(raised.value) and "PRIME_RUNS_DIR" in str(raised.value)


def test_init_warns_of_a_runs_directory_whose_folder_others_can_write_and_names_the_fix(
    tmp_path: Path,
) -> None:
    # The runs directory is private, but the scratch folder holding it lets
    # every user rename what it holds (no sticky bit): a neighbour could
    # move the runs directory away and put their own in its place between a
    # check and an open. Nothing said so; now the first run there warns,
    # naming the folder and the fix, and the runs still go on.
    shared = _folder(tmp_path / "scratch", 0o777)
    runs = shared / "team" / "runs"
    with pytest.warns(SwappableRunsDirWarning) as warned:
        pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs).finish()
    [said] = [str(w.message) for w in warned if w.category is SwappableRunsDirWarning]
    assert str(runs) in said and f"under {shared}," in said and "mode 777" in said
    assert f"chmod +t {shared}" in said and "PRIME_RUNS_DIR" in said
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per runs directory
        again = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
        again.finish()
    assert again.journal_path is not None and again.journal_path.parent == runs


def test_a_runs_directory_in_a_sticky_shared_folder_is_not_warned_of(tmp_path: Path) -> None:
    # /tmp's way: others may write into it, but only an entry's owner may
    # rename it away.
    shared = _folder(tmp_path / "sticky", 0o1777)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=shared / "r")
        run.finish()


def _said_swappable(runs: Path) -> str:
    """What the first run in ``runs`` warned of its folders (one warning)."""
    with pytest.warns(SwappableRunsDirWarning) as warned:
        pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs).finish()
    [said] = [str(w.message) for w in warned if w.category is SwappableRunsDirWarning]
    return said


def test_a_runs_directory_reached_through_a_link_in_a_folder_others_can_write_is_warned_of(
    tmp_path: Path,
) -> None:
    # The path goes through a link that sits in a folder every user may
    # write into: any of them could put a link of their own in its place.
    # The check looked only at the folders of the real path (the link
    # followed), all private, and said nothing.
    shared = _folder(tmp_path / "scratch", 0o777)
    private = _folder(tmp_path / "mine", 0o700)
    (shared / "link").symlink_to(private)
    runs = shared / "link" / "runs"
    said = _said_swappable(runs)
    assert f"under {shared}," in said and "mode 777" in said and f"chmod +t {shared}" in said


def test_a_runs_directory_under_another_users_folder_is_warned_of(tmp_path: Path) -> None:
    # A folder on the way that belongs to another user (not root): its owner
    # may rename what it holds whatever its mode, sticky bit or not.
    theirs = _folder(tmp_path / "theirs", 0o1755)
    os.chown(theirs, 65534, 65534)
    said = _said_swappable(theirs / "runs")
    assert f"under {theirs}, which belongs to another user (uid 65534" in said
    assert "folder of your own" in said and "PRIME_RUNS_DIR" in said


@pytest.mark.parametrize("others", [[], ["bob"]])
def test_a_folder_writable_by_its_owners_private_group_alone_is_not_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, others: list[str]
) -> None:
    # Found by an adversarial review: Red Hat and Debian give each user a
    # group of their own with a umask of 002, so every folder they make
    # (~/.local holding the default runs directory, ~/experiments) is
    # group-writable, by that user alone. Every process's first run there
    # warned of other users who do not exist. A group with another member
    # is still warned of.
    folder = _folder(tmp_path / "experiments", 0o775)
    st = os.stat(folder)
    real = pwd.getpwuid(st.st_uid)
    user = pwd.struct_passwd((real.pw_name, "x", st.st_uid, st.st_gid, "", "/", "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: user)
    own = grp.struct_group((user.pw_name, "x", st.st_gid, [user.pw_name, *others]))
    monkeypatch.setattr(grp, "getgrgid", lambda gid: own)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=folder / "runs")
        run.finish()
    said = [w for w in warned if w.category is SwappableRunsDirWarning]
    assert len(said) == (1 if others else 0), [str(w.message) for w in said]


def _prime_runs_folder_others_can_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$XDG_STATE_HOME/prime-runs made 0777 (settings isolated): its path."""
    point_at(monkeypatch, tmp_path, None)
    folder = tmp_path / "state" / "prime-runs"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o777)
    monkeypatch.setenv("XDG_STATE_HOME", str(folder.parent))
    return folder


@pytest.mark.parametrize("runs_dir", ["default", "named elsewhere"])
def test_init_refuses_a_prime_runs_folder_others_can_write_above_the_default_runs_directory(
    runs_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whoever can write the folder holding "runs" can rename it away and put
    # their own in its place: held to the rule the runs directory is, as the
    # sync root's is. A runs directory named elsewhere has nothing to do with it.
    folder = _prime_runs_folder_others_can_write(tmp_path, monkeypatch)
    if runs_dir == "named elsewhere":
        named = tmp_path / "mine"
        run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=named)
        run.finish()
        assert run.journal_path is not None and run.journal_path.parent == named
        return
    with pytest.raises(UntrustedPathError) as raised:
        pr.init(environments=["gsm8k"], model="m", mode="offline")
    said = str(raised.value)
    assert str(folder) in said and "writable by other users" in said and "PRIME_RUNS_DIR" in said
    assert not (folder / "runs").exists()


def test_every_folder_init_creates_is_private_whatever_the_umask(tmp_path: Path) -> None:
    runs = tmp_path / "a" / "b" / "runs"
    code = (
        "import os, primeruns as pr\n"
        "os.umask(0)\n"
        f"run = pr.init(environments=['gsm8k'], model='m', mode='offline', runs_dir={str(runs)!r})"
        "\n"
        "run.finish()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", runs, *runs.iterdir()):
        assert os.stat(folder).st_mode & 0o777 == (0o700 if folder.is_dir() else 0o600), folder


def test_every_folder_of_the_default_runs_directory_is_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    code = (
        "import os, primeruns as pr\n"
        "os.umask(0)\n"
        "run = pr.init(environments=['gsm8k'], model='m', mode='offline')\n"
        "run.finish()\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PRIME", "XDG_")) and not k.endswith("_API_KEY")
    }
    env["HOME"] = str(home)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)
    state = home / ".local" / "state" / "prime-runs"
    created = [home / ".local", home / ".local" / "state", state, state / "runs"]
    for folder in (*created, *(state / "runs").iterdir()):
        assert os.stat(folder).st_mode & 0o777 == (0o700 if folder.is_dir() else 0o600), folder


def test_gc_refuses_a_journal_with_deeply_nested_folders_whole_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    for _ in range(2):
        run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
        run.finish()
    first, second = sorted(p for p in runs.iterdir() if not p.name.startswith("."))
    fd = os.open(first, os.O_RDONLY)
    for _ in range(2000):  # deeper than any path: made one level at a time
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    before = sorted(p.name for p in first.iterdir())
    code, out, err = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--force")
    assert code != 0 and "RecursionError" not in out + err
    assert first.name in out + err  # named, with why it was kept
    assert sorted(p.name for p in first.iterdir()) == before  # left whole, not half-deleted
    assert not second.exists()  # the next journal was still processed
    _remove_nested(first / "d")  # pytest's own clean-up of tmp_path would recurse on it


def _remove_nested(top: Path) -> None:
    """Remove a chain of single nested folders, deepest first, without recursion."""
    fds = [os.open(top, os.O_RDONLY)]
    while True:
        try:
            fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
        except FileNotFoundError:
            break
    while len(fds) > 1:
        os.close(fds.pop())
        os.rmdir("d", dir_fd=fds[-1])
    os.close(fds.pop())
    os.rmdir(top)


@pytest.mark.parametrize("recorded", ["spec", "binding"])
def test_a_journal_never_sends_the_key_to_a_platform_it_names_itself(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    recorded: str,
) -> None:
    """``sync`` ships a journal to the platform it was recorded for, with the
    key of this environment: a journal handed over by someone else (a copy of
    "their run") named where the user's key went, and the key was sent there
    on the first request. A platform other than the user's own (or this
    machine's: the local platform) is refused, naming it and ``--base-url``;
    passing that is the user's word for it."""
    runs = point_at(monkeypatch, tmp_path, None)
    elsewhere = "https://collector.attacker.invalid/api/v1"
    run = pr.init(
        environments=["gsm8k"],
        model="m",
        mode="offline",
        runs_dir=runs,
        base_url=elsewhere if recorded == "spec" else None,
    )
    run.finish()
    assert run.journal_path is not None
    if recorded == "binding":
        with Journal.open(run.journal_path) as journal:
            journal.update_meta({"platform": {"base_url": elsewhere, "run_id": "r"}})
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, _, err = cli(capsys, "sync", str(run.journal_path), "--timeout", "5")
    assert code == 2, err
    assert "collector.attacker.invalid" in err and "--base-url" in err
    assert API_KEY not in err


def test_a_journal_recorded_for_a_loopback_port_another_user_serves_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A journal recorded for a local platform (``primeruns serve`` on a
    compute node), copied to a shared login node and synced there, where a
    neighbour serves that loopback port: the user's key does not go to it.
    The sync names the port's user and the fix (``--base-url``), and
    nothing connects to the neighbour's socket."""
    with _neighbours_socket("127.0.0.1") as neighbour:
        neighbour.setblocking(False)
        port = neighbour.getsockname()[1]
        runs = point_at(monkeypatch, tmp_path, None)
        url = f"http://127.0.0.1:{port}/api/v1"
        run = pr.init(
            environments=["gsm8k"], model="m", mode="offline", runs_dir=runs, base_url=url
        )
        run.log_episodes(workloads.gsm8k(1))
        run.finish()
        assert run.journal_path is not None
        monkeypatch.setenv("PRIME_API_KEY", API_KEY)
        code, _, err = cli(capsys, "sync", str(run.journal_path), "--timeout", "5")
        assert code == 2, err
        assert f"127.0.0.1:{port}" in err and "another user's process" in err
        assert "--base-url" in err and API_KEY not in err
        with pytest.raises(BlockingIOError):
            neighbour.accept()  # no connection came


def test_a_sync_whose_loopback_platform_a_neighbour_takes_meanwhile_sends_it_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The port was checked when the sync started, and was the user's: the
    platform then went down mid-request (the sync retries), and a neighbour
    listened on its port meanwhile. The retry's new connection reached the
    neighbour, who got the key. Now each new connection is checked: nothing
    is sent on it, the sync stops at once (not retrying on), naming the
    URL, the neighbour's uid and ``--base-url``, and the journal keeps the
    run for a sync with ``--base-url``."""
    neighbour = _neighbours_unbound_socket()  # the port is the platform's for now
    own = socket.create_server(("127.0.0.1", 0))
    port = own.getsockname()[1]
    runs = point_at(monkeypatch, tmp_path, None)
    url = f"http://127.0.0.1:{port}/api/v1"
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs, base_url=url)
    run.log_episodes(workloads.gsm8k(1))
    run.finish()
    assert run.journal_path is not None
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    heard: list[bytes] = []  # what each connection to the neighbour carried
    done = threading.Event()

    def platform_then_neighbour() -> None:
        conn, _ = own.accept()  # the sync's first request, to the user's own platform
        with conn:
            conn.settimeout(10)
            conn.recv(65536)
            own.close()  # the platform goes down, and before it answers...
            neighbour.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            neighbour.bind(("127.0.0.1", port))  # ... the neighbour takes its port
            neighbour.listen()
        neighbour.settimeout(0.2)
        while not done.is_set():
            try:
                taken, _ = neighbour.accept()
            except TimeoutError:
                continue
            with taken:
                taken.settimeout(5)
                got = b""
                with contextlib.suppress(OSError):
                    while (chunk := taken.recv(65536)) and b"\r\n\r\n" not in got + chunk:
                        got += chunk
                    got += chunk
                heard.append(got)  # (then closed unanswered: a sync would retry)

    thread = threading.Thread(target=platform_then_neighbour, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        code, out, err = cli(capsys, "sync", str(run.journal_path), "--timeout", "60")
        took = time.monotonic() - started
    finally:
        done.set()
        thread.join(10)
        neighbour.close()
        own.close()
    assert heard, "the retry never reached the neighbour's port"
    assert all(API_KEY.encode() not in got for got in heard)
    assert heard == [b""] * len(heard)  # connected to, then closed: nothing sent
    assert code != 0, (out, err)
    said = out + err
    assert f"127.0.0.1:{port}" in said and f"uid {second_uid.ATTACKER[0]}" in said, said
    assert "--base-url" in said and API_KEY not in said
    assert took < 30  # stopped, not retried until the deadline
    with Journal.open(run.journal_path, owner=False) as journal:
        assert journal.get_meta("finalized") is None  # left for a sync with --base-url


def test_a_journal_recorded_for_the_local_platform_ships_there_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings the refusal above leaves alone: a journal recorded for
    this machine (a local platform), or for the platform the user's settings
    name, goes there without a flag."""
    runs = point_at(monkeypatch, tmp_path, None)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    for url in ("http://127.0.0.1:9/api/v1", "http://localhost:9/api/v1"):
        run = pr.init(
            environments=["gsm8k"], model="m", mode="offline", runs_dir=runs, base_url=url
        )
        run.finish()
        assert run.journal_path is not None
        with Journal.open(run.journal_path, owner=False) as journal:
            settings = journal_settings(journal)
            assert settings.origin == url.removesuffix("/api/v1")
            # The journal chose it: each new connection to it is checked again.
            assert settings.origin in settings.journal_chosen
            mine = journal_settings(journal, base_url=url)  # the user's choice: not checked
            assert mine.journal_chosen == ()
    monkeypatch.setenv("PRIME_BASE_URL", "https://mine.example.net/api/v1")
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    run.finish()
    assert run.journal_path is not None
    with Journal.open(run.journal_path, owner=False) as journal:
        settings = journal_settings(journal)
        assert settings.origin == "https://mine.example.net"
        assert settings.journal_chosen == ()


def _need_root_for_another_users_socket() -> None:
    """Skip where a socket of another user's cannot be made; fail under CI,
    which runs as root and must run the test."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("another user's socket needs root: CI runs as root and must run this")
        pytest.skip("another user's socket needs root")


def _neighbours_socket(host: str, port: int = 0) -> socket.socket:
    """A listening socket of another user's (uid from its creation)."""
    _need_root_for_another_users_socket()
    os.seteuid(second_uid.ATTACKER[0])
    try:
        return socket.create_server((host, port))
    finally:
        os.seteuid(0)


def _neighbours_unbound_socket() -> socket.socket:
    """A socket of another user's, not bound yet: its owner is its
    creator, whoever binds it later (a port then taken from this test)."""
    _need_root_for_another_users_socket()
    os.seteuid(second_uid.ATTACKER[0])
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    finally:
        os.seteuid(0)


def _an_address_not_loopback() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # (no packet: it picks the route's address)
            address: str = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_neighbour_on_another_address_of_the_port_does_not_refuse_the_users_own_platform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A neighbour serving the same port on the machine's network address
    (not loopback, nor every address) is not what a loopback URL reaches:
    the user's own local platform on 127.0.0.1 is not refused for it."""
    _need_root_for_another_users_socket()
    address = _an_address_not_loopback()
    if address is None:
        if os.environ.get("CI"):
            pytest.fail("no address of this machine but loopback: CI must run this")
        pytest.skip("no address of this machine but loopback")
    from primeruns.platform import resolve_settings
    from primeruns.ship import uplink

    with socket.create_server(("127.0.0.1", 0)) as own:
        port = own.getsockname()[1]
        with _neighbours_socket(address, port):
            mine = resolve_settings(api_key=API_KEY, base_url="https://example.invalid")
            uplink._refuse_unless_own("platform", f"http://127.0.0.1:{port}", mine)
        with _neighbours_socket("0.0.0.0", 0) as anywhere:  # (all addresses: it is reached)
            there = anywhere.getsockname()[1]
            with pytest.raises(JournalError, match="another user's process"):
                uplink._refuse_unless_own("platform", f"http://localhost:{there}", mine)


def test_a_journals_traces_url_with_a_port_only_httpx_reads_is_refused_not_a_crash() -> None:
    """A journal's Prime Traces URL is not checked as settings are: a port
    written ``+8000`` (which httpx reads as 8000, and ``urlsplit`` does not
    read) is refused with the fix named, not a traceback."""
    from primeruns.platform import resolve_settings
    from primeruns.ship import uplink

    mine = resolve_settings(api_key=API_KEY, base_url="https://example.invalid")
    with pytest.raises(JournalError, match="--base-url"):
        uplink._refuse_unless_own("Prime Traces", "http://127.0.0.1:+8000", mine)


def test_doctor_fails_on_the_prime_runs_folder_init_refuses_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The check that sends an online run to a refuge and refuses an offline
    # one: doctor, which checks the runs directory, said all was well there.
    folder = _prime_runs_folder_others_can_write(tmp_path, monkeypatch)
    code, out, _ = cli(capsys, "doctor")
    failed = [line for line in out.splitlines() if "FAIL" in line and str(folder) in line]
    assert code == 1 and len(failed) == 1
    assert "writable by other users" in failed[0] and "chmod 700" in failed[0]
    assert not folder.joinpath("runs").exists()


def test_init_checks_the_prime_runs_folder_of_a_default_runs_directory_under_a_relative_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # XDG_STATE_HOME relative: the default runs directory is taken from the
    # folder the run began in (made absolute), and the check compared it with
    # the relative one: never equal, so a prime-runs folder others can write
    # took the run's journal unchecked.
    point_at(monkeypatch, tmp_path, None)
    folder = tmp_path / "state" / "prime-runs"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o777)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", "state")
    with pytest.raises(UntrustedPathError) as raised:
        pr.init(environments=["gsm8k"], model="m", mode="offline")
    assert str(folder) in str(raised.value) and "writable by other users" in str(raised.value)
    assert not (folder / "runs").exists()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A platform that answers every request ``{}`` and notes its target."""

    targets: list[str] = []

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.targets.append(self.path)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PUT = do_PATCH = _answer

    def log_message(self, *args: object) -> None:
        pass


def test_a_run_id_a_journal_names_is_one_segment_of_the_path_it_is_sent_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A journal handed over by someone else names its platform run; sync
    put that id into each request's path as it was, so ``../../teams/T/x?a=``
    sent the user's key to a path of the journal's choosing (a server or a
    proxy resolves the dots), with a query of its choosing. The id is one
    path segment, escaped."""
    point_at(monkeypatch, tmp_path, None)
    _Recorder.targets = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = f"http://127.0.0.1:{server.server_address[1]}/api/v1"
        monkeypatch.setenv("PRIME_API_KEY", API_KEY)
        monkeypatch.setenv("PRIME_API_BASE_URL", api)
        monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "1")
        journal_path = _exported_run(tmp_path)
        with Journal.open(journal_path) as journal:
            bound = {"run_id": "../../teams/T/x?a=", "kind": "eval", "url": None, "base_url": api}
            journal.set_meta("platform", bound)
        cli(capsys, "sync", str(journal_path))
    finally:
        server.shutdown()
        server.server_close()
    assert _Recorder.targets
    for target in _Recorder.targets:
        path, _, query = target.partition("?")
        assert path.startswith("/api/v1/evaluations/..%2F..%2Fteams%2FT%2Fx%3Fa%3D"), target
        assert "a=" not in query.split("&"), target


def test_demo_keeps_nothing_in_a_directory_another_user_could_write_into(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``demo --dir DIR`` keeps the local platform's database and the demo's
    journals in DIR: a link there, or a folder others can write into, would
    hand them to whoever controls it. Refused before anything is started,
    the setting named."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    for given in (linked, shared):
        code, _out, err = cli(capsys, "demo", "--dir", str(given))
        assert code != 0
        assert f"the demo directory {given}" in err and "--dir" in err
    assert list(elsewhere.iterdir()) == [] and list(shared.iterdir()) == []
