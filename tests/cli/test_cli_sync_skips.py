"""What ``sync --all`` and ``sync --watch`` pass over, they name with the
true reason: a journal whose data file cannot be read is not "an online
run", and a link planted among the runs is not one either. A watch pass,
every few seconds for days, names each once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.commands import replay


def _runs_with_a_damaged_journal_and_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> tuple[Path, Path, Path]:
    """(runs dir, an offline run whose data.mdb is noise, a link to a good one beside it)."""
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
    good, damaged = made
    (damaged / "data.mdb").write_bytes(os.urandom(8192))
    link = runs / "29990101-000000-0123abcd"
    link.symlink_to(good)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    monkeypatch.delenv("PRIME_RUNS_MODE")
    return runs, damaged, link


def test_sync_all_names_the_true_reason_it_passes_a_journal_over(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs, damaged, link = _runs_with_a_damaged_journal_and_a_link(
        tmp_path, monkeypatch, local_platform.url
    )
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
    runs, damaged, link = _runs_with_a_damaged_journal_and_a_link(
        tmp_path, monkeypatch, local_platform.url
    )
    passes = []
    one_pass = replay._pass

    def counted(*args: Any, **kwargs: Any) -> int:
        passes.append(one_pass(*args, **kwargs))
        if len(passes) == 3:
            raise KeyboardInterrupt  # Ctrl-C after the third pass
        return passes[-1]

    monkeypatch.setattr(replay, "_pass", counted)
    code, out, err = cli(capsys, "sync", "--watch", "--interval", "0", "--runs-dir", str(runs))
    assert code == 130, out + err
    assert err.count(f"{damaged.name}: skipped: cannot be read (data.mdb") == 1, err
    assert err.count(f"{link.name}: skipped: not opened: ") == 1, err
    [listed] = local_platform.runs()
    assert local_platform.run(listed["id"])["train_metrics"] == {"rows": 1, "steps": 1}
