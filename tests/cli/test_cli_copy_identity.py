"""A copy is synced into the sync journal its local id names only if it is a
copy of the journal that sync journal was made from. Both hold an origin
(where the journal was written) and a copy of another journal is refused
when the two differ; but where either origin is missing (a journal written
before origins were recorded, or a meta value lost to damage) nothing was
compared, and a copy of another run that claimed the same local id had its
entries past the sync journal's end shipped into the first run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import workloads
from cli_helpers import UNREACHABLE, cli
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.journal import Journal
from primeruns.journal.lock import LOCK_NAME
from primeruns.journal.meta import K_LOCAL_ID
from primeruns.journal.origin import K_ORIGIN


def _offline_eval(runs: Path, url: str, name: str, episodes: int) -> pr.Run:
    run = pr.init(
        kind="eval",
        name=name,
        environments=["gsm8k"],
        model="m",
        mode="offline",
        runs_dir=runs,
        base_url=url,
    )
    logged = workloads.gsm8k(episodes)
    for index, episode in enumerate(logged):
        episode["id"] = f"{name}-{index}"
    run.log_episodes(logged)
    return run


@pytest.fixture
def two_runs(local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[pr.Run]:
    """Two offline evaluations, of 2 and 6 episodes, then the key set for sync."""
    url = local_platform.url
    runs = point_at(monkeypatch, tmp_path, url)
    made = [_offline_eval(runs, url, "first", 2), _offline_eval(runs, url, "other", 6)]
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    return made


def test_a_copy_of_another_run_claiming_a_synced_local_id_is_not_shipped_into_that_run(
    two_runs: list[pr.Run], capsys: pytest.CaptureFixture[str], tmp_path: Path, local_platform: Any
) -> None:
    # The first journal was written before origins were recorded, on another
    # host (its lock file names it): a copy, synced while the platform is
    # out of reach, its sync journal left holding its records, and no
    # origin to compare a later copy with. A copy of another run claiming
    # its local id had its entries past the sync journal's end shipped into
    # the first run.
    first, other = two_runs
    first.finish()
    other.finish()
    assert first.journal_path is not None and other.journal_path is not None
    first_copy = _copy(first.journal_path, tmp_path / "login", first.journal_path.name)
    with Journal.open(first_copy, owner=True) as opened:
        opened.set_meta(K_ORIGIN, None)  # written before origins
    owner = {"pid": 4242, "host": "compute-node-7", "started": 1.0}
    (first_copy / LOCK_NAME).write_text(json.dumps(owner))
    code, out, err = cli(
        capsys, "sync", str(first_copy), "--base-url", UNREACHABLE, "--timeout", "1"
    )
    assert "its sync journal" in out, (code, out, err)

    second_copy = _copy(other.journal_path, tmp_path / "elsewhere", first_copy.name)
    with Journal.open(second_copy, owner=True) as opened:
        opened.set_meta(K_LOCAL_ID, first_copy.name)
    code, out, err = cli(capsys, "sync", str(second_copy))
    assert code != 0, (out, err)
    assert err.startswith(f"{second_copy}: ") and "is not the journal" in err, err
    assert "but entry 1 is another record in each" in err and "names no origin" in err, err
    assert local_platform.runs() == []  # nothing of it shipped, nor registered as the first

    code, out, err = cli(capsys, "sync", str(first_copy))  # the platform back: the first ships
    assert code == 0, (out, err)
    [synced] = local_platform.runs()
    samples = local_platform.run(synced["id"])["samples"]
    assert synced["name"] == "first" and samples["rows"] == samples["distinct"] == 2


def _copy(journal: Path, folder: Path, name: str) -> Path:
    folder.mkdir(mode=0o700, exist_ok=True)
    shutil.copytree(journal, folder / name)
    return folder / name
