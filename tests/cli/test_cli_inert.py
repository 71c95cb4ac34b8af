"""Output is inert (#27): a run or a folder named with terminal escapes (set the
title, clear the screen, C1 controls), or a server's message holding them,
reaches the terminal as visible escapes such as ``\\x1b``, never as the raw
bytes, on a pseudo-terminal and on a pipe alike; rich markup in a name is
shown as written. ``--json`` keeps the JSON encoder's own escaping."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import workloads
from cli_helpers import cli_subprocess
from sdk_helpers import point_at
from test_cli_reports import _on_a_terminal

import primeruns as pr
from primeruns.journal import Journal

# OSC (set the title, BEL-terminated), CSI (clear the screen), C1 CSI and OSC,
# a backspace and a carriage return that would hide what came before, DEL, and
# rich markup that must not be interpreted.
HOSTILE = "run\x1b]0;pwned\x07\x1b[2J\x9b31m\x9d0;t\x9c\x08\r\x7f[bold red]loud[/]"
# What no output may hold: the control bytes, as bytes and as characters.
FORBIDDEN = ["\x1b", "\x07", "\x9b", "\x9d", "\x9c", "\x08", "\x7f"]
FOLDER = "planted\x1b[31mred\x1b]0;folder\x07"


def inert(text: str) -> str:
    """What the CLI is to show for ``text``: each control character as ``\\xNN``."""
    return "".join(
        f"\\x{ord(c):02x}" if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F else c for c in text
    )


def _hostile_run(runs: Path) -> Path:
    run = pr.init(
        name=HOSTILE,
        model=HOSTILE,
        environments=["gsm8k"],
        tags=[HOSTILE],
        config={HOSTILE: HOSTILE},
        mode="offline",
        runs_dir=runs,
    )
    run.log_episodes(workloads.gsm8k(1))
    run.finish(status="failed", error=f"server said: {HOSTILE}")
    assert run.journal_path is not None
    with Journal.open(run.journal_path, owner=True) as journal:
        journal.record_loss("eval_samples", 1, f"rejected: {HOSTILE}")
    return run.journal_path


def _assert_inert(text: str) -> None:
    leaked = sorted({c for c in text if c in FORBIDDEN})
    assert not leaked, f"raw control characters reached the output: {leaked!r}\n{text!r}"


def test_inert_escapes_c0_del_and_c1_and_nothing_else() -> None:
    from primeruns.commands.console import inert

    assert inert("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert inert("\x00\x07\x08\t\n\r\x7f") == "\\x00\\x07\\x08\\x09\\x0a\\x0d\\x7f"
    assert inert("\x80\x9b\x9f\xa0") == "\\x80\\x9b\\x9f\xa0"
    assert inert("plain [red]ü ✓ run-1") == "plain [red]ü ✓ run-1"


@pytest.mark.parametrize("command", ["ls", "show"])
def test_a_hostile_run_is_shown_inert_on_a_terminal_and_on_a_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    path = _hostile_run(runs)
    argv = [command, "--runs-dir", str(runs), *([path.name] if command == "show" else [])]

    piped = cli_subprocess(*argv)
    assert piped.returncode == 0, piped.stderr
    _assert_inert(piped.stdout + piped.stderr)
    assert "run\\x1b]0;pwned" in piped.stdout  # the name's column may wrap the rest
    if command == "show":  # markup shown as written (in ls, the column wraps it)
        assert "[bold red]loud[/]" in piped.stdout

    # On a terminal, rich's own styles (bold and dim) are left out: any other
    # escape came from the data.
    shown = _on_a_terminal(argv, 400)
    _assert_inert(shown)
    assert "run\\x1b]0;pwned" in shown


def test_show_escapes_every_field_from_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    path = _hostile_run(runs)
    shown = cli_subprocess("show", "--runs-dir", str(runs), path.name)
    assert shown.returncode == 0, shown.stderr
    escaped = inert(HOSTILE)
    lines = shown.stdout.splitlines()

    def line_of(label: str) -> str:
        [line] = [ln for ln in lines if ln.strip().startswith(label)]
        return line

    for label in ("name", "model", "tags", "error"):
        assert escaped in line_of(label), label
    assert '"run\\u001b]0;pwned\\u0007' in line_of("config")  # JSON's own escapes
    _assert_inert(shown.stdout)
    assert f"rejected: {escaped}" in shown.stdout  # a loss's reason


def test_show_escapes_metric_names_by_their_sparklines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(kind="train", model="m", team_id="t", mode="offline", runs_dir=runs)
    for step, loss in enumerate([1.0, 0.5, 0.25]):
        run.log_metrics({f"loss{HOSTILE}": loss, "reward": step / 2}, step=step)
    run.finish()
    assert run.journal_path is not None
    shown = cli_subprocess("show", "--runs-dir", str(runs), run.journal_path.name)
    assert shown.returncode == 0, shown.stderr
    _assert_inert(shown.stdout)
    [line] = [ln for ln in shown.stdout.splitlines() if "loss" in ln]
    assert line.strip().startswith(f"loss{inert(HOSTILE)}  ")
    [reward] = [ln for ln in shown.stdout.splitlines() if "reward" in ln]
    assert reward.index("min") == line.index("min")  # aligned on the escaped name


def test_json_output_keeps_the_encoders_escaping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    path = _hostile_run(runs)
    listed = cli_subprocess("ls", "--runs-dir", str(runs), "--json")
    assert listed.returncode == 0, listed.stderr
    _assert_inert(listed.stdout)
    [row] = json.loads(listed.stdout)
    assert row["name"] == HOSTILE  # the value itself, unchanged
    shown = cli_subprocess("show", "--runs-dir", str(runs), "--json", path.name)
    _assert_inert(shown.stdout)
    assert json.loads(shown.stdout)["spec"]["model"] == HOSTILE


@pytest.mark.parametrize("command", ["ls", "show"])
def test_json_output_escapes_every_character_past_ascii(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    # A right-to-left override makes "evil\u202egnp.sh" read "evilhs.png" on a
    # terminal; a Cyrillic "а" passes for a Latin one. Escaped, both show.
    name = "evil\u202egnp.sh-\u0430-ü"
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name=name, environments=["gsm8k"], mode="offline", runs_dir=runs)
    run.finish()
    assert run.journal_path is not None
    argv = [command, "--runs-dir", str(runs), "--json"]
    done = cli_subprocess(*argv, *([run.journal_path.name] if command == "show" else []))
    assert done.returncode == 0, done.stderr
    assert done.stdout.isascii(), done.stdout
    assert "\\u202e" in done.stdout
    document = json.loads(done.stdout)
    assert (document[0] if command == "ls" else document)["name"] == name


def test_a_journal_folder_named_with_escapes_is_listed_inert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    Journal.create(runs, local_id=FOLDER).close()
    # A folder that only looks like a journal: its name and path are in its damage.
    planted = runs / f"{FOLDER}-broken"
    planted.mkdir(mode=0o700)
    (planted / "data.mdb").write_bytes(b"\x1b[2J not an LMDB file " * 100)
    os.chmod(planted / "data.mdb", 0o600)

    piped = cli_subprocess("ls", "--runs-dir", str(runs))
    assert piped.returncode == 0, piped.stderr
    _assert_inert(piped.stdout + piped.stderr)
    assert inert(FOLDER) in piped.stdout

    shown = _on_a_terminal(["ls", "--runs-dir", str(runs)], 400)
    _assert_inert(shown)
    assert inert(FOLDER) in shown

    for argv in (
        ["show", str(planted)],  # the error naming it
        ["export", str(planted)],
        ["gc", "--older-than", "0", "--dry-run", "-v"],  # why each is kept
        ["sync", "--dry-run", str(runs / FOLDER)],
    ):
        done = cli_subprocess(*argv, "--runs-dir", str(runs))
        _assert_inert(done.stdout + done.stderr)
        assert inert(FOLDER) in done.stdout + done.stderr, argv


def test_a_runs_dir_named_with_escapes_is_named_inert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs\x1b]0;dir\x07"
    absent = cli_subprocess("ls", "--runs-dir", str(runs))  # a bad path is a usage error
    assert absent.returncode == 2, absent.stderr
    _assert_inert(absent.stdout + absent.stderr)
    runs.mkdir()
    empty = cli_subprocess("ls", "--runs-dir", str(runs))
    assert empty.returncode == 0, empty.stderr
    _assert_inert(empty.stdout + empty.stderr)
    assert "runs\\x1b]0;dir\\x07" in empty.stdout
    missing = cli_subprocess("show", "--runs-dir", str(runs), "nothing")
    assert missing.returncode == 2
    _assert_inert(missing.stdout + missing.stderr)
