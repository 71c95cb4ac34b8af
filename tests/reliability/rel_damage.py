"""Damaged-journal trials shared by ``test_rel_damage`` and ``tools/torture``:
a clean offline journal, a bit-flipped copy of it, and one shipping trial."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import rel_helpers as rh
import rel_torture as rt

import primeruns as pr
from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind
from primeruns.local import LocalPlatform
from primeruns.ship.backlog import ship_journal

PAGE = 4096


def offline_journal(tmp: Path, n: int = 60) -> tuple[Path, list[str]]:
    """A finished offline eval run of ``n`` small episodes; returns its journal."""
    with rt.sdk_env("http://127.0.0.1:9", tmp / "home"):
        run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=tmp / "runs")
        ids = [f"ep-{i:04d}" for i in range(n)]
        for i in range(0, n, 4):
            run.log_episodes(
                [
                    {"id": x, "traces": [], "pad": "x" * (300 + 37 * j)}
                    for j, x in enumerate(ids[i : i + 4])
                ]
            )
        run.finish()
    assert run.journal_path is not None
    return run.journal_path, ids


def damaged_copy(src: Path, dst: Path, rng: random.Random, flips: int) -> Path:
    shutil.copytree(src, dst)
    data = dst / "data.mdb"
    raw = bytearray(data.read_bytes())
    for _ in range(flips):
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    data.write_bytes(bytes(raw))
    return dst


def intact_ids(path: Path) -> set[str] | None:
    """The episode ids a read-only open still reads, or None if it cannot be opened."""
    try:
        return {r["id"] for r in rh.journal_records(path, EntryKind.EPISODE)}
    except JournalError:
        return None


def damage_trial(seed: int, src: Path, work: Path, lp: LocalPlatform) -> rt.Trial:
    """Flip 1-16 random bits of a copy, then ship it: intact records land
    once (all of them once the original is synced after, where the copy is
    left open behind it)."""
    rng = random.Random(seed)
    trial = rt.Trial("damage", seed, "flips")
    path = damaged_copy(src, work / f"flip-{seed}", rng, rng.randint(1, 16))
    trial.faults += 1
    intact = intact_ids(path)
    try:
        with rt.sdk_env(lp.url, work / f"home-{seed}"):  # each copy synced on its own
            report = ship_journal(path, settings=rt._settings(lp.url), timeout=60)
    except JournalError as exc:  # refused as a whole: fine, if it says why
        if not str(exc):
            trial.fail("JournalError without a message")
        return trial
    except Exception as exc:
        trial.crashes += 1
        trial.fail(f"ship_journal raised {type(exc).__name__}: {exc}")
        return trial
    if report.run_id is None:
        return trial  # could not register (damaged spec): reported in report.errors
    if report.left_open is not None and "its original" in report.left_open:
        # A flip damaged an entry its original (here, intact) holds: the run
        # is left open for it, and syncing the original brings every record.
        try:
            with rt.sdk_env(lp.url, work / f"home-{seed}"):
                report = ship_journal(src, settings=rt._settings(lp.url), timeout=60)
        except Exception as exc:
            trial.crashes += 1
            trial.fail(f"ship_journal of the original raised {type(exc).__name__}: {exc}")
            return trial
        intact = intact_ids(src)
        if report.left_open is not None or not report.finalized:
            trial.fail(f"the original did not close the run: {report.left_open}")
    stored = rh.platform_episode_ids(lp.data_dir, report.run_id)
    dups = sum(c - 1 for c in stored.values() if c > 1)
    trial.duplicates += dups
    trial.records += len(stored)
    if dups:
        trial.fail(f"{dups} duplicates")
    if intact is not None and intact - set(stored) and not report.pending and not report.errors:
        trial.lost += len(intact - set(stored))
        trial.fail(f"{len(intact - set(stored))} intact records not shipped, and nothing reported")
    return trial
