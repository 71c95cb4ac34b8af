"""``ls``'s table as a user reads it: a journal a line, laid out alike by
both of its renderers (the lines ``ls`` lays out itself for speed, and
rich's ``Table`` where even three columns do not fit), and off a terminal
nothing cut, so that ``primeruns ls | grep NAME`` finds a run by its name."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from cli_helpers import cli, named_offline_eval
from rich.console import Console
from sdk_helpers import point_at

from primeruns.commands import ls_table
from primeruns.journal import journal_info
from primeruns.reports import RunStatus, describe

# A run name as sweeps make them: words, longer than the NAME column's 32 cells.
LONG_NAME = "gsm8k sweep lr 3e-4 warmup 200 seed 7 with the long context"


def _status(path: Path) -> RunStatus:
    return describe(journal_info(path, tally=True))


def _terminal(width: int) -> Console:
    """A console as ``make_console`` makes one on a terminal ``width`` wide, without colour."""
    return Console(
        file=io.StringIO(), width=width, force_terminal=True, color_system=None, highlight=False
    )


def _lines(console: Console) -> list[str]:
    out = console.file
    assert isinstance(out, io.StringIO)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def test_both_renderers_of_the_ls_table_cut_a_long_name_on_its_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast table cut a long name at the NAME column's width, where rich's
    table (the one it stands in for) folded it onto more lines: a journal a
    line (the listing's promise) in both, the name cut with an ellipsis."""
    runs = point_at(monkeypatch, tmp_path, None)
    found = [_status(named_offline_eval(runs, LONG_NAME))]
    fast, rich_ = _terminal(200), _terminal(200)
    lines = ls_table._fast_table(found, fast, set())
    assert lines is not None  # every column fits 200 cells
    fast.print(lines, crop=False)
    rich_.print(ls_table._table(found, list(ls_table._COLUMNS), set()))
    assert [line for line in _lines(fast) if line] == _lines(rich_)
    (row,) = _lines(rich_)[1:]
    assert found[0].info.local_id in row and LONG_NAME[:31] + "…" in row


def test_ls_off_a_terminal_prints_a_long_run_name_whole_on_its_journals_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped, ``ls`` cut every name past 32 cells (``... | grep`` did not find
    the run by its name); off a terminal nothing is cut or folded."""
    runs = point_at(monkeypatch, tmp_path, None)
    path = named_offline_eval(runs, LONG_NAME)
    code, out, _ = cli(capsys, "ls", "--runs-dir", str(runs))
    assert code == 0
    assert any(path.name in line and LONG_NAME in line for line in out.splitlines()), out
