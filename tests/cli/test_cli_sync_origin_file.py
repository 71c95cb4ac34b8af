"""A journal folder's ``origin.json`` is read as untrusted input: one that
is not a regular file (a folder, left by a copy gone wrong) is no origin,
never an OSError out of ``sync --all`` or ``sync --watch`` (a watch, running
for days, ended on it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.commands import replay
from primeruns.journal.origin import ORIGIN_FILE, Origin


def _offline_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str) -> tuple[Path, Path]:
    """(runs dir, an offline run whose origin.json is a folder), beside a good one."""
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
    odd = made[1] / ORIGIN_FILE
    odd.unlink(missing_ok=True)
    odd.mkdir()
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    monkeypatch.delenv("PRIME_RUNS_MODE")
    return runs, made[1]


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
    runs, _ = _offline_runs(tmp_path, monkeypatch, local_platform.url)
    passes = []
    one_pass = replay._pass

    def counted(*args: Any, **kwargs: Any) -> int:
        passes.append(one_pass(*args, **kwargs))
        if len(passes) == 2:
            raise KeyboardInterrupt  # Ctrl-C after the second pass
        return passes[-1]

    monkeypatch.setattr(replay, "_pass", counted)
    code, out, err = cli(capsys, "sync", "--watch", "--interval", "0", "--runs-dir", str(runs))
    assert code == 130, out + err
    assert len(local_platform.runs()) == 2, out + err
