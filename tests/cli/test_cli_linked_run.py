"""A run's folder in the runs directory replaced by a symbolic link (the run
moved to a bigger disk and linked back, a link a user made by hand).

prime-runs follows no link in a runs directory. ``ls`` listed such a link
as a damaged journal of 0 bytes that crashed (reading its lock file through
the link to say so), and ``gc --force --dry-run`` offered to delete it,
which ``gc --force`` then failed to do (exit 1). Now it is listed as not
opened, left alone, with why and what to do; ``gc`` keeps it, ``--force``
or not, with that reason: neither the link nor what it points to is
removed (a link is the user's, and what it points to may be anything).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import cli, named_offline_eval
from sdk_helpers import point_at

from primeruns.exceptions import JournalError, JournalLockedError
from primeruns.journal import EntryKind, Journal, listing
from primeruns.journal.lock import LOCK_NAME
from primeruns.journal.trust import UntrustedPathError


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _linked_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """(runs dir, a finished run's folder there, a link there to another
    finished run moved out of it)."""
    runs = point_at(monkeypatch, tmp_path, None)
    kept = named_offline_eval(runs, "kept")
    moved = named_offline_eval(runs, "moved")
    elsewhere = tmp_path / "bigger-disk" / moved.name
    elsewhere.parent.mkdir()
    shutil.move(moved, elsewhere)
    os.symlink(elsewhere, moved)
    return runs, kept, moved


def test_ls_lists_a_linked_run_folder_as_not_opened_never_as_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs, kept, link = _linked_run(tmp_path, monkeypatch)
    code, out, _ = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
    assert code == 0
    rows = {row["local_id"]: row for row in json.loads(out)}
    row = rows[link.name]
    assert (row["outcome"], row["shipping"], row["state"]) == ("not opened",) * 3
    [why] = row["damage"]
    assert why.startswith("not opened: ") and "symbolic link" in why and "left alone" in why
    assert "move its folder here" in why
    assert rows[kept.name]["outcome"] == "completed"

    code, out, _ = cli(capsys, "ls", "--runs-dir", str(runs))
    assert code == 0
    [line] = [ln for ln in out.splitlines() if ln.startswith(link.name)]
    assert line.split()[-2:] == ["-", "-"]  # size and age: unknown, not "0 bytes", "0s"
    assert "not opened" in line and "damaged" not in line and "crashed" not in line
    assert f"1 not opened, left alone: {link.name}" in out
    assert "with damage" not in out


@pytest.mark.parametrize("dry_run", [True, False])
def test_gc_keeps_a_linked_run_folder_and_what_it_points_to(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    dry_run: bool,
) -> None:
    runs, kept, link = _linked_run(tmp_path, monkeypatch)
    target = Path(os.readlink(link))
    before = _files(target)
    argv = ["gc", "--runs-dir", str(runs), "--older-than", "0", "--force", "--json"]
    code, out, err = cli(capsys, *argv, *(["--dry-run"] if dry_run else []))
    assert code == 0, err
    done = json.loads(out)
    assert [row["local_id"] for row in done["deleted"]] == [kept.name]
    assert done["failed"] == []
    [left] = [row for row in done["kept"] if row["local_id"] == link.name]
    assert left["state"] == "not opened" and left["reason"].startswith("not opened: ")
    assert "symbolic link" in left["reason"]
    assert kept.exists() is dry_run
    # The link stays (it is the user's), and so does every file it points to.
    assert link.is_symlink() and Path(os.readlink(link)) == target
    assert _files(target) == before

    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--force", "-v")
    assert code == 0
    assert f"keep    {link.name}: not opened: " in out
    assert link.is_symlink() and _files(target) == before


def test_replay_all_passes_over_a_linked_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # replay --all took the link for a crashed online run: its dry run said
    # it would register it and close it out as crashed, and the replay
    # itself failed on it (exit 2) for every run beside it. Nothing in the
    # runs directory is shipped through a link: it is passed over, with why.
    runs, _, link = _linked_run(tmp_path, monkeypatch)
    target = Path(os.readlink(link))
    before = _files(target)
    argv = ["replay", "--all", "--runs-dir", str(runs), "--base-url", "http://127.0.0.1:9"]
    for extra in (["--dry-run"], []):
        code, out, err = cli(capsys, *argv, *extra)
        assert code == 0, err
        assert link.name not in out
        assert f"{link.name}: skipped: not opened: " in err
        assert link.is_symlink() and _files(target) == before


def _swapped_once_checked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, put: Callable[[Path], None]
) -> None:
    """The run's folder moved aside right after gc's delete checked it, and
    ``put`` in its place."""
    checked = listing.check_dir

    def then_swapped(path: Path, what: str) -> None:
        checked(path, what)
        shutil.move(path, tmp_path / "moved-aside")
        put(path)

    monkeypatch.setattr(listing, "check_dir", then_swapped)


def test_gc_never_deletes_through_a_link_put_in_place_of_a_run_it_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gc's delete checked the run's folder was no link, then removed its
    # files by name through the runs directory: a folder replaced by a link
    # in between (a sync tool, a user's move) had the files of whatever the
    # link named removed in its place. It works in the folder it checked.
    runs = point_at(monkeypatch, tmp_path, None)
    run = named_offline_eval(runs, "run")
    other = named_offline_eval(tmp_path / "elsewhere", "other")
    before = _files(other)
    _swapped_once_checked(monkeypatch, tmp_path, lambda path: os.symlink(other, path))
    with pytest.raises((JournalError, OSError)):
        listing.delete_journal(run)
    assert _files(other) == before


def test_the_offline_dashboard_opens_nothing_through_a_linked_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The dashboard of the runs directory (``serve --runs-dir``) lists the
    # link as not opened, as ``ls`` does; its pages said so too, but each
    # request tried to open the journal through the link first and logged
    # the refusal with a traceback.
    import asyncio

    import httpx

    from primeruns.local.dashboard import offline_app

    runs, kept, link = _linked_run(tmp_path, monkeypatch)
    app = offline_app(runs)

    async def fetch(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get(path, timeout=60)

    with caplog.at_level("DEBUG"):
        index = asyncio.run(fetch("/"))
        page = asyncio.run(fetch(f"/dashboard/evaluations/{link.name}"))
        samples = asyncio.run(fetch(f"/dashboard/evaluations/{link.name}/samples/0"))
        kept_page = asyncio.run(fetch(f"/dashboard/evaluations/{kept.name}"))
    assert index.status_code == 200 and link.name in index.text
    assert page.status_code == 200 and "not opened" in page.text, page.status_code
    assert samples.status_code == 404, samples.status_code
    assert kept_page.status_code == 200
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_gc_locks_the_run_folder_it_checked_not_one_put_in_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gc's delete took the run's owner lock by path after opening the folder
    # it checked: the folder of a live run moved aside and a link to a
    # finished run put in its place in between, it locked the finished run's
    # lock file and deleted the live run's journal through the folder held.
    runs = point_at(monkeypatch, tmp_path, None)
    other = named_offline_eval(tmp_path / "elsewhere", "other")
    live = Journal.create(runs, local_id="live")  # its owner lock held, as a running run's
    path, aside = live.path, runs / "moved-aside"
    try:
        live.append(EntryKind.METRICS, [b'{"step":0}'])
        before = sorted(os.listdir(path))
        listed = listing._journal_files

        def then_swapped(at: Path, folder: int) -> tuple[list[str], list[tuple[str, list[str]]]]:
            found = listed(at, folder)
            os.rename(path, aside)
            os.symlink(other, path)
            return found

        monkeypatch.setattr(listing, "_journal_files", then_swapped)
        with pytest.raises(JournalLockedError):
            listing.delete_journal(path)
        assert sorted(os.listdir(aside)) == before
    finally:
        with contextlib.suppress(JournalError, OSError):
            live.close()


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_gc_deletes_nothing_in_a_folder_others_can_write_put_in_place_of_a_run_it_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    # gc's delete checked the run's folder (ours, nobody else can write into
    # it) by path, then opened it: a folder put in its place in between (a
    # sync tool's, a user's move) was never checked, and a run in a folder
    # other users can write into (theirs to plant files in, or to keep) had
    # its files removed. The folder opened is the one checked.
    runs = point_at(monkeypatch, tmp_path, None)
    run = named_offline_eval(runs, "run")
    other = named_offline_eval(tmp_path / "elsewhere", "other")
    other.chmod(mode)
    before = _files(other)
    _swapped_once_checked(monkeypatch, tmp_path, lambda path: os.rename(other, path))
    with pytest.raises(JournalError, match="writable by other users"):
        listing.delete_journal(run)
    assert _files(run) == before


@pytest.mark.parametrize("put", ["pipe", "nothing"])
def test_gc_takes_no_lock_file_put_in_place_of_a_live_runs_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, put: str
) -> None:
    # A live run's owner.lock replaced by a named pipe once gc's delete had
    # listed the folder: flock takes a pipe as it takes a file, so gc
    # locked the pipe, nobody's, and deleted the live run's journal. A lock
    # file that is no regular file is refused, as a link is. So with the
    # file removed (a tmp cleaner's): gc made a new one, took it, and
    # deleted the run whose producer held the removed one; it makes none.
    runs = point_at(monkeypatch, tmp_path, None)
    live = Journal.create(runs, local_id="live")  # its owner lock held, as a running run's
    try:
        live.append(EntryKind.METRICS, [b'{"step":0}'])
        before = sorted(os.listdir(live.path))
        listed = listing._journal_files

        def then_piped(at: Path, folder: int) -> tuple[list[str], list[tuple[str, list[str]]]]:
            found = listed(at, folder)
            os.unlink(at / LOCK_NAME)
            if put == "pipe":
                os.mkfifo(at / LOCK_NAME)
            return found

        monkeypatch.setattr(listing, "_journal_files", then_piped)
        refusal = UntrustedPathError if put == "pipe" else FileNotFoundError
        with pytest.raises(refusal):
            listing.delete_journal(live.path)
        assert sorted(os.listdir(live.path)) == [
            name for name in before if name != LOCK_NAME or put == "pipe"
        ]
    finally:
        with contextlib.suppress(JournalError, OSError):
            live.close()
