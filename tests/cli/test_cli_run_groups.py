"""``ls`` and ``show`` of a run made of several journals (issue #29): a run's
workers' journals and its ranks' are listed together under the run, not as
unrelated runs, and ``show`` of any of them shows the whole run, with totals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import workloads
from cli_helpers import cli
from sdk_helpers import point_at

import primeruns as pr


def _eval_with_workers(runs: Path, workers: int) -> tuple[Path, list[Path]]:
    """An offline evaluation and its joined workers' journals, each worker
    logging two episodes of its own and the run one."""
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    episodes = workloads.gsm8k(1 + 2 * workers)
    run.log_episodes(episodes[:1])
    handle = run.handle()
    children = []
    for w in range(workers):
        worker = pr.join(handle)
        worker.log_episodes(episodes[1 + 2 * w : 3 + 2 * w])
        worker.finish()
        assert worker.journal_path is not None
        children.append(worker.journal_path)
    run.finish()
    assert run.journal_path is not None
    return run.journal_path, children


def _ranks(runs: Path, run_id: str, ranks: int, primary: int) -> list[Path]:
    """Offline training ranks attached to ``run_id``, one metrics row each."""
    paths = []
    for rank in range(ranks):
        run = pr.init(
            kind="train", id=run_id, model="m", mode="offline", runs_dir=runs,
            primary=rank == primary,
        )  # fmt: skip
        run.log_metrics({f"loss_r{rank}": 1.0}, step=0)
        run.finish()
        assert run.journal_path is not None
        paths.append(run.journal_path)
    return paths


def _alone(runs: Path) -> Path:
    run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    run.log_episodes(workloads.gsm8k(1))
    run.finish()
    assert run.journal_path is not None
    return run.journal_path


def test_ls_lists_a_runs_journals_together_under_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    parent, workers = _eval_with_workers(runs, 2)
    lone = _alone(runs)  # made after the evaluation, before the ranks
    # The primary is the second rank made: the run's head, though not its oldest.
    ranks = _ranks(runs, "run-of-ranks", 3, primary=1)

    code, out, _ = cli(capsys, "ls", "--runs-dir", str(runs), "--json")
    assert code == 0
    rows: list[dict[str, Any]] = json.loads(out)
    order = [row["local_id"] for row in rows]
    head_of_ranks = ranks[1].name

    def run_at(head: str, others: list[str]) -> list[str]:
        """The rows from the head's on: the head, then the others (by name:
        journals made within one second sort by their random tail)."""
        return [head, *sorted(others)]

    at = order.index(parent.name)
    assert order[at : at + 3] == run_at(parent.name, [w.name for w in workers])
    at = order.index(head_of_ranks)
    assert order[at : at + 3] == run_at(head_of_ranks, [ranks[0].name, ranks[2].name])
    assert sorted(order) == sorted(
        [parent.name, *(w.name for w in workers), lone.name] + [r.name for r in ranks]
    )
    by_id = {row["local_id"]: row for row in rows}
    assert by_id[parent.name]["journals"] == sorted(w.name for w in workers)
    assert by_id[parent.name]["run_totals"]["counts"]["episodes"] == 5
    assert by_id[parent.name]["run_totals"]["journals"] == 3
    assert {by_id[w.name]["run_of"] for w in workers} == {parent.name}
    assert {by_id[w.name]["role"] for w in workers} == {"worker"}
    assert by_id[lone.name]["run_of"] is None and by_id[lone.name]["journals"] == []
    assert by_id[head_of_ranks]["journals"] == sorted([ranks[0].name, ranks[2].name])
    assert by_id[head_of_ranks]["role"] == "primary"
    assert by_id[head_of_ranks]["run_totals"]["counts"]["metrics"] == 3
    assert {by_id[r.name]["run_of"] for r in (ranks[0], ranks[2])} == {head_of_ranks}

    # On a terminal: the others' lines marked under the head's, and the runs counted.
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = cli(capsys, "ls", "--runs-dir", str(runs))
    assert code == 0
    lines = out.splitlines()
    at = {name: i for name in order for i, line in enumerate(lines) if name in line}
    assert [at[name] for name in order] == sorted(at.values())  # as --json orders them
    for name in [*(w.name for w in workers), ranks[0].name, ranks[2].name]:
        assert lines[at[name]].lstrip().startswith(f"└ {name}"), lines[at[name]]
    for name in [parent.name, lone.name, head_of_ranks]:
        assert lines[at[name]].startswith(name), lines[at[name]]
    assert "3 run(s), 7 journals" in out


def test_show_of_any_journal_of_a_run_shows_the_whole_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    parent, workers = _eval_with_workers(runs, 2)
    lone = _alone(runs)
    for shown in (parent, workers[1]):
        code, out, _ = cli(capsys, "show", str(shown), "--json")
        assert code == 0
        run = json.loads(out)["run"]
        assert run["head"] == parent.name
        journals = run["journals"]
        assert [j["local_id"] for j in journals] == [parent.name, *sorted(w.name for w in workers)]
        assert [j["counts"]["episodes"] for j in journals] == [1, 2, 2]
        assert run["totals"]["counts"]["episodes"] == 5 and run["totals"]["journals"] == 3
    code, out, _ = cli(capsys, "show", str(lone), "--json")
    assert json.loads(out)["run"] is None

    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = cli(capsys, "show", str(workers[0]))
    assert code == 0
    assert "the run's journals (3)" in out
    assert f"*{workers[0].name}" in out and f" {parent.name}" in out
    assert "total: 5 episodes" in out


def test_show_of_a_rank_finds_the_ranks_made_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    ranks = _ranks(runs, "run-of-ranks", 3, primary=0)
    code, out, _ = cli(capsys, "show", str(ranks[2]), "--json")
    assert code == 0
    run = json.loads(out)["run"]
    assert [j["local_id"] for j in run["journals"]] == [
        ranks[0].name,
        *sorted(r.name for r in ranks[1:]),
    ]
    assert [j["role"] for j in run["journals"]] == ["primary", "attached", "attached"]
    assert run["totals"]["counts"]["metrics"] == 3


@pytest.fixture
def tallied(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The journals whose entries are counted (a scan of each entry) from now on."""
    from primeruns.journal import journal as journal_module

    seen: list[str] = []
    real = journal_module.Journal.tally

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(self.path.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(journal_module.Journal, "tally", counting)
    return seen


@pytest.mark.parametrize("attached", [False, True], ids=["made-here", "attached-by-id"])
def test_show_counts_the_entries_of_its_own_run_only(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tallied: list[str],
    attached: bool,
) -> None:
    """The journals beside a run are read to learn which run each is (their
    meta, kept in their summaries); only the run's own are counted. A long
    run made later in the directory, whose counts no summary holds yet, was
    counted whole by ``show`` of a small one (a 100,000-step run beside it:
    2.3 s and 107 MB for ``show`` of a 200-step run)."""
    runs = point_at(monkeypatch, tmp_path, None)
    if attached:
        shown, *_ = _ranks(runs, "run-of-ranks", 2, primary=0)
    else:
        shown, _ = _eval_with_workers(runs, 1)
    other = _alone(runs)
    journals = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")]
    worker = [p for p in journals if p not in (shown, other)]
    for kept in (runs / ".summaries").iterdir():  # as after a long run: no counts kept
        kept.unlink()
    tallied.clear()
    code, out, _ = cli(capsys, "show", str(shown), "--json")
    assert code == 0
    run = json.loads(out)["run"]
    assert {j["local_id"] for j in run["journals"]} == {shown.name, *(p.name for p in worker)}
    assert other.name not in tallied
    assert set(tallied) == {shown.name, *(p.name for p in worker)}
