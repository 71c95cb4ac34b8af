"""What ``sync --all`` and ``sync --watch`` pass over, they name with the
true reason: a journal whose data file cannot be read is not "an online
run", and a link planted among the runs is not one either. A watch pass,
every few seconds for days, names each once, and goes on past a journal
folder whose files are not what they should be (an ``origin.json`` that is
a folder, left by a copy gone wrong, is no origin: never an OSError that
ends the watch)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.commands import replay
from primeruns.journal import Journal
from primeruns.journal.origin import ORIGIN_FILE, Origin
from primeruns.spec import SPEC_KEY


def _two_offline_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str) -> list[Path]:
    """The journals of two offline training runs of one metrics row each,
    with the environment then set for ``sync`` (a key, the mode unset)."""
    runs = point_at(monkeypatch, tmp_path, url)
    monkeypatch.setenv("PRIME_RUNS_MODE", "offline")
    made = []
    for n in range(2):
        run = pr.init(
            name=f"t{n}",
            kind="train",
            model="m",
            team_id="team",
            api_key=API_KEY,
            base_url=url,
            runs_dir=runs,
        )
        run.log_metrics({"loss": 1.0}, step=0)
        run.finish()
        assert run.journal_path is not None
        made.append(run.journal_path)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    monkeypatch.delenv("PRIME_RUNS_MODE")
    return made


def _a_damaged_journal_and_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> tuple[Path, Path, Path]:
    """(runs dir, an offline run whose data.mdb is noise, a link to a good one beside it)."""
    good, damaged = _two_offline_runs(tmp_path, monkeypatch, url)
    (damaged / "data.mdb").write_bytes(os.urandom(8192))
    link = good.parent / "29990101-000000-0123abcd"
    link.symlink_to(good)
    return good.parent, damaged, link


def _watched(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, runs: Path, passes: int
) -> tuple[int, str, str]:
    """``sync --watch`` over ``runs``, interrupted (Ctrl-C) after ``passes`` passes."""
    done = []
    one_pass = replay._pass

    def counted(*args: Any, **kwargs: Any) -> int:
        done.append(one_pass(*args, **kwargs))
        if len(done) == passes:
            raise KeyboardInterrupt
        return done[-1]

    monkeypatch.setattr(replay, "_pass", counted)
    return cli(capsys, "sync", "--watch", "--interval", "0", "--runs-dir", str(runs))


def test_sync_all_names_the_true_reason_it_passes_a_journal_over(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs, damaged, link = _a_damaged_journal_and_a_link(tmp_path, monkeypatch, local_platform.url)
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(runs))
    assert "an online run" not in err, err
    assert f"{damaged.name}: skipped: cannot be read (data.mdb" in err, err
    assert f"--spec FILE {damaged}" in err, err
    assert f"{link.name}: skipped: not opened: " in err and "symbolic link" in err, err
    assert code == 0, out + err  # the good one shipped; nothing of the others can be
    [listed] = local_platform.runs()
    assert local_platform.run(listed["id"])["train_metrics"] == {"rows": 1, "steps": 1}


def test_a_watch_names_each_journal_it_passes_over_once(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs, damaged, link = _a_damaged_journal_and_a_link(tmp_path, monkeypatch, local_platform.url)
    code, out, err = _watched(capsys, monkeypatch, runs, passes=3)
    assert code == 130, out + err
    assert err.count(f"{damaged.name}: skipped: cannot be read (data.mdb") == 1, err
    assert err.count(f"{link.name}: skipped: not opened: ") == 1, err
    [listed] = local_platform.runs()
    assert local_platform.run(listed["id"])["train_metrics"] == {"rows": 1, "steps": 1}


def test_an_origin_file_that_is_a_folder_is_no_origin(tmp_path: Path) -> None:
    (tmp_path / ORIGIN_FILE).mkdir()
    assert Origin.read_beside(tmp_path) is None


def test_an_origin_file_nested_past_what_json_reads_is_no_origin(tmp_path: Path) -> None:
    (tmp_path / ORIGIN_FILE).write_text("[" * 60_000)
    assert Origin.read_beside(tmp_path) is None


def test_a_watch_goes_on_past_an_origin_file_that_is_a_folder(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, odd = _two_offline_runs(tmp_path, monkeypatch, local_platform.url)
    (odd / ORIGIN_FILE).unlink(missing_ok=True)
    (odd / ORIGIN_FILE).mkdir()
    code, out, err = _watched(capsys, monkeypatch, odd.parent, passes=2)
    assert code == 130, out + err
    assert len(local_platform.runs()) == 2, out + err


def test_a_watch_names_a_journal_again_once_it_came_back_and_forgets_those_gone(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A watch runs for days over a directory whose runs come and go: a
    journal passed over, taken away and copied back just as damaged is named
    again (it is news to whoever copied it), and what the watch remembers of
    journals no longer there is let go."""
    runs, damaged, link = _a_damaged_journal_and_a_link(tmp_path, monkeypatch, local_platform.url)
    good, aside = link.resolve(), tmp_path / "aside"
    remembered: list[tuple[set[Path], set[Path]]] = []
    real_changed = replay._changed

    def changed(args: Any, seen: dict[Path, Any], told: dict[Path, str]) -> Any:
        steps = real_changed(args, seen, told)
        remembered.append((set(seen), set(told)))
        if len(remembered) == 1:
            damaged.rename(aside)  # taken away before the second pass
            link.unlink()
        elif len(remembered) == 2:
            aside.rename(damaged)  # and back before the third
        return steps

    monkeypatch.setattr(replay, "_changed", changed)
    code, out, err = _watched(capsys, monkeypatch, runs, passes=3)
    assert code == 130, out + err
    assert err.count(f"{damaged.name}: skipped: cannot be read (data.mdb") == 2, err
    assert err.count(f"{link.name}: skipped: not opened: ") == 1, err
    seen_then, told_then = remembered[1]
    assert told_then == set() and seen_then <= {good}, remembered


def _watched_with_a_failing_listing(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    runs: Path,
    failing: tuple[str, ...],
) -> tuple[int, str, str, list[tuple[int, str]]]:
    """``sync --watch`` over ``runs`` for four passes, the functions of ``os``
    named in ``failing`` refusing to list ``runs`` in the second: (code, out,
    err, and the (pass, journal) of each look at a journal's state)."""
    synced: list[tuple[int, str]] = []
    real_status = replay._status_of
    real_changed = replay._changed
    passes = 0

    def status_of(path: Path) -> Any:
        synced.append((passes, path.name))
        return real_status(path)

    def changed(args: Any, seen: dict[Path, Any], told: dict[Path, str]) -> Any:
        nonlocal passes
        passes += 1
        return real_changed(args, seen, told)

    def refusing(real: Any) -> Any:
        def call(path: Any = ".") -> Any:
            if passes == 2 and Path(path) == runs:
                raise OSError(5, "Input/output error", str(path))
            return real(path)

        return call

    monkeypatch.setattr(replay, "_status_of", status_of)
    monkeypatch.setattr(replay, "_changed", changed)
    for name in failing:
        monkeypatch.setattr(os, name, refusing(getattr(os, name)))
    code, out, err = _watched(capsys, monkeypatch, runs, passes=4)
    return code, out, err, synced


def test_a_watch_keeps_what_it_knows_when_its_folder_cannot_be_listed_for_a_pass(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A runs directory on a network filesystem fails to list for a moment:
    the watch says so once, and the journals it synced are not synced again
    once the folder lists again (forgetting them, it asked the platform
    about each of thousands of runs again)."""
    runs = _two_offline_runs(tmp_path, monkeypatch, local_platform.url)[0].parent
    code, out, err, synced = _watched_with_a_failing_listing(
        capsys, monkeypatch, runs, ("scandir", "listdir")
    )
    assert code == 130, out + err
    assert {n for n, _ in synced} == {1}, synced  # synced in the first pass, never again
    assert err.count("cannot be listed (Input/output error)") == 1, err
    assert len(local_platform.runs()) == 2, out + err


def test_a_watch_keeps_what_it_knows_when_its_folder_lists_again_within_the_pass(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A hiccup that ends within a pass: the listing of the journals failed
    and the look at why then listed the folder. The pass must be judged by
    its own listing: judged by the second, it found the folder empty, forgot
    every journal and synced them all again the next pass."""
    runs = _two_offline_runs(tmp_path, monkeypatch, local_platform.url)[0].parent
    # os.scandir lists it all along
    code, out, err, synced = _watched_with_a_failing_listing(
        capsys, monkeypatch, runs, ("listdir",)
    )
    assert code == 130, out + err
    assert {n for n, _ in synced} == {1}, synced  # synced in the first pass, never again
    assert err.count("cannot be listed (Input/output error)") == 1, err


def _spec_damaged(path: Path) -> None:
    """The journal's spec replaced by bytes that are not JSON (a bit flip on disk)."""
    with Journal.open(path, owner=True) as journal:
        journal._tx.write(lambda txn: journal._tx.put_meta_bytes(txn, SPEC_KEY, b"not json"))


def test_sync_all_names_an_offline_journal_whose_spec_is_damaged_for_what_it_is(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its spec unreadable, whether it was opened offline cannot be read
    either. Before, ``sync --all`` called it "an online run" and sent its
    user to ``replay``, which cannot ship it without its spec either."""
    good, damaged = _two_offline_runs(tmp_path, monkeypatch, local_platform.url)
    _spec_damaged(damaged)
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(good.parent))
    assert "an online run" not in err, err
    assert f"{damaged.name}: skipped: its spec cannot be read" in err, err
    assert f"primeruns sync --spec FILE {damaged}" in err, err
    assert code == 0, out + err  # the good one shipped
    assert len(local_platform.runs()) == 1


def test_sync_with_the_runs_spec_ships_a_journal_whose_spec_is_not_json(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What ``ls``, ``show`` and ``sync --all`` say ships it: before, the
    user's ``--spec FILE`` was never used, ``sync`` stopped on "damaged
    journal" reading the spec it replaces (exit 4), and nothing shipped."""
    _, damaged = _two_offline_runs(tmp_path, monkeypatch, local_platform.url)
    _spec_damaged(damaged)
    spec = tmp_path / "spec.json"
    said = {"kind": "train", "name": "t1", "model": "m", "mode": "offline", "team_id": "team"}
    spec.write_text(json.dumps({**said, "base_url": local_platform.url}))
    code, out, err = cli(capsys, "sync", "--spec", str(spec), str(damaged))
    assert code == 0, out + err
    [shipped] = [r for r in local_platform.runs() if r["name"] == "t1"]
    assert local_platform.run(shipped["id"])["train_metrics"] == {"rows": 1, "steps": 1}


def test_replay_names_a_journal_whose_spec_is_damaged_and_what_ships_it(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, ``replay --all`` and ``replay PATH`` stopped on "damaged
    journal: meta key 'spec' ... unreadable" (exit 4), which says neither
    that its records are whole nor that ``--spec FILE`` ships it."""
    good, damaged = _two_offline_runs(tmp_path, monkeypatch, local_platform.url)
    _spec_damaged(damaged)
    code, out, err = cli(capsys, "replay", "--all", "--runs-dir", str(good.parent))
    assert "damaged journal" not in err, err
    assert f"{damaged.name}: skipped: its spec cannot be read" in err, err
    assert f"primeruns replay --spec FILE {damaged}" in err, err
    assert code == 0, out + err
    code, out, err = cli(capsys, "replay", str(damaged))
    assert code == 4, out + err
    assert "meta key" not in err and "its spec cannot be read" in err, err
    assert "--spec FILE ships it" in err, err
    spec = tmp_path / "spec.json"
    said = {"kind": "train", "name": "t1", "model": "m", "mode": "offline", "team_id": "team"}
    spec.write_text(json.dumps({**said, "base_url": local_platform.url}))
    code, out, err = cli(capsys, "replay", "--spec", str(spec), str(damaged))
    assert code == 0, out + err  # what it said ships it
    assert [r["name"] for r in local_platform.runs()] == ["t1"]
