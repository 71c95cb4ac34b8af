"""Offline runs send nothing; ``sync`` registers and ships them exactly once;
``ls`` says what state each is in; ``gc`` deletes only what is safe to delete."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import workloads
from cli_helpers import break_entry_header, cli, landed_once
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns import closing
from primeruns.journal import EntryKind, Journal


def _offline_eval(runs: Path, url: str, n: int, *, finish: bool = True) -> pr.Run:
    run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, base_url=url, runs_dir=runs)
    assert run.mode == "offline"
    for episode in workloads.gsm8k(n):
        run.log_episodes([episode])
    if finish:
        run.finish()
    return run


def _states(capsys: pytest.CaptureFixture[str], runs: Path) -> dict[str, str]:
    code, out, _ = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
    assert code == 0
    return {row["local_id"]: row["state"] for row in json.loads(out)}


def test_offline_run_sends_nothing_then_sync_ships_it_once(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_RUNS_MODE", "offline")
    run = _offline_eval(runs, local_platform.url, 25)
    assert run.journal_path is not None
    assert local_platform.runs() == []  # offline: nothing left the machine
    assert _states(capsys, runs) == {run.journal_path.name: "offline"}

    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, out, err = cli(capsys, "sync", "--runs-dir", str(runs))
    assert code == 0, out + err
    [listed] = local_platform.runs()
    stored = local_platform.run(listed["id"])
    assert stored["status"] == "COMPLETED"
    assert landed_once(stored, 25)
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == 25
    assert _states(capsys, runs) == {run.journal_path.name: "shipped"}

    # Syncing again finds nothing to do and duplicates nothing.
    code, out, _ = cli(capsys, "sync", "--runs-dir", str(runs))
    assert code == 0 and "no offline runs" in out
    assert landed_once(local_platform.run(listed["id"]), 25)


def test_gc_deletes_shipped_journals_and_never_pending_ones_without_force(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_RUNS_MODE", "offline")
    shipped = _offline_eval(runs, local_platform.url, 3).journal_path
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    assert cli(capsys, "sync", "--runs-dir", str(runs), "--all")[0] == 0
    pending = _offline_eval(runs, local_platform.url, 3).journal_path
    assert shipped is not None and pending is not None

    # Young journals are kept by the default threshold (7 days).
    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs))
    assert code == 0 and shipped.exists() and pending.exists()

    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--dry-run")
    assert code == 0 and shipped.name in out and pending.name not in out
    assert shipped.exists()

    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0")
    assert code == 0
    assert not shipped.exists()
    assert pending.exists()  # it still has records nobody received

    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--force")
    assert code == 0 and not pending.exists()
    # The loss is said and counted, not only the journal's size.
    assert f"{pending.name} (offline, " in out and "3 records never shipped, lost" in out, out


def test_gc_rejects_a_bad_duration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli(capsys, "gc", "--runs-dir", str(tmp_path), "--older-than", "soon")
    assert exc.value.code == 2


def test_sync_with_base_url_moves_prime_traces_along(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An offline run journaled where Prime Traces pointed elsewhere (an
    air-gapped node's settings), synced with ``--base-url``: its traces go to
    that platform too. Before, they went to the recorded address and never
    landed."""
    runs = point_at(monkeypatch, tmp_path, "http://127.0.0.1:9")  # nowhere
    monkeypatch.setenv("PRIME_RUNS_MODE", "offline")
    run = _offline_eval(runs, "http://127.0.0.1:9", 5)
    monkeypatch.delenv("PRIME_RUNS_MODE")
    monkeypatch.delenv("PRIME_TRACES_URL")
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, out, err = cli(capsys, "sync", "--runs-dir", str(runs), "--base-url", local_platform.url)
    assert code == 0, out + err
    [listed] = local_platform.runs()
    stored = local_platform.run(listed["id"])
    assert landed_once(stored, 5) and stored["samples"]["rows"] == 5
    assert run.journal_path is not None


def test_gc_keeps_a_closed_out_run_whose_unshipped_entry_is_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A close-out may finalize with records left; if the only ones left
    cannot be read, they are still data nobody received."""
    runs = tmp_path / "runs"
    episodes = [json.dumps({"id": f"e{i}", "prompt": os.urandom(64).hex()}) for i in range(12)]
    with Journal.create(runs, local_id="victim", meta={"spec": {"kind": "eval"}}) as journal:
        journal.append(EntryKind.EPISODE, [e.encode() for e in episodes])
        for sink in ("traces", "eval_samples"):
            journal.ack(sink, 10)
        journal.set_meta("finalized", {"status": "completed", "at": 0})
    path = runs / "victim"
    break_entry_header(path, 11)
    _, out, _ = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
    [row] = json.loads(out)
    assert row["shipping"] == "2 pending" and row["state"] != "shipped", row
    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "-v")
    assert code == 0 and path.exists(), out
    assert "2 records still to ship" in out


def test_gc_keeps_a_closed_out_run_whose_spec_and_one_sinks_offset_are_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an adversarial review: an evaluation closed out with records
    left (its sample table down at the finish: a close-out finalizes all
    the same), then damaged on disk, its spec and its ``eval_samples``
    offset unreadable. With the spec damaged, ``ls`` counted what is left
    past the lowest offset among the readable ones only (traces', all
    acknowledged) and listed the run as shipped, nothing pending, though
    its sample table never received 8 of its episodes (so ``replay --all``
    passed it over as shipped; ``gc`` kept it only for the damage its own
    walk finds). A sink the journal names (the standing its shipper
    recorded) whose offset cannot be read acknowledged nothing, as with a
    readable spec."""
    runs = tmp_path / "runs"
    episodes = [json.dumps({"id": f"e{i}", "prompt": os.urandom(64).hex()}) for i in range(12)]
    with Journal.create(runs, local_id="victim", meta={"spec": {"kind": "eval"}}) as journal:
        journal.append(EntryKind.EPISODE, [e.encode() for e in episodes])
        journal.ack("traces", 12)
        journal.ack("eval_samples", 4)
        for sink in ("traces", "eval_samples"):
            journal.set_meta(f"sink_state.{sink}", {"off": None, "retired": None})
        journal.set_meta("finalized", {"status": "completed", "at": 0})
        journal.set_meta("spec", {"kind": 7})
        cursors = journal._tx.dbs["cursors"]
        journal._tx.write(lambda txn: txn.put(b"eval_samples", b"damaged", db=cursors))
    _, out, _ = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
    [row] = json.loads(out)
    assert row["pending"] == {"sinks unknown (spec damaged)": 12}, row
    assert row["shipping"] == "spec damaged" and row["state"] != "shipped", row
    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "-v")
    assert code == 0 and (runs / "victim").exists(), out


@pytest.mark.parametrize(
    "record",
    [
        b"[1, 2]",
        b"[" * 100_000 + b"]" * 100_000,
        b"not json",
        b'{"status": "completed", "summary": [1], "error": {"x": 1}}',
    ],
    ids=["a-list", "nested-deep", "not-json", "fields-of-other-types"],
)
def test_sync_of_a_journal_whose_finish_record_is_not_one_ships_it_and_closes_it_failed(
    record: bytes,
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A journal is untrusted input (a copy from another host, damaged or
    crafted): its finish record, which decides how the run is closed, may
    be anything. Before, each of these stopped ``sync`` with a traceback
    (AttributeError, RecursionError, JSONDecodeError) or sent the platform
    a summary that is not an object; nothing was closed."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_RUNS_MODE", "offline")
    run = _offline_eval(runs, local_platform.url, 0, finish=False)
    run.log_episodes(workloads.gsm8k(4))
    encode = closing.records.encode_record
    monkeypatch.setattr(
        closing.records,
        "encode_record",
        lambda value, what: record if what == "finish" else encode(value, what=what),
    )
    run.finish()
    monkeypatch.undo()
    point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    code, out, err = cli(capsys, "sync", "--runs-dir", str(runs))
    assert "Traceback" not in out + err
    assert len(local_platform.runs()) == 1, (code, out, err)
    [listed] = local_platform.runs()
    stored = local_platform.run(listed["id"])
    assert landed_once(stored, 4)
    if record.startswith(b"{"):
        assert stored["status"] == "COMPLETED"  # what it says, in the types it is sent as
    else:
        assert stored["status"] == "FAILED", (code, out, err)
