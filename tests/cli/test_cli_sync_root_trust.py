"""The sync root (``$XDG_STATE_HOME/prime-runs/synced``) is trusted as a runs
directory is: a real folder of the user's own that nobody else can write into.

Sync journals hold a run's registration and acknowledged offsets, and the
records beside them (``.shipped``, ``run-keys``) say which platform run a
journal ships to and how far it shipped: planted or swapped by another user,
records would land in the wrong run or be skipped, and whatever the user
synced would be theirs to read. A root (or the ``prime-runs`` folder holding
it) that is a link, open to others, or another user's is refused before
anything is read or made in it, naming the folder and the fix.

Another user's folder needs another uid: those cases run as root (as CI
does) and are skipped elsewhere, failing under CI (``second_uid.require``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import second_uid
from cli_helpers import cli, offline_copy
from sdk_helpers import API_KEY, point_at

from primeruns.journal.trust import UntrustedPathError
from primeruns.settings import default_sync_root
from primeruns.ship import run_keys, sync_records
from primeruns.ship.mirror import snapshot

NOBODY = 65534


def _spoil(folder: Path, how: str, tmp_path: Path) -> Path | None:
    """Make ``folder`` untrusted ``how``; the folder a link points at, if any."""
    if how == "link":
        target = tmp_path / "elsewhere"
        target.mkdir(mode=0o700)
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.symlink(target, folder)
        return target
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if how == "open":
        os.chmod(folder, 0o777)
    elif how == "another user's":
        second_uid.require()
        os.chown(folder, NOBODY, NOBODY)
    return None


HOWS = ["link", "open", "another user's"]
WHY = {
    "link": "symbolic link",
    "open": "writable by other users",
    "another user's": "belongs to another user",
}


@pytest.mark.parametrize("which", ["synced", "prime-runs"])
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("command", ["sync", "replay"])
def test_sync_refuses_an_untrusted_sync_root_naming_it_and_makes_nothing_there(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    which: str,
    how: str,
    command: str,
) -> None:
    copy = offline_copy(tmp_path, monkeypatch)
    root = default_sync_root()
    folder = root if which == "synced" else root.parent
    target = _spoil(folder, how, tmp_path)
    before = sorted(os.listdir(target or folder))
    code, out, err = cli(capsys, command, str(copy), "--timeout", "5")
    assert code == 2, (out, err)
    assert str(folder) in err and WHY[how] in err, err
    assert "XDG_STATE_HOME" in err  # the fix is named
    assert "Traceback" not in out + err and API_KEY not in out + err
    assert sorted(os.listdir(target or folder)) == before  # nothing made or read there


@pytest.mark.parametrize("how", HOWS)
def test_the_records_beside_sync_journals_are_never_read_from_an_untrusted_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A record planted there would send a run's records to another run
    (``run_id``) or skip them (``imported_upto``)."""
    point_at(monkeypatch, tmp_path, None)
    root = default_sync_root()
    target = _spoil(root, how, tmp_path)
    where = target or root
    (where / ".shipped").mkdir()
    (where / ".shipped" / "run1.json").write_text('{"run_id": "theirs", "closed": true}')
    with pytest.raises(UntrustedPathError, match="XDG_STATE_HOME"):
        sync_records.recorded(root, "run1")
    with pytest.raises(UntrustedPathError):
        sync_records.nothing_new(root, "run1", 1)
    with pytest.raises(UntrustedPathError):
        run_keys.lookup("key", "https://api.example/api/v1")
    with pytest.raises(UntrustedPathError):
        run_keys.remember("key", "https://api.example/api/v1", {"run_id": "r"})
    with pytest.raises(UntrustedPathError):
        sync_records.remember(root, "run2", run_id="mine")
    assert not (where / ".shipped" / "run2.json").exists()
    assert not (where / "run-keys").exists()


def test_a_record_that_is_a_link_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_at(monkeypatch, tmp_path, None)
    root = default_sync_root()
    sync_records.remember(root, "run1", run_id="mine")
    planted = tmp_path / "planted.json"
    planted.write_text('{"run_id": "theirs"}')
    record = sync_records.record_path(root, "run1")
    record.unlink()
    os.symlink(planted, record)
    with pytest.raises(UntrustedPathError, match="symbolic link"):
        sync_records.recorded(root, "run1")


def test_a_record_nested_past_what_json_reads_is_read_as_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an adversarial review: a record beside the sync journals
    nested 100,000 levels deep raised RecursionError out of every sync and
    every requeued job's finish() that read it, where an unreadable record
    is read as none."""
    point_at(monkeypatch, tmp_path, None)
    root = default_sync_root()
    sync_records.remember(root, "run1", run_id="mine")
    sync_records.record_path(root, "run1").write_text("[" * 100_000)
    assert sync_records.recorded(root, "run1") is None
    assert not sync_records.nothing_new(root, "run1", 1)


# What a damaged record's ``left`` may say: each a count that is none.
_DAMAGED_LEFT = {
    "too long to print": "{" + ", ".join(f'"s{i}": {"9" * 4299}' for i in range(20)) + "}",
    "negative": '{"traces": -1}',
    "a boolean": '{"traces": true}',
    "NaN": '{"traces": NaN}',
}


@pytest.mark.parametrize("left", list(_DAMAGED_LEFT.values()), ids=list(_DAMAGED_LEFT))
def test_a_record_whose_left_is_damaged_refuses_the_sync_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    left: str,
) -> None:
    """Found by an adversarial review: a record beside the sync journals
    whose ``left`` (what a sync or replay left to ship) held counts summing
    to more digits than Python prints raised ValueError out of ``sync`` and
    ``sync --all`` (a traceback, the other journals not synced), as out of a
    requeued job's ``init()``, which reads it too. A count that is none is
    damage: the sync journal is gone with records left, and the sync is
    refused naming the sync journal to restore."""
    copy = offline_copy(tmp_path, monkeypatch)
    root = default_sync_root()
    sync_records.remember(root, copy.name, run_id="r1", imported_upto=1, closed=True)
    sync_records.record_path(root, copy.name).write_text(
        '{"run_id": "r1", "imported_upto": 1, "closed": true, "left": ' + left + "}"
    )
    assert not sync_records.nothing_new(root, copy.name, 1)
    with pytest.raises(sync_records.LeftUnshipped, match="records left to ship"):
        sync_records.refuse_if_shipped(root, copy.name)
    code, _, err = cli(capsys, "sync", str(copy))
    assert code != 0 and "records left to ship" in err and f"Restore {root}" in err, err
    code, _, err = cli(capsys, "sync", "--all", "--runs-dir", str(copy.parent))
    assert code != 0 and "records left to ship" in err and f"Restore {root}" in err, err


def test_the_sync_root_sync_makes_is_private_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = offline_copy(tmp_path, monkeypatch)
    root = default_sync_root()
    previous = os.umask(0)
    try:
        with snapshot(copy, root):
            pass
        sync_records.remember(root, "run1", run_id="mine")
        with run_keys.held("key", "https://api.example/api/v1"):
            pass
    finally:
        os.umask(previous)
    for folder in (root.parent, root, root / ".shipped", root / "run-keys"):
        assert os.stat(folder).st_mode & 0o777 == 0o700, folder


def test_a_sync_root_in_a_sticky_shared_state_folder_is_fine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``XDG_STATE_HOME=/tmp`` (world-writable, sticky): only the folders
    prime-runs makes there must be the user's own, as for a runs directory."""
    copy = offline_copy(tmp_path, monkeypatch)
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setenv("XDG_STATE_HOME", str(shared))
    code, out, err = cli(capsys, "sync", str(copy), "--timeout", "1")
    assert "sync root" not in err and "state folder" not in err, err
    root = shared / "prime-runs" / "synced"
    assert (root / copy.name).is_dir(), (code, out, err)  # its sync journal was made


def test_sync_of_a_link_to_a_journal_is_refused_as_a_journal_directory_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A journal's directory is never reached through a link (``trust``): a
    link named on the command line is refused, not followed into wherever it
    points (another user's folder, say), and nothing is imported from it."""
    copy = offline_copy(tmp_path, monkeypatch)
    link = tmp_path / "login" / "link"
    os.symlink(copy, link)
    code, out, err = cli(capsys, "sync", str(link), "--timeout", "5")
    assert code == 2, (out, err)
    assert str(link) in err and "symbolic link" in err and "real directory" in err, err
    assert not (default_sync_root() / copy.name).exists()


def test_a_listing_reads_no_sync_journal_through_a_linked_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ls`` describes a copy by its sync journal: one found through a root
    that became a link (to a folder anyone may fill) is not taken for it."""
    from primeruns.reports import statuses

    copy = offline_copy(tmp_path, monkeypatch)
    cli(capsys, "sync", str(copy), "--timeout", "1")  # (its sync journal is made, then it fails)
    [status] = statuses(copy.parent)
    assert status.synced is not None
    root = default_sync_root()
    moved = tmp_path / "moved"
    root.rename(moved)
    os.symlink(moved, root)
    [status] = statuses(copy.parent)
    assert status.synced is None


def test_gc_prunes_no_sync_journal_in_a_root_others_can_write_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = offline_copy(tmp_path, monkeypatch)
    cli(capsys, "sync", str(copy), "--timeout", "1")  # (its sync journal is made, then it fails)
    root = default_sync_root()
    os.chmod(root, 0o777)
    _, out, err = cli(capsys, "gc", "--runs-dir", str(copy.parent), "--older-than", "0", "--force")
    assert "not pruning sync journals" in err and str(root) in err, (out, err)
    assert "Traceback" not in out + err
    assert (root / copy.name / "data.mdb").is_file()  # left where it was


def test_a_requeued_jobs_uplink_takes_nothing_over_through_an_untrusted_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from primeruns.ship.family import parent_binding
    from primeruns.ship.handover import take_over

    copy = offline_copy(tmp_path, monkeypatch)
    root = default_sync_root()
    _spoil(root, "open", tmp_path)
    assert take_over([copy], root, "later") == []
    assert str(root) in caplog.text and "writable by other users" in caplog.text
    assert os.listdir(root) == []  # no snapshot, no sync journal made there
    with pytest.raises(UntrustedPathError):
        parent_binding("parent-id", None)  # its registration is not looked up there


@pytest.mark.parametrize("how", ["another user's", "a link of another user's", "open, not sticky"])
def test_sync_refuses_a_state_folder_another_user_can_move_the_root_out_of(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    """Whoever owns ``XDG_STATE_HOME`` (or the link it is), or may write in
    it with no sticky bit, can move the user's ``prime-runs`` folder away or
    swap it between a check and a use, however private that folder is: the
    records of what shipped gone (a journal shipped twice), or another's in
    their place. ``XDG_STATE_HOME=/tmp/$USER-state``, made first by another
    user, is such a folder."""
    copy = offline_copy(tmp_path, monkeypatch)
    theirs = tmp_path / "theirs"
    if how == "open, not sticky":
        theirs.mkdir(mode=0o700)
        os.chmod(theirs, 0o777)
        state = theirs
    else:
        second_uid.require()
        second_uid.give(theirs, (NOBODY, NOBODY), 0o1777)
        state = theirs
        if how == "a link of another user's":
            state = tmp_path / "state"
            os.symlink(theirs, state)
            os.lchown(state, NOBODY, NOBODY)
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    code, out, err = cli(capsys, "sync", str(copy), "--timeout", "5")
    assert code == 2, (out, err)
    assert str(state) in err and "XDG_STATE_HOME" in err, err
    assert "Traceback" not in out + err and API_KEY not in out + err
    assert os.listdir(theirs) == []  # no prime-runs folder made in it


def test_a_state_folder_that_is_a_link_of_the_users_own_is_fine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``~/.local/state`` linked to a scratch disk's private folder (for its
    quota): the user's link to the user's folder, as honest as the folder."""
    copy = offline_copy(tmp_path, monkeypatch)
    scratch = tmp_path / "scratch" / "me"
    scratch.mkdir(mode=0o700, parents=True)
    state = tmp_path / "home" / ".local" / "state"
    state.parent.mkdir(parents=True)
    os.symlink(scratch, state)
    code, out, err = cli(capsys, "sync", str(copy), "--timeout", "1")
    assert "state folder" not in err and "XDG_STATE_HOME" not in err, err
    assert (scratch / "prime-runs" / "synced" / copy.name).is_dir(), (code, out, err)


def test_a_copy_swapped_for_a_link_once_checked_is_not_read_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a folder others may write in (a project's group folder, no sticky
    bit), the copy checked may be renamed away and a link to another's
    journal put in its place before its files are read: the snapshot is of
    the folder checked, whatever its name holds by then, or of nothing."""
    from primeruns.exceptions import JournalError
    from primeruns.ship import workfolders

    copy = offline_copy(tmp_path, monkeypatch)
    planted = tmp_path / "planted"
    shutil.copytree(copy, planted)  # same names, sizes and times; other bytes
    data = planted / "data.mdb"
    stamp = os.stat(data)
    with open(data, "r+b") as handle:
        handle.write(b"\xff" * 64)
    os.utime(data, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    real_mkdtemp = workfolders.tempfile.mkdtemp

    def swapped(*args: object, **kwargs: object) -> str:
        # The attacker's move, between the check and the first read.
        if not copy.is_symlink():
            copy.rename(tmp_path / "moved")
            os.symlink(planted, copy)
        return real_mkdtemp(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(workfolders.tempfile, "mkdtemp", swapped)
    try:
        with snapshot(copy, default_sync_root()) as taken:
            read = (taken / "data.mdb").read_bytes()
    except JournalError:
        return  # refused: nothing read through the link
    assert read == (tmp_path / "moved" / "data.mdb").read_bytes()


@pytest.mark.parametrize("state", ["sticky scratch", "unset"])
def test_an_unprivileged_users_sync_root_in_a_shared_sticky_or_default_state_folder_is_fine(
    tmp_path: Path, state: str
) -> None:
    """Not root: ``/tmp`` (root's, sticky) as ``XDG_STATE_HOME``, or none set
    (``~/.local/state``, made private), takes the user's sync root."""
    second_uid.require()
    world = second_uid.give(tmp_path / "world", (0, 0), 0o755)
    scratch = second_uid.give(world / "scratch", (0, 0), 0o1777)
    home = second_uid.give(world / "home", second_uid.VICTIM, 0o700)
    env = second_uid.env_of(home)
    if state == "sticky scratch":
        env["XDG_STATE_HOME"] = str(scratch)
    code = (
        "from primeruns.ship.copies import make_sync_root, sync_root\n"
        "print(make_sync_root(sync_root(), 'run-keys'))\n"
    )
    done = second_uid.run_as(
        second_uid.VICTIM, [sys.executable, "-c", code], reach=[world], env=env
    )
    assert done.returncode == 0, done.stderr
    made = Path(done.stdout.strip())
    assert made.is_dir() and os.stat(made).st_uid == second_uid.VICTIM[0]
