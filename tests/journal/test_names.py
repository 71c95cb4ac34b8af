"""A new journal's name: stamped with its creation time, never earlier than a
journal made before it in its runs directory, at a cost that does not grow
with what the directory holds."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from primeruns.journal import Journal


def _stamp(moment: datetime) -> str:
    return f"{moment:%Y%m%d-%H%M%S}"


def test_a_journal_is_named_without_listing_its_runs_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init() names its journal on the producer's path: a runs directory of
    100,000 past runs listed there made each init() pay for all of them
    (10 ms a run at 10,000 of them, 91 ms at 100,000)."""
    runs = tmp_path / "runs"
    Journal.create(runs).close()
    listed: list[str] = []
    listdir, scandir = os.listdir, os.scandir

    def counted_listdir(path: Any = ".") -> list[str]:
        listed.append(os.fspath(path))
        return listdir(path)

    def counted_scandir(path: Any = ".") -> Any:
        listed.append(os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "listdir", counted_listdir)
    monkeypatch.setattr(os, "scandir", counted_scandir)
    Journal.create(runs).close()
    assert os.fspath(runs) not in listed


def test_a_link_named_as_a_later_journal_does_not_stamp_new_ones(tmp_path: Path) -> None:
    """No link in a runs directory is followed: one named for a far later
    time, to a journal elsewhere, named every journal made after it as made
    then, in an order among them left to their random tails."""
    runs = tmp_path / "runs"
    elsewhere = tmp_path / "elsewhere"
    Journal.create(elsewhere, local_id="29991231-235959-aaaaaaaa").close()
    Journal.create(runs).close()
    (runs / "29991231-235959-aaaaaaaa").symlink_to(elsewhere / "29991231-235959-aaaaaaaa")
    made = Journal.create(runs)
    made.close()
    assert made.path.name[:15] <= _stamp(datetime.now(UTC))
