"""What the reporting commands tell a user, on real journals in subprocesses:
each run's outcome apart from its shipping, counts in episodes, losses with
their reasons, a table that fits the terminal, ``--json`` as the only thing
on stdout, progress in records only for sinks that ship, ``doctor``'s key
and config checks, and one exit code for a damaged journal everywhere."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import workloads
from cli_helpers import cli, cli_subprocess, flip_entry_bytes
from sdk_helpers import API_KEY, kill_producer, point_at
from spooled import acked_then_cut

import primeruns as pr
from primeruns.journal import EntryKind, Journal, JournalInfo, journal_info
from primeruns.reports import describe, pending_per_sink


def _offline_eval(runs: Path, episodes: int, **finish: Any) -> Path:
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    for episode in workloads.gsm8k(episodes):
        run.log_episodes([episode])
    run.finish(**finish)
    assert run.journal_path is not None
    return run.journal_path


def _shipping_env(url: str) -> dict[str, str]:
    """The environment of a command that ships to the local platform at ``url``."""
    return {**os.environ, "PRIME_API_KEY": API_KEY, "PRIME_API_BASE_URL": url}


def _ls(runs: Path, env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    done = cli_subprocess("ls", "--runs-dir", str(runs), "--json", env=env)
    assert done.returncode == 0, done.stderr
    return {row["local_id"]: row for row in json.loads(done.stdout)}


def _on_a_terminal(argv: list[str], columns: int) -> str:
    """``primeruns ARGV`` with stdout on a pseudo-terminal ``columns`` wide."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "primeruns", *argv],
        stdout=follower,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # bold and dim stay with NO_COLOR


def test_ls_tells_each_runs_outcome_apart_from_its_shipping_in_episodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    completed = _offline_eval(runs, 20)
    failed = _offline_eval(runs, 3, status="failed", error="reward model down")
    crashed, acked = kill_producer([str(runs), "eval", "40"], 10)
    live = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    live.log_episodes(workloads.gsm8k(2))
    assert live.journal_path is not None
    try:
        rows = _ls(runs)
    finally:
        live.finish()
    seen = {
        name: (rows[path.name]["outcome"], rows[path.name]["shipping"])
        for name, path in [
            ("completed", completed),
            ("failed", failed),
            ("crashed", crashed),
            ("running", live.journal_path),
        ]
    }
    assert seen == {
        "completed": ("completed", "offline"),
        "failed": ("failed", "offline"),
        "crashed": ("crashed", "offline"),
        "running": ("running", "offline"),
    }
    # Counts are episodes, not journal entries (the run's open and finish are entries too).
    assert rows[completed.name]["counts"] == {"episodes": 20, "traces": 0, "metrics": 0}
    assert rows[completed.name]["entries"] > 20
    logged = [line for line in acked if line.startswith("episode ")]
    assert rows[crashed.name]["counts"]["episodes"] >= len(logged)


def test_show_and_ls_name_every_loss_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    path = _offline_eval(runs, 5)
    with Journal.open(path, owner=True) as journal:
        journal.record_loss("eval_samples", 2, "rejected by the platform: 422 bad reward")
    [row] = _ls(runs).values()
    assert row["losses"] == {
        "eval_samples": {"count": 2, "reasons": ["rejected by the platform: 422 bad reward"]}
    }
    shown = cli_subprocess("show", "--runs-dir", str(runs), path.name)
    assert shown.returncode == 0, shown.stderr
    assert "lost 2 for eval_samples" in shown.stdout
    assert "rejected by the platform: 422 bad reward" in shown.stdout
    assert "0/5 episodes acknowledged" in shown.stdout  # offline: nothing shipped yet
    table = cli_subprocess("ls", "--runs-dir", str(runs))
    header, line = table.stdout.splitlines()[:2]
    right_edge = header.index("LOST") + len("LOST")  # the column is right-justified
    assert line[:right_edge].split()[-1] == "2"


def test_show_and_ls_count_seqs_a_power_cut_skipped_as_missing_not_as_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A power cut zeroed the spool's last appends (entries 4 to 10) while a
    sink's offset named them, so the next owner appended after them
    (``journal.skipped``). Those seqs hold no entry: ``show`` and ``ls``
    said 11 entries for a journal of 4, and left the 7 lost ones unsaid."""
    runs = point_at(monkeypatch, tmp_path, None)
    path = acked_then_cut(runs)
    with Journal.open(path) as owner:
        assert owner.append(EntryKind.EPISODE, [b'{"n":"new"}']).first_seq == 11
    code, out, _ = cli(capsys, "show", str(path), "--json")
    assert code == 4  # the missing entries are damage
    shown = json.loads(out)
    assert (shown["entries"], shown["missing_entries"]) == (4, 7)
    code, out, _ = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
    [listed] = json.loads(out)
    assert (listed["entries"], listed["missing_entries"]) == (4, 7)
    code, out, _ = cli(capsys, "show", str(path))
    assert "4 entries, 7 missing" in out


def test_pending_counted_without_a_tally_leaves_out_seqs_a_power_cut_skipped(
    tmp_path: Path,
) -> None:
    """Where a listing could not count entries by kind (its tally failed),
    a sink's pending records are the seqs past its offset: those an owner's
    appends skipped after a power cut (4 to 10) hold no record to ship."""
    info = JournalInfo(
        path=tmp_path / "cut",
        local_id="cut",
        meta={"journal.skipped": {"4": 10}},
        last_seq=11,
        cursors={"traces": 3},
        losses={},
        size_bytes=0,
        modified=0.0,
        owner=None,
        owner_alive=False,
    )
    assert pending_per_sink(info, None) == {"traces": 1, "eval_samples": 4}


def test_the_ls_table_fits_the_terminal_and_keeps_what_matters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    path = _offline_eval(runs, 3)
    wide = _on_a_terminal(["ls", "--runs-dir", str(runs)], 200)
    narrow = _on_a_terminal(["ls", "--runs-dir", str(runs)], 60)
    assert "NAME" in wide and "LOGGED" in wide and "3 episodes" in wide
    table = [line for line in narrow.splitlines() if line.strip()][:-1]  # less the footer
    assert max(len(line.rstrip()) for line in table) <= 60, narrow
    assert path.name in narrow  # whole, never cut
    assert "OUTCOME" in narrow and "completed" in narrow and "offline" in narrow
    # Off a terminal, nothing is cut or folded for grep.
    piped = cli_subprocess("ls", "--runs-dir", str(runs), env={**os.environ, "COLUMNS": "40"})
    assert any(path.name in line and "3 episodes" in line for line in piped.stdout.splitlines())


def test_json_is_the_only_thing_on_stdout_for_every_reporting_command(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    path = _offline_eval(runs, 6)
    env = _shipping_env(local_platform.url)
    commands = [
        ["ls", "--runs-dir", str(runs)],
        ["show", "--runs-dir", str(runs), path.name],
        ["sync", "--runs-dir", str(runs), "--dry-run"],
        ["sync", "--runs-dir", str(runs)],
        ["replay", "--runs-dir", str(runs), path.name],
        ["gc", "--runs-dir", str(runs), "--older-than", "0", "--dry-run"],
        ["doctor", "--runs-dir", str(runs)],
    ]
    documents = {}
    for argv in commands:
        done = cli_subprocess(*argv, "--json", env=env)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        documents[" ".join(argv[:1] + argv[3:])] = json.loads(done.stdout)  # all of stdout
    assert documents["ls"][0]["counts"]["episodes"] == 6
    assert documents[f"show {path.name}"]["sinks"][1] == {
        "sink": "eval_samples",
        "ships": ["episodes"],
        "records": 6,
        "acknowledged": 0,
        "pending": 6,
        "off": None,
        "acknowledged_entry": 0,
    }
    [synced] = documents["sync"]
    assert synced["ok"] and synced["status"] == "completed" and synced["exit_code"] == 0
    assert documents["gc --older-than 0 --dry-run"]["deleted"][0]["local_id"] == path.name
    assert documents["doctor"]["failed"] == 0
    assert {"section": "API key", "result": "ok", "detail": "the platform accepts the API key"} in (
        documents["doctor"]["checks"]
    )


def test_replay_progress_counts_records_only_for_sinks_that_ship(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    path = _offline_eval(runs, 9)
    env = {**_shipping_env(local_platform.url), "PRIME_TRACES_OPT_OUT": "1"}
    done = cli_subprocess("sync", "--runs-dir", str(runs), path.name, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    bars = [line for line in done.stdout.splitlines() if "━" in line]
    assert len(bars) == 1, done.stdout  # eval samples; traces are opted out
    assert bars[0].split()[0] == "eval_samples"
    assert "9/9 episodes" in bars[0] and "100%" in bars[0]
    assert "done: 9 episodes to eval_samples" in done.stdout


@pytest.mark.parametrize("problem", ["wrong key", "broken config", "traces not enabled"])
def test_doctor_checks_the_key_with_an_authenticated_read_and_reports_a_broken_config(
    problem: str,
    make_local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    platform = make_local_platform(api_key=API_KEY, traces_disabled=problem == "traces not enabled")
    point_at(monkeypatch, tmp_path, platform.url)
    env = {**os.environ, "PRIME_API_BASE_URL": platform.url, "PRIME_API_KEY": API_KEY}
    if problem == "wrong key":
        env["PRIME_API_KEY"] = "not-the-key"
    if problem == "broken config":
        config = tmp_path / "home" / ".prime" / "config.json"
        config.parent.mkdir(parents=True)
        config.write_text('{"api_key": "x",')
    done = cli_subprocess("doctor", "--runs-dir", str(tmp_path / "runs"), env=env)
    lines = done.stdout.splitlines()
    if problem == "wrong key":
        assert done.returncode == 1
        assert any(line.split()[0] == "FAIL" and "refused the API key" in line for line in lines)
        assert "not-the-key" not in done.stdout + done.stderr
    elif problem == "broken config":
        assert done.returncode == 1
        assert any(
            line.split()[0] == "FAIL" and "config.json is not valid JSON" in line for line in lines
        ), done.stdout
    else:
        assert done.returncode == 0, done.stdout
        assert any("Prime Traces is not enabled for this account" in line for line in lines)
        assert "the platform accepts the API key" in done.stdout


def test_a_damaged_journal_exits_4_from_every_command_that_reads_it(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    rotten = _offline_eval(runs, 8)
    flip_entry_bytes(rotten, 4)
    garbage = runs / "garbage"
    garbage.mkdir()
    (garbage / "data.mdb").write_bytes(os.urandom(64 << 10))
    env = _shipping_env(local_platform.url)
    listed = cli_subprocess("ls", "--runs-dir", str(runs), "--json", env=env)
    assert listed.returncode == 0  # a listing lists the damage, it does not fail on it
    assert {row["local_id"]: row["outcome"] for row in json.loads(listed.stdout)}["garbage"] == (
        "damaged"
    )
    for journal in (rotten, garbage):
        # sync last: it rebuilds the journal from what is intact
        codes = {
            command: cli_subprocess(command, str(journal), env=env).returncode
            for command in ("show", "export", "sync")
        }
        assert codes == {"show": 4, "export": 4, "sync": 4}, (journal.name, codes)


def test_a_run_whose_spec_is_of_the_wrong_shape_is_listed_and_shown_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged or hostile spec costs the reports that spec only: the run is
    listed and shown with what else its journal holds, beside the others."""
    runs = point_at(monkeypatch, tmp_path, None)
    good = _offline_eval(runs, 2)
    with Journal.create(runs, local_id="hostile", meta={"spec": {"kind": "eval", "tags": 7}}):
        pass
    rows = _ls(runs)
    assert (rows["hostile"]["kind"], rows["hostile"]["name"], rows["hostile"]["mode"]) == (
        None,
        None,
        None,
    )
    assert (rows[good.name]["kind"], rows[good.name]["mode"]) == ("eval", "offline")
    shown = cli_subprocess("show", str(runs / "hostile"), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["spec"] == {}
    table = _on_a_terminal(["ls", "--runs-dir", str(runs)], 200)
    [line] = [line for line in table.splitlines() if line.startswith("hostile")]
    assert " ? " in line


def test_a_run_whose_loss_counts_are_of_the_wrong_shape_is_listed_and_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile or foreign ``journal.losses`` (a count that is not a number,
    reasons that are not a list) costs the sinks whose records it garbles:
    the run is listed and shown with its other counts, and counting a loss
    for such a sink starts it afresh."""
    runs = point_at(monkeypatch, tmp_path, None)
    good = _offline_eval(runs, 2)
    hostile = {
        "traces": {"count": "many", "reasons": []},
        "eval_samples": {"count": 2, "reasons": 7},
        "metrics": {"count": 3, "reasons": ["rejected: bad row"]},
    }
    with Journal.create(runs, local_id="hostile") as journal:
        journal._tx.write(lambda txn: journal._tx.put_meta(txn, "journal.losses", hostile))
    rows = _ls(runs)
    assert rows["hostile"]["losses"] == {"metrics": {"count": 3, "reasons": ["rejected: bad row"]}}
    assert rows[good.name]["losses"] == {}
    listed = cli_subprocess("ls", "--runs-dir", str(runs))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    shown = cli_subprocess("show", str(runs / "hostile"))
    assert shown.returncode == 4 and "Traceback" not in shown.stderr, shown.stderr  # damage
    with Journal.open(runs / "hostile") as journal:
        journal.record_loss("traces", 1, "damaged: entry 1 missing")
        assert journal.losses()["traces"] == {
            "count": 1,
            "reasons": ["damaged: entry 1 missing"],
        }


def test_a_loss_count_that_is_no_count_is_named_as_damage_and_never_summed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal is untrusted input: a negative count in its
    ``journal.losses`` was summed into the run's total, and ``ls`` and
    ``show`` said -998 records lost where 2 were. A count that is not one
    (negative, a bool, a float) is left out of every total and named as the
    journal's damage, as any damaged meta is (``show`` exits 4)."""
    runs = point_at(monkeypatch, tmp_path, None)
    hostile = {
        "traces": {"count": -1000, "reasons": ["rejected"]},
        "metrics": {"count": True, "reasons": []},
        "train_samples": {"count": 2.5, "reasons": []},
        "eval_samples": {"count": 2, "reasons": ["rejected: bad row"]},
    }
    with Journal.create(runs, local_id="hostile") as journal:
        journal._tx.write(lambda txn: journal._tx.put_meta(txn, "journal.losses", hostile))
    path = runs / "hostile"
    kept = {"eval_samples": {"count": 2, "reasons": ["rejected: bad row"]}}
    row = _ls(runs)["hostile"]
    assert row["losses"] == kept, row
    named = [d for d in row["damage"] if "journal.losses" in d]
    assert len(named) == 3 and any("'traces'" in d and "-1000" in d for d in named), row
    status = describe(journal_info(path))
    assert status.losses == kept and status.losses_total == 2
    shown = cli_subprocess("show", str(path), "--json")
    assert shown.returncode == 4, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["losses"] == kept, doc
    assert any("-1000" in d for d in doc["damage"]), doc["damage"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("journal.compacted_upto", -5),
        ("journal.compacted_upto", 1.5e300),
        ("journal.dicts", {"episode": {"id": 1}}),
    ],
)
def test_a_journal_whose_own_meta_is_of_the_wrong_shape_is_shown_and_exported(
    name: str, value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile compaction floor or dictionary table (a journal is untrusted
    input) is read as none: ``show`` and ``export`` give every entry, where
    they ended in a traceback."""
    runs = point_at(monkeypatch, tmp_path, None)
    path = _offline_eval(runs, 3)
    with Journal.open(path) as journal:
        journal._tx.write(lambda txn: journal._tx.put_meta(txn, name, value))
    shown = cli_subprocess("show", str(path), "--json")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert json.loads(shown.stdout)["counts"]["episodes"] == 3
    exported = cli_subprocess("export", str(path))
    assert exported.returncode == 0, exported.stderr
    assert len(exported.stdout.splitlines()) == 3


def test_a_finished_online_run_whose_process_lives_on_is_not_listed_as_running(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook, or a script that runs several evaluations: the process
    outlives each run, and its uplink shares the run's lock until it is done."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = pr.init(environments=["gsm8k"], model="m", mode="online", api_key=API_KEY,
                  base_url=local_platform.url, runs_dir=runs)  # fmt: skip
    run.log_episodes(workloads.gsm8k(3))
    run.finish()
    assert run.journal_path is not None
    row = _ls(runs)[run.journal_path.name]
    assert (row["outcome"], row["shipping"], row["owner"]) == ("completed", "shipped", None)


def test_replay_json_reports_every_run_named_even_one_it_must_refuse(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    done = _offline_eval(runs, 4)
    live = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    live.log_episodes(workloads.gsm8k(1))
    assert live.journal_path is not None
    try:
        shipped = cli_subprocess(
            "sync",
            str(done),
            str(live.journal_path),
            "--json",
            env=_shipping_env(local_platform.url),
        )
    finally:
        live.finish()
    assert shipped.returncode == 3, shipped.stderr  # the worst of the two: refused
    results = {r["local_id"]: r for r in json.loads(shipped.stdout)}
    assert results[done.name]["ok"] and results[done.name]["exit_code"] == 0
    refused = results[live.journal_path.name]
    assert refused["exit_code"] == 3 and "still running" in refused["error"]


def test_sync_bars_end_complete_and_a_sink_with_nothing_to_ship_says_so(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train_samples`` counts every episode and ships every 10th step's: a
    shipment that succeeded draws it full, not at 10%; the metrics sink of a
    run that logged none says so, not ``0/0 0%``."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = pr.init(kind="train", model="m", team_id="team-a", mode="offline", runs_dir=runs)
    run.log_episodes(workloads.agentic(36))  # steps 0-11, three each
    run.finish()
    assert run.journal_path is not None
    env = {**_shipping_env(local_platform.url), "PRIME_TRACES_OPT_OUT": "1"}
    done = cli_subprocess("sync", "--runs-dir", str(runs), run.journal_path.name, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    bars = {line.split()[0]: line for line in done.stdout.splitlines() if "━" in line}
    assert set(bars) == {"train_samples"}, done.stdout
    assert "36/36 episodes" in bars["train_samples"] and "100%" in bars["train_samples"]
    said = [line.split() for line in done.stdout.splitlines()]
    assert ["train_metrics", "nothing", "to", "ship"] in said, done.stdout
    assert "0/0" not in done.stdout


def test_sync_of_a_run_whose_owner_lives_refuses_before_drawing_anything(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    live = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    live.log_episodes(workloads.gsm8k(2))
    assert live.journal_path is not None
    try:
        shipped = cli_subprocess(
            "sync", str(live.journal_path), env=_shipping_env(local_platform.url)
        )
    finally:
        live.finish()
    assert shipped.returncode == 3, shipped.stdout + shipped.stderr
    assert "refused" in shipped.stderr and "still running" in shipped.stderr
    assert shipped.stdout == "", "no bar, no head: the refusal is all that is said"


def test_a_sync_whose_only_loss_is_a_refused_record_closes_the_run_and_exits_0(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metrics row the platform refuses for its content (422: its values'
    own step is no integer) is counted lost with the reason, and the run is
    closed out. The sync said "incomplete: the run could not be closed out"
    and "run the command again to retry", and exited 1; the same command
    again exited 0, with nothing more shipped: the exit told a script a
    retry would help where none could."""
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(kind="train", model="m", team_id="team-a", mode="offline", runs_dir=runs)
    run.log_metrics({"loss": 1.0}, step=0)
    run.log_metrics({"loss": 1.0, "step": 1.5})  # the platform's to refuse
    run.log_metrics({"loss": 1.0}, step=2)
    run.finish()
    assert run.journal_path is not None
    env = _shipping_env(local_platform.url)
    for attempt in range(2):
        done = cli_subprocess("sync", str(run.journal_path), "--json", env=env)
        [report] = json.loads(done.stdout)
        assert done.returncode == 0, (attempt, done.stdout, done.stderr)
        assert report["closed_out"] and report["ok"] and report["errors"] == []
        [reason] = report["losses"]["train_metrics"]["reasons"]
        assert report["losses"]["train_metrics"]["count"] == 1 and "422" in reason
    stored = local_platform.run(report["run_id"])
    assert stored["status"] == "COMPLETED"
    assert stored["train_metrics"] == {"rows": 2, "steps": 2}
    text = cli_subprocess("sync", str(run.journal_path), env=env)
    assert "could not be closed out" not in text.stdout
    assert "lost 1 for train_metrics" in text.stdout


def test_a_metric_row_nested_past_the_decoders_limit_is_damage_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal is untrusted: a metric row of arrays nested 100,000 deep (a
    few hundred KB) made ``show`` and a Parquet ``export`` die with a
    RecursionError's traceback. It is named as damage, the rest is shown."""
    pytest.importorskip("pyarrow")
    runs = point_at(monkeypatch, tmp_path, None)
    deep = b"[" * 100_000 + b"]" * 100_000
    with Journal.create(runs, local_id="deep", meta={"spec": {"kind": "train"}}) as journal:
        journal.append(EntryKind.METRICS, [b'{"step": 0, "loss": 1.5}'])
        journal.append(EntryKind.METRICS, [b'{"step": 1, "hostile": ' + deep + b"}"])
        journal.append(EntryKind.METRICS, [b'{"step": 2, "loss": 0.5}'])
        path = journal.path
    out = tmp_path / "rows.parquet"
    for argv in (
        ("show", str(path)),
        ("show", str(path), "--json"),
        ("show", str(path), "--full"),
        ("export", str(path), "--kind", "metrics", "-o", str(out)),
    ):
        done = cli_subprocess(*argv)
        assert "Traceback" not in done.stderr, (argv, done.stderr[-2000:])
        assert done.returncode == 4, (argv, done.returncode)
        assert "entry 2" in done.stdout + done.stderr, argv
    shown = json.loads(cli_subprocess("show", str(path), "--json").stdout)
    assert "loss" in json.dumps(shown)


def test_a_metric_rows_numbers_past_the_floats_are_drawn_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JSON as Python reads it takes ``Infinity``, ``NaN`` and integers of any
    length: a row stepped so, or a value of 400 digits, made ``show`` die with
    an OverflowError's traceback. Such a step takes the row's place, as a row
    without a step does, and such a value is the infinity of its sign."""
    runs = point_at(monkeypatch, tmp_path, None)
    big = b"1" + b"0" * 400
    with Journal.create(runs, local_id="steps", meta={"spec": {"kind": "train"}}) as journal:
        rows = [b'{"step": Infinity, "loss": 1.5}', b'{"step": NaN, "loss": 1.0}']
        rows.append(b'{"step": 3, "loss": 2.0, "huge": -' + big + b"}")
        journal.append(EntryKind.METRICS, [*rows, b'{"step": 7, "loss": 0.5}'])
        path = journal.path
    for argv in (("show", str(path)), ("show", str(path), "--json")):
        done = cli_subprocess(*argv)
        assert "Traceback" not in done.stderr, (argv, done.stderr[-2000:])
        assert done.returncode == 0, (argv, done.returncode)
    loss = json.loads(cli_subprocess("show", str(path), "--json").stdout)["metrics"]["loss"]
    assert (loss["points"], loss["steps"], loss["last"]) == (4, [0, 7], 0.5)
