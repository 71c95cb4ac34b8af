"""``show``, ``export``, ``doctor`` and ``--help``: what a user relies on."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import workloads
from cli_helpers import cli, cli_subprocess
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.commands.sparkline import BLOCKS, sparkline
from primeruns.journal import EntryKind, Journal


def _offline_train(runs: Path) -> tuple[pr.Run, list[dict[str, Any]], list[float]]:
    run = pr.init(kind="train", model="m", team_id="t", mode="offline", runs_dir=runs)
    episodes = workloads.agentic(6)
    losses = [1.0, 0.5, 0.25, 0.2, 0.1, 0.05]
    for step, (episode, loss) in enumerate(zip(episodes, losses, strict=True)):
        run.log_episodes([episode])
        run.log_metrics({"loss": loss, "reward": step / 5}, step=step)
    run.finish()
    return run, episodes, losses


def test_show_draws_a_sparkline_per_metric_and_the_lifecycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run, _, losses = _offline_train(runs)
    assert run.journal_path is not None
    code, out, _ = cli(capsys, "show", "--runs-dir", str(runs), run.journal_path.name)
    assert code == 0
    loss_line = next(line for line in out.splitlines() if line.strip().startswith("loss"))
    assert sparkline(losses) in loss_line
    assert sparkline(losses)[0] == BLOCKS[-1] and sparkline(losses)[-1] == BLOCKS[0]
    assert "reward" in out and "(not registered)" in out and "offline" in out
    assert "\x1b[" not in out  # no colour when not a terminal


def test_sparkline_resamples_long_curves_and_leaves_gaps_for_nan() -> None:
    line = sparkline([float(i) for i in range(1000)], width=20)
    assert len(line) == 20 and line[0] == BLOCKS[0] and line[-1] == BLOCKS[-1]
    assert sparkline([1.0, float("nan"), 3.0]) == BLOCKS[0] + " " + BLOCKS[-1]


def test_export_round_trips_the_logged_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run, episodes, losses = _offline_train(runs)
    assert run.journal_path is not None
    target = tmp_path / "episodes.jsonl"
    code, _, err = cli(capsys, "export", str(run.journal_path), "-o", str(target))
    assert code == 0 and "wrote 6 episodes" in err
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    exported = [json.loads(line) for line in target.read_text().splitlines()]
    assert [e["id"] for e in exported] == [e["id"] for e in episodes]
    assert [e["task"] for e in exported] == [e["task"] for e in episodes]

    code, out, _ = cli(capsys, "export", str(run.journal_path), "--kind", "metrics")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["loss"] for r in rows] == losses and [r["step"] for r in rows] == list(range(6))

    pq = pytest.importorskip("pyarrow.parquet")
    parquet = tmp_path / "metrics.parquet"
    code, _, _ = cli(
        capsys, "export", str(run.journal_path), "--kind", "metrics", "-o", str(parquet)
    )
    assert code == 0
    assert pq.read_table(parquet).column("loss").to_pylist() == losses

    code, _, err = cli(capsys, "export", str(run.journal_path), "-o", str(tmp_path / "e.parquet"))
    assert code == 2 and "only --kind metrics" in err


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_doctor_reports_settings_with_the_key_masked_and_reachability(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    monkeypatch.setenv("PRIME_API_BASE_URL", local_platform.url)
    code, out, err = cli(capsys, "doctor", "--runs-dir", str(runs))
    assert code == 0, out
    assert API_KEY not in out + err
    assert f"{API_KEY[:3]}…{API_KEY[-4:]}  (PRIME_API_KEY)" in out
    assert "(PRIME_API_BASE_URL)" in out and "answered HTTP" in out

    monkeypatch.setenv("PRIME_API_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    code, out, _ = cli(capsys, "doctor", "--runs-dir", str(runs), "--timeout", "2")
    assert code == 1 and "unreachable" in out


def test_every_command_explains_itself() -> None:
    done = cli_subprocess("--help")
    assert done.returncode == 0
    for command in ("ls", "show", "replay", "sync", "export", "gc", "doctor", "demo", "serve"):
        assert command in done.stdout
        assert cli_subprocess(command, "--help").returncode == 0


@pytest.mark.parametrize(
    "other",
    [b'"high"', b"[1]", b"1" + b"0" * 400],
    ids=["a string", "a list", "an integer past 64 bits"],
)
def test_metric_rows_parquet_cannot_hold_are_refused_in_a_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: bytes
) -> None:
    """A metric whose rows disagree on its type (a float, then a string), or a
    number no Parquet column holds, made a Parquet export die with pyarrow's
    traceback. It is one line naming the problem and JSONL, and no file."""
    rows = [b'{"step": 1, "loss": 1.5}', b'{"step": 2, "loss": ' + other + b"}"]
    _refused_as_parquet(point_at(monkeypatch, tmp_path, None), tmp_path, rows)


def _refused_as_parquet(runs: Path, tmp_path: Path, rows: list[bytes]) -> None:
    """A run of metric ``rows`` exported as Parquet: refused in one line naming
    JSONL (exit 1), no traceback, and no file."""
    pytest.importorskip("pyarrow")
    with Journal.create(runs, local_id="refused", meta={"spec": {"kind": "train"}}) as journal:
        journal.append(EntryKind.METRICS, rows)
        path = journal.path
    out = tmp_path / "rows.parquet"
    done = cli_subprocess("export", str(path), "--kind", "metrics", "-o", str(out))
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 1, done.stderr
    assert "Parquet" in done.stderr and ".jsonl" in done.stderr, done.stderr
    assert not out.exists()


def test_a_parquet_export_holds_every_rows_metrics_not_only_the_first_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Parquet export's columns were the first row's: a metric logged in a
    later row (an evaluation's row beside the training one, a metric logged
    every 100 steps) was silently left out. Every row's metrics are columns,
    whichever batch of rows (converted a batch at a time) they first appear
    in: an int that becomes a float is a float column, a group that gains a
    field gains it, a row without a metric holds null there; a type no
    column holds across batches is still refused, with no file."""
    pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from primeruns.commands import export

    monkeypatch.setattr(export, "_BATCH_ROWS", 2, raising=False)
    runs = point_at(monkeypatch, tmp_path, None)
    rows: list[dict[str, Any]] = [
        {"step": 0, "loss": 1, "opt": {"lr": 1}},
        {"step": 0, "eval/acc": 0.5},
        {"step": 1, "loss": 0.5, "opt": {"lr": 0.5, "beta": 0.9}},
        {"step": 2, "loss": 0.25, "late": True},
        {"step": 3, "loss": 0.125},
    ]
    with Journal.create(runs, local_id="batches", meta={"spec": {"kind": "train"}}) as journal:
        journal.append(EntryKind.METRICS, [json.dumps(row).encode() for row in rows])
        path = journal.path
    out = tmp_path / "rows.parquet"
    code, _, err = cli(capsys, "export", str(path), "--kind", "metrics", "-o", str(out))
    assert code == 0 and "wrote 5 metrics" in err, err
    table = pq.read_table(out)
    assert sorted(table.column_names) == ["eval/acc", "late", "loss", "opt", "step"]
    assert str(table.schema.field("loss").type) == "double"
    written = table.to_pylist()
    assert [r["loss"] for r in written] == [1.0, None, 0.5, 0.25, 0.125]
    assert [r["eval/acc"] for r in written] == [None, 0.5, None, None, None]
    assert [r["late"] for r in written] == [None, None, None, True, None]
    assert written[0]["opt"] == {"lr": 1, "beta": None}
    assert written[2]["opt"] == {"lr": 0.5, "beta": 0.9}

    with Journal.open(path) as journal:
        journal.append(EntryKind.METRICS, [b'{"step": 5, "loss": "high"}'])
    out.unlink()
    code, _, err = cli(capsys, "export", str(path), "--kind", "metrics", "-o", str(out))
    assert code == 1 and "Parquet" in err and ".jsonl" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "group", [b"{}", b"[{}]"], ids=["an empty group", "a list of empty groups"]
)
def test_metric_rows_parquet_cannot_write_are_refused_before_any_file_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: bytes
) -> None:
    """A group with no fields in every row (``{"opt": {}}``) converts to a
    column Parquet cannot write: the export died with pyarrow's traceback
    and left an empty file named like an export. It is refused as a column
    no Parquet holds is: one line naming JSONL, and no file."""
    rows = [b'{"step": 1, "opt": ' + group + b"}", b'{"step": 2, "opt": ' + group + b"}"]
    _refused_as_parquet(point_at(monkeypatch, tmp_path, None), tmp_path, rows)


def test_metric_rows_with_no_metric_at_all_are_refused_as_parquet_not_exported_as_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows none of which holds a metric (``{}``) make a table of no column,
    and a Parquet file of no column holds no row: the export said it wrote
    them and the file read back empty. They are refused, naming JSONL,
    and no file is written."""
    _refused_as_parquet(point_at(monkeypatch, tmp_path, None), tmp_path, [b"{}", b"{}"])
