"""Damaged journals (issue #8 §4): random byte flips, truncation at every page
boundary, deleted lock files, a journal from a newer format version. The SDK
and the CLI report the damage precisely and ship what is intact; nothing
crashes (no exception other than the documented JournalError family, and no
traceback from the CLI).

Longer campaign: ``python tools/torture/damage_torture.py --trials 300 --seed 0``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import procs
import pytest
import rel_damage as rd
import rel_helpers as rh
import rel_torture as rt

from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, Journal
from primeruns.journal.meta import K_FORMAT
from primeruns.local import LocalPlatform

PAGE = rd.PAGE


@pytest.fixture(scope="module")
def clean_journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    return rd.offline_journal(tmp_path_factory.mktemp("clean"))


@pytest.mark.parametrize("seed", range(6))
def test_bit_flips_never_crash_and_intact_records_ship_once(
    seed: int,
    clean_journal: tuple[Path, list[str]],
    shared_platform: LocalPlatform,
    tmp_path: Path,
) -> None:
    trial = rd.damage_trial(seed, clean_journal[0], tmp_path, shared_platform)
    assert trial.ok, trial.problems


def test_truncation_at_every_page_boundary_is_reported_never_crashes(
    clean_journal: tuple[Path, list[str]], tmp_path: Path
) -> None:
    src, ids = clean_journal
    size = (src / "data.mdb").stat().st_size
    assert size // PAGE > 4
    for pages in range(0, size // PAGE):
        path = tmp_path / f"t{pages}"
        shutil.copytree(src, path)
        with (path / "data.mdb").open("r+b") as f:
            f.truncate(pages * PAGE)
        try:
            journal = Journal.open(path, owner=False)
        except JournalError as exc:
            assert str(path) in str(exc) or "journal" in str(exc)
            continue
        try:
            damage = journal.damage()
            got = journal.read(0, kinds={EntryKind.EPISODE}, max_entries=10**6)
            read_ids = [__import__("json").loads(e.payload)["id"] for e in got.entries]
            assert set(read_ids) <= set(ids) and len(read_ids) == len(set(read_ids))
            if len(read_ids) < len(ids):  # something is missing: it must be reported
                assert damage or got.damaged, f"truncated to {pages} pages: loss not reported"
        finally:
            journal.close()
        shutil.rmtree(path)


def test_deleted_lock_files_do_not_stop_a_replay(
    clean_journal: tuple[Path, list[str]], shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    src, ids = clean_journal
    path = tmp_path / "nolock"
    shutil.copytree(src, path)
    for name in ("lock.mdb", "owner.lock"):
        (path / name).unlink(missing_ok=True)
    trial = rt.Trial("damage", 0, "no-lock-files")
    rt.replay(trial, path, shared_platform.url, tmp_path / "home")
    rt.check_run(trial, shared_platform, path, ids, [], max_unacked=0, expect_status="COMPLETED")
    assert trial.ok, trial.problems


def _cli(*args: str, env_home: Path) -> subprocess.CompletedProcess[str]:
    env = rh.isolated_env(env_home, {"PRIME_API_KEY": rt.KEY})
    return subprocess.run(
        [sys.executable, "-m", "primeruns", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_a_newer_format_is_refused_with_the_fix_by_sdk_and_cli(
    clean_journal: tuple[Path, list[str]], tmp_path: Path
) -> None:
    path = tmp_path / "future"
    shutil.copytree(clean_journal[0], path)
    with Journal.open(path, owner=True) as journal:
        journal.set_meta(K_FORMAT, 99)
    with pytest.raises(JournalError, match="upgrade prime-runs"):
        Journal.open(path, owner=False)
    for command in (
        ["replay", str(path)],
        ["show", str(path)],
        ["ls", "--runs-dir", str(tmp_path)],
    ):
        result = _cli(*command, env_home=tmp_path)
        assert "Traceback" not in result.stderr, (command, result.stderr[-2000:])
    result = _cli("replay", str(path), env_home=tmp_path)
    assert result.returncode != 0 and "upgrade" in (result.stdout + result.stderr)


@pytest.mark.parametrize("seed", range(3))
def test_cli_on_a_bit_flipped_journal_reports_and_never_tracebacks(
    seed: int, clean_journal: tuple[Path, list[str]], tmp_path: Path
) -> None:
    path = rd.damaged_copy(clean_journal[0], tmp_path / "j", random.Random(seed), 8)
    for command in (["show", str(path)], ["doctor"], ["ls", "--runs-dir", str(tmp_path)]):
        result = _cli(*command, env_home=tmp_path)
        assert "Traceback" not in result.stderr, (command, result.stderr[-2000:])


_SEED_149 = """
import sys, tempfile
from pathlib import Path
sys.path[:0] = [{here!r}, {tests!r}]
import rel_damage as rd
from primeruns.local import LocalPlatform
tmp = Path(tempfile.mkdtemp())
lp = LocalPlatform(tmp / "p").start()
try:
    clean, _ = rd.offline_journal(tmp / "clean")
    trial = rd.damage_trial(149, clean, tmp, lp)
    print("ok" if trial.ok else trial.problems)
finally:
    lp.stop()
"""


@pytest.mark.slow
def test_damage_seed_149_ships_promptly_without_crashing(tmp_path: Path) -> None:
    code = _SEED_149.format(here=str(rh.HERE), tests=str(rh.HERE.parent))
    env = rh.isolated_env(tmp_path / "home")
    # Its own session, so a hang is cleaned up with the platform it started.
    proc = procs.start(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("shipping the damaged journal hung")
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert result.returncode == 0, result.stderr[-1500:]
    assert result.stdout.strip().endswith("ok")


_EVERY_PAGE = """
import sys
from pathlib import Path
from primeruns.journal import EntryKind, Journal
src, work = Path(sys.argv[1]), Path(sys.argv[2])
raw = (src / "data.mdb").read_bytes()
for page in range(len(raw) // {page}):
    copy = work / f"zeroed-{{page}}"
    copy.mkdir()
    damaged = bytearray(raw)
    damaged[page * {page} : (page + 1) * {page}] = bytes({page})
    (copy / "data.mdb").write_bytes(bytes(damaged))
    print(f"page {{page}}", flush=True)
    try:
        journal = Journal.open(copy, owner=False)
    except Exception as exc:  # the documented JournalError family only
        assert type(exc).__name__.startswith("Journal"), repr(exc)
        continue
    try:
        journal.read(0, kinds=set(EntryKind), max_entries=10**6, max_bytes=1 << 30)
        journal.damage()
    finally:
        journal.close()
print("done", flush=True)
"""


def test_one_zeroed_page_anywhere_never_takes_the_reader_down(
    clean_journal: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """Every page of a journal zeroed in turn, each copy opened and read in
    full by one process. Before the probe, LMDB aborted that process (SIGABRT
    on ``Assertion 'IS_LEAF(mp)' failed``) for most interior pages."""
    script = _EVERY_PAGE.format(page=PAGE)
    result = subprocess.run(
        [sys.executable, "-c", script, str(clean_journal[0]), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    last = (result.stdout.strip().splitlines() or ["(nothing)"])[-1]
    assert result.returncode == 0, (result.returncode, last, result.stderr[-1500:])
    assert last == "done"


def test_the_cli_survives_a_zeroed_interior_page(
    clean_journal: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """``show`` on copies with one interior page zeroed (before the probe, most
    of these aborted the CLI in LMDB's C code with no Python error)."""
    raw = (clean_journal[0] / "data.mdb").read_bytes()
    for page in range(2, min(len(raw) // PAGE, 14)):
        path = tmp_path / f"zeroed-{page}"
        shutil.copytree(clean_journal[0], path)
        damaged = bytearray(raw)
        damaged[page * PAGE : (page + 1) * PAGE] = bytes(PAGE)
        (path / "data.mdb").write_bytes(bytes(damaged))
        result = _cli("show", str(path), env_home=tmp_path)
        assert result.returncode >= 0, (page, result.returncode, result.stderr[-1500:])
        assert "Traceback" not in result.stderr, (page, result.stderr[-2000:])
