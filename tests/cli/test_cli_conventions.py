"""Ordinary events on the command line end in one line and an honest exit
code, never a traceback (as ``git``, ``wandb sync`` and ``mlflow`` users
expect): ``--version``, a closed pipe, a bad path, a missing extra, Ctrl-C."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import workloads
from cli_helpers import cli, cli_subprocess, landed_once
from rich.console import Console
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.commands.progress import ShipProgress
from primeruns.commands.replay import replay_one
from primeruns.ship.backlog import Progress, ship_journal
from primeruns.ship.policy import RetryPolicy


def _offline_eval(runs: Path, episodes: int) -> Path:
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    run.log_episodes(workloads.gsm8k(episodes))
    run.finish()
    assert run.journal_path is not None
    return run.journal_path


def test_version_names_the_package_and_its_version() -> None:
    done = cli_subprocess("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"primeruns {pr.__version__}"


def test_a_closed_pipe_ends_quietly_with_the_shells_sigpipe_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``primeruns export RUN | head -1``: no BrokenPipe traceback."""
    runs = point_at(monkeypatch, tmp_path, None)
    journal = _offline_eval(runs, 40)
    proc = subprocess.Popen(
        [sys.executable, "-m", "primeruns", "export", str(journal)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"{")
    proc.stdout.close()  # the reader goes away, as head does
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_bad_output_path_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    journal = _offline_eval(runs, 2)
    target = tmp_path / "no-such-dir" / "x.jsonl"
    done = cli_subprocess("export", str(journal), "-o", str(target))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and str(target) in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_missing_extra_names_the_pip_install_that_fixes_it(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    (hidden / "uvicorn").mkdir(parents=True)
    (hidden / "uvicorn" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'uvicorn'\", name='uvicorn')\n"
    )
    path = os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    done = cli_subprocess("serve", "--port", "0", "--data", str(tmp_path / "data"), env=env)
    assert done.returncode == 2, done.stderr
    assert "pip install 'prime-runs[local]'" in done.stderr and "Traceback" not in done.stderr


def test_ctrl_c_in_replay_is_one_line_exit_130_and_a_rerun_lands_everything_once(
    local_platform: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    journal = _offline_eval(runs, 20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME")}
    env.update(PRIME_API_KEY=API_KEY, PRIME_RUNS_RETRY_BASE_S="0.05")
    # Nothing listens here: the replay retries registering for 10 s (the
    # allowance of a platform never reached), long after the signal.
    down = dict(env, PRIME_BASE_URL="http://127.0.0.1:9", PRIME_TRACES_URL="http://127.0.0.1:9")
    proc = subprocess.Popen(
        [sys.executable, "-m", "primeruns", "replay", str(journal)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(down, PYTHONUNBUFFERED="1"),
        text=True,
    )
    assert proc.stdout is not None
    # It names the journal and its platform as it starts shipping, before it
    # registers (see the next test): at work now, not at its end.
    assert " -> http://127.0.0.1:9" in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "nothing is lost" in err
    url = local_platform.url  # type: ignore[attr-defined]
    again = cli_subprocess("replay", str(journal), "--base-url", url,
                           env=dict(env, PRIME_TRACES_URL=url))  # fmt: skip
    assert again.returncode == 0, again.stderr
    run_id = next(line for line in again.stdout.splitlines() if "closed out" in line)
    stored = local_platform.runs()  # type: ignore[attr-defined]
    (only,) = [r for r in stored if r["id"] in run_id]
    assert landed_once(local_platform.run(only["id"]), 20)  # type: ignore[attr-defined]


def test_a_replay_shows_where_it_ships_before_registering_with_a_platform_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head and bars come as shipping begins, not when a registration the
    platform never answers gives up: a user sees what the replay is doing while
    it retries (and a Ctrl-C then interrupts the work, not the exit)."""
    runs = point_at(monkeypatch, tmp_path, None)
    journal = _offline_eval(runs, 3)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    monkeypatch.setenv("PRIME_TRACES_URL", "http://127.0.0.1:9")
    seen: list[Progress] = []
    report = ship_journal(
        journal, timeout=0.5, progress=seen.append, base_url="http://127.0.0.1:9",
        policy=RetryPolicy(base_delay_s=0.05),
    )  # fmt: skip
    # The registration never succeeded, so whatever was drawn came before it.
    assert report.run_id is None and any("register" in e for e in report.errors)
    assert [p.records for p in seen] == [0], "nothing drawn while registering"


def _interrupted_as_the_bars_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A journal to replay to a platform that is down, with a Ctrl-C landing
    inside rich's Live.start (marked started, its render hook not yet
    pushed): the cursor already hidden on a terminal."""
    runs = point_at(monkeypatch, tmp_path, None)
    journal = _offline_eval(runs, 3)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    monkeypatch.setenv("PRIME_TRACES_URL", "http://127.0.0.1:9")

    def ctrl_c(self: Console, hook: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Console, "push_render_hook", ctrl_c)
    return journal


def test_ctrl_c_as_the_bars_start_is_an_interruption_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C landing inside rich's Live.start (marked started, its render
    hook not yet pushed): stopping the bars then raises IndexError, which must
    not replace the interruption (it made the replay exit 1, "not shipped")."""
    journal = _interrupted_as_the_bars_start(tmp_path, monkeypatch)
    code, _, err = cli(capsys, "replay", str(journal), "--base-url", "http://127.0.0.1:9")
    assert code == 130, err
    assert "nothing is lost" in err and "not shipped" not in err


class _Terminal(io.StringIO):
    """What the bars are drawn on, taken for a terminal: rich hides the
    cursor on one while it draws."""

    def isatty(self) -> bool:
        return True


_HIDE, _SHOW = "\x1b[?25l", "\x1b[?25h"


def _cursor_shown(drawn: str) -> bool:
    assert _HIDE in drawn  # the bars were drawn as on a terminal
    return drawn.rfind(_SHOW) > drawn.rfind(_HIDE)


def test_ctrl_c_as_the_bars_start_gives_the_terminal_its_cursor_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rich hid the cursor before the Ctrl-C landed in its Live.start, and
    its stop failed before showing it again: the user's shell was left with
    no cursor after the replay ended as interrupted."""
    journal = _interrupted_as_the_bars_start(tmp_path, monkeypatch)
    terminal = _Terminal()
    with pytest.raises(KeyboardInterrupt):  # cli.main makes it 130 (the test above)
        replay_one(journal, base_url="http://127.0.0.1:9", out=terminal)
    assert _cursor_shown(terminal.getvalue())


def test_ctrl_c_in_the_bars_last_draw_still_stops_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C as the finished bars are drawn a last time: they were marked
    stopped before that draw, so they never stopped, and the cursor stayed
    hidden (and stdout and stderr in rich's hands) after the replay ended."""
    stdout = sys.stdout
    terminal = _Terminal()
    bars = ShipProgress(terminal, {"episodes": 3}, {"episodes": "episodes"})
    bars(Progress(sent={"episodes": 3}))
    assert sys.stdout is not stdout  # rich's while it draws

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bars._bars, "refresh", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        bars.finish({})
    bars.done()  # as the replay does with bars whose shipment raised
    assert _cursor_shown(terminal.getvalue())
    assert sys.stdout is stdout


@pytest.mark.parametrize("command", ["ls", "show"])
def test_ls_and_show_into_a_closed_pipe_end_with_141(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``primeruns ls | true``: rich handled the broken pipe first and exited 1,
    where the README promises 141 (#31)."""
    runs = point_at(monkeypatch, tmp_path, None)
    journal = _offline_eval(runs, 2)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: no race
    argv = [command, "--runs-dir", str(runs), *([journal.name] if command == "show" else [])]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "primeruns", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=dict(os.environ),
            timeout=120,
        )
    finally:
        os.close(write_end)
    err = done.stderr.decode()
    assert done.returncode == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_runs_dir_that_is_not_a_folder_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ls --runs-dir /typo`` said "no runs" and exited 0 (#31); a bad path is 2."""
    code, _, err = cli(capsys, "ls", "--runs-dir", str(tmp_path / "typo"))
    assert code == 2 and "typo" in err and "no such folder" in err
