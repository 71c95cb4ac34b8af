"""Hostile neighbours as real users (#27): ``nobody`` plants journal-shaped
folders in a shared runs directory, and the victim, root or an unprivileged
uid with no capability, runs every command over it (tests/second_uid.py).

The same rows run in test_cli_trust.py with files root hands to ``nobody``;
here the attacker's files are made by the attacker's own process, and the
unprivileged victim meets what root never does: a folder it cannot look into.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import second_uid
from second_uid import ATTACKER, VICTIM, give, run_as

HERE = Path(__file__).resolve().parent
PRECIOUS = b"the victim's own data\n" * 400
VICTIMS = {"root": (0, 0), "unprivileged": VICTIM}


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """A team's scratch disk: ``scratch`` anybody may write into (sticky),
    and a private home for the attacker."""
    second_uid.require()
    top = give(tmp_path / "world", (0, 0), 0o755)
    give(top / "scratch", (0, 0), 0o1777)
    give(top / "attacker", ATTACKER, 0o700)
    return top


def _env(home: Path) -> dict[str, str]:
    return second_uid.env_of(home, LANG="C.UTF-8")


def _plant(world: Path, name: str, linked: str, target: Path, mode: str) -> Path:
    folder = world / "scratch" / name
    done = run_as(
        ATTACKER,
        [sys.executable, str(HERE / "trust_plant.py"), str(folder), linked, str(target), mode],
        reach=[world],
        env=_env(world / "attacker"),
    )
    assert done.returncode == 0, done.stderr
    assert os.lstat(folder).st_uid == ATTACKER[0]
    return folder


def _victim(world: Path, who: str, plan: dict[str, Any]) -> dict[str, Any]:
    home = world / "victim"
    done = run_as(
        VICTIMS[who],
        [sys.executable, str(HERE / "trust_victim.py"), json.dumps(plan)],
        reach=[world],
        env=_env(home),
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _victim_home(world: Path, who: str) -> Path:
    home = give(world / "victim", VICTIMS[who], 0o700)
    precious = home / "precious.txt"
    precious.write_bytes(PRECIOUS)
    os.chown(precious, *VICTIMS[who])
    return precious


@pytest.mark.parametrize("who", list(VICTIMS))
@pytest.mark.parametrize("linked", ["lock.mdb", "owner.lock", "data.mdb"])
def test_a_journal_nobody_planted_with_a_link_is_reported_and_never_written_through(
    world: Path, who: str, linked: str
) -> None:
    precious = _victim_home(world, who)
    planted = _plant(world, "20260101-000000-planted0", linked, precious, "755")
    scratch = world / "scratch"
    commands = [
        ["ls", "--runs-dir", str(scratch), "--json"],
        ["show", str(planted)],
        ["export", str(planted)],
        ["sync", str(planted)],
        ["replay", str(planted)],
        ["gc", "--runs-dir", str(scratch), "--older-than", "0", "--force"],
    ]
    report = _victim(world, who, {"watched": str(precious), "commands": commands})
    for step in report["steps"]:
        assert step["code"] != "raised", step
        assert step["intact"], step["argv"]
    rows = {row["local_id"]: row for row in json.loads(report["steps"][0]["out"])}
    assert any("not opened" in d for d in rows[planted.name]["damage"])
    assert precious.read_bytes() == PRECIOUS
    assert os.path.islink(planted / linked)  # gc left the attacker's folder alone


@pytest.mark.parametrize("who", list(VICTIMS))
def test_init_as_either_user_refuses_a_runs_directory_nobody_else_may_write(
    world: Path, who: str
) -> None:
    _victim_home(world, who)
    shared = give(world / "shared-runs", ATTACKER, 0o777)
    report = _victim(world, who, {"init_in": str(shared), "commands": []})
    assert report["init"] is not None and str(shared) in report["init"]
    assert "PRIME_RUNS_DIR" in report["init"]
    assert os.listdir(shared) == []


def test_a_private_folder_of_another_user_hides_none_of_the_users_own_journals(
    world: Path,
) -> None:
    """An unprivileged user cannot look into another user's 0700 folder: it
    is reported and skipped, and the user's own journals beside it are
    listed and shown (before, ``ls`` listed nothing at all)."""
    precious = _victim_home(world, "unprivileged")
    scratch = world / "scratch"
    planted = _plant(world, "20260101-000000-private0", "-", precious, "700")
    empty = give(scratch / "20260101-000000-private1", ATTACKER, 0o700)
    plan = {
        "own": str(scratch),
        "commands": [
            ["ls", "--runs-dir", str(scratch), "--json"],
            ["ls", "--runs-dir", str(scratch)],
            ["show", str(planted)],
        ],
    }
    report = _victim(world, "unprivileged", plan)
    own = report["own"]
    ls_json, ls_human, show_foreign = report["steps"]
    assert ls_json["code"] == 0, ls_json
    rows = {row["local_id"]: row for row in json.loads(ls_json["out"])}
    assert own in rows and rows[own]["damage"] == []
    for foreign in (planted, empty):
        assert any("not opened" in d for d in rows[foreign.name]["damage"]), rows
    assert own in ls_human["out"] and planted.name in ls_human["out"] + ls_human["err"]
    assert show_foreign["code"] not in (0, "raised"), show_foreign
    assert "another user" in show_foreign["err"] and "Traceback" not in show_foreign["err"]


def test_another_users_index_folders_are_not_listed_as_journals(world: Path) -> None:
    """The runs directory's own folders (``.runs``, the index by run every
    ``init`` writes; ``.primary``; ``.summaries``) are private: another
    user's, in a directory both list, cannot be looked into. They are no
    journal (no journal's name starts with a dot) and are passed over, not
    listed and counted as damaged journals."""
    _victim_home(world, "unprivileged")
    scratch = world / "scratch"
    for name in (".runs", ".primary", ".summaries"):
        give(scratch / name, ATTACKER, 0o700)
    plan = {
        "own": str(scratch),
        "commands": [
            ["ls", "--runs-dir", str(scratch), "--json"],
            ["ls", "--runs-dir", str(scratch)],
        ],
    }
    report = _victim(world, "unprivileged", plan)
    ls_json, ls_human = report["steps"]
    assert ls_json["code"] == 0, ls_json
    rows = {row["local_id"]: row for row in json.loads(ls_json["out"])}
    assert list(rows) == [report["own"]], rows
    assert ".runs" not in ls_human["out"] + ls_human["err"]
    assert "damage" not in ls_human["out"] + ls_human["err"], ls_human
