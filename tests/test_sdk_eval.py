"""Evaluation runs end to end against the local platform over loopback HTTP."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import module_platform
import pytest
import workloads
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.metrics import from_episodes

# The runs of these tests are told apart by id: one server serves them all.
_server, local_platform = module_platform.fixtures()


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float | int) and isinstance(b, float | int):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def _eval(runs: Path, url: str, episodes: list[dict[str, Any]], batch: int = 25) -> pr.Run:
    run = pr.init(
        name="gsm8k-test",
        environments=["gsm8k"],
        model="Qwen/Qwen3-8B",
        framework="verifiers",
        api_key=API_KEY,
        base_url=url,
        runs_dir=runs,
    )
    for i in range(0, len(episodes), batch):
        run.log_episodes(episodes[i : i + batch])
    run.finish(summary=from_episodes(episodes), timeout=120)
    return run


def _assert_landed_once(stored: dict[str, Any], n: int) -> None:
    traces = stored["traces"]
    assert traces["episodes"] == traces["distinct_episodes"] == n
    assert traces["traces"] == traces["distinct_traces"]
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == n


def test_eval_of_500_episodes_lands_once_and_completes(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    episodes = workloads.gsm8k(500)
    run = _eval(runs, local_platform.url, episodes)
    assert run.finished and run.status is pr.RunStatus.COMPLETED
    assert run.url and run.id in run.url
    assert run.dropped_records == 0 and run.failed_records == {}
    stored = local_platform.run(run.id)
    _assert_landed_once(stored, 500)
    assert stored["status"] == "COMPLETED"
    expected = dict(from_episodes(episodes))
    summary = dict(stored["summary"])
    assert summary.pop("prime_runs") == {"traces_episodes_written": 500}
    assert _close(summary, expected)


def test_eval_with_retryable_and_ambiguous_faults_has_no_loss_and_no_duplicate(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = local_platform
    lp.set_faults(retryable_rate=0.3, ambiguous_rate=0.1, seed=7)
    runs = point_at(monkeypatch, tmp_path, lp.url)
    episodes = workloads.gsm8k(500)
    run = _eval(runs, lp.url, episodes)
    assert run.status is pr.RunStatus.COMPLETED
    assert run.dropped_records == 0
    assert run.failed_records == {}
    lp.set_faults(retryable_rate=0.0, ambiguous_rate=0.0)
    stored = lp.run(run.id)
    _assert_landed_once(stored, 500)
    assert stored["status"] == "COMPLETED"


def test_platform_down_for_the_whole_run_then_back_before_finish(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    lp.stop()  # connections refused from here on
    episodes = workloads.gsm8k(120)
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    assert run.url is None  # not registered yet: the platform is down
    for i in range(0, len(episodes), 10):
        run.log_episodes(episodes[i : i + 10])  # never raises, never waits on the network
    assert run.journal_path is not None and run.journal_path.is_dir()
    lp.start()
    run.finish(timeout=120)
    assert run.url is not None
    stored = lp.run(run.id)
    _assert_landed_once(stored, 120)
    assert stored["status"] == "COMPLETED"
    assert run.failed_records == {} and run.dropped_records == 0


def test_failed_run_reports_its_reason(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    with pytest.raises(RuntimeError, match="boom"):  # the producer's exception is kept
        with pr.init(
            environments=["gsm8k"], api_key=API_KEY, base_url=local_platform.url, runs_dir=runs
        ) as run:
            run.log_episodes(workloads.gsm8k(3))
            raise RuntimeError("boom")
    assert run.status is pr.RunStatus.FAILED and run.finished
    stored = local_platform.run(run.id)
    assert stored["status"] == "FAILED"
    assert "RuntimeError: boom" in stored["error_message"]
    assert stored["traces"]["distinct_episodes"] == 3


def test_keyboard_interrupt_cancels_the_run(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    with (
        pytest.raises(KeyboardInterrupt),
        pr.init(
            environments=["gsm8k"], api_key=API_KEY, base_url=local_platform.url, runs_dir=runs
        ) as run,
    ):
        raise KeyboardInterrupt
    assert run.status is pr.RunStatus.CANCELLED
    assert local_platform.run(run.id)["status"] == "CANCELLED"


def test_wrong_api_key_raises_from_init(
    make_local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = make_local_platform(api_key="the-right-key-123")
    runs = point_at(monkeypatch, tmp_path, lp.url)
    with pytest.raises(pr.UnauthorizedError) as info:
        pr.init(environments=["gsm8k"], api_key="wrong-key-456", base_url=lp.url, runs_dir=runs)
    assert "wrong-key-456" not in str(info.value)


def test_unresolvable_environment_fails_init(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    with pytest.raises(pr.EnvironmentResolutionError, match="nobody/nothing"):
        pr.init(
            environments=["nobody/nothing"],
            api_key=API_KEY,
            base_url=local_platform.url,
            runs_dir=runs,
        )


def test_verifiers_style_usage_through_the_vendor_import_name(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prime_runs
    from prime_runs.projection import build_samples

    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)
    monkeypatch.setenv("PRIME_API_BASE_URL", local_platform.url)
    monkeypatch.setenv("PRIME_RUNS_DIR", str(runs))
    assert prime_runs.MODE_ENV == "PRIME_RUNS_MODE"
    episodes = workloads.gsm8k(10)
    assert len(build_samples(episodes)) == 10
    run = prime_runs.init(
        mode="online",
        id=None,
        name="vf-eval",
        environments=["gsm8k"],
        model="Qwen/Qwen3-8B",
        framework="verifiers",
        config={"model": "Qwen/Qwen3-8B", "num_examples": 10, "rollouts_per_example": 1},
    )
    assert run.url is not None and run.status is prime_runs.RunStatus.RUNNING
    run.log_episodes(episodes)
    summary = prime_runs.metrics.from_episodes(episodes)
    run.finish(summary)
    assert run.finished and run.status is prime_runs.RunStatus.COMPLETED
    assert run.dropped_records == 0 and run.failed_records == {}
    stored = local_platform.run(run.id)
    # The config as given, beside the SDK's own namespace (the registration token).
    config = dict(stored["config"])
    assert set(config.pop("prime_runs")) == {"client_token"}
    assert config == {
        "model": "Qwen/Qwen3-8B",
        "num_examples": 10,
        "rollouts_per_example": 1,
    }
    assert stored["samples"]["rows"] == 10


def test_a_record_over_the_line_limit_fails_alone(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import primeruns.sinks.traces as traces_sink

    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setattr(traces_sink, "MAX_LINE_BYTES", 40_000)  # the service's is 64 MiB
    # Shipped from threads in this process, where the lowered limit applies
    # (the uplink process would have the service's own).
    monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")
    episodes = workloads.gsm8k(6)
    episodes[2]["info"] = {"padding": "x" * 50_000}
    run = pr.init(
        environments=["gsm8k"], api_key=API_KEY, base_url=local_platform.url, runs_dir=runs
    )
    run.log_episodes(episodes)
    run.finish(timeout=60)
    assert run.failed_records == {"traces": 1}
    assert any("40000" in e for e in run.errors)
    stored = local_platform.run(run.id)
    assert stored["traces"]["distinct_episodes"] == 5
    assert stored["samples"]["rows"] == 6  # the sample table still took it


@contextlib.contextmanager
def _journal_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[Path], list[Path]]]:
    """The journals opened, and those probed in a child, meanwhile."""
    from primeruns.journal import Journal
    from primeruns.journal import listing as listing_module

    opened: list[Path] = []
    probed: list[Path] = []
    real_open, real_probe = Journal.open, listing_module.probe_many

    def spy_open(path: Path, *args: Any, **kwargs: Any) -> Journal:
        opened.append(Path(path))
        return real_open(path, *args, **kwargs)

    def spy_probe(paths: list[Path]) -> Any:
        probed.extend(paths)
        return real_probe(paths)

    with monkeypatch.context() as spied:
        spied.setattr(Journal, "open", spy_open)
        spied.setattr(listing_module, "probe_many", spy_probe)
        yield opened, probed


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_a_finished_run_is_listed_from_the_summary_it_kept_without_opening_it(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A journal changed in the last seconds had no current summary, so the
    listing right after a run (``ls``; the next run's close-out in a sweep,
    looking for its run's other processes) probed it in a child and opened
    it: 40-190 ms a journal. The finish keeps the run's summary; a listing
    then reads it, and says what reading the journal says."""
    from primeruns.journal import list_journals
    from primeruns.reports import describe

    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv("PRIME_RUNS_MODE", mode)
    run = _eval(runs, local_platform.url, workloads.gsm8k(3))
    assert run.status is pr.RunStatus.COMPLETED and run.journal_path is not None

    with _journal_reads(monkeypatch) as (opened, probed):
        (listed,) = list_journals(runs)
    assert opened == [] and probed == []

    shelf = runs / ".summaries"
    for kept in shelf.iterdir():
        kept.unlink()  # what the journal itself says, read afresh
    (read,) = list_journals(runs)
    seen = (listed.last_seq, listed.cursors, listed.meta)
    assert seen == (read.last_seq, read.cursors, read.meta)
    assert describe(listed).finish == describe(read).finish
    assert (describe(read).finish or {}).get("status") == "completed"


def test_ls_right_after_a_run_reads_the_summary_its_finish_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finish keeps the run's summary so that ``ls`` right after it reads
    that instead of probing the journal in a child (40-190 ms) and opening
    it (docs/ARCHITECTURE.md, ``listing.keep_summary``). ``ls`` lists with
    counts (``statuses``: ``tally=True``), so the kept summary must hold them.
    The finish reads and counts it in one open (a second, to count, cost ~3 ms
    of a 2,000-episode run's close-out)."""
    from primeruns.reports import statuses

    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name="x", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    run.log_episodes(workloads.gsm8k(3))
    with _journal_reads(monkeypatch) as (opened, _):
        run.finish()
    assert opened == [run.journal_path]

    with _journal_reads(monkeypatch) as (opened, probed):
        (listed,) = statuses(runs)
    assert listed.info.path == run.journal_path
    assert opened == [] and probed == []


def test_the_finish_of_a_long_run_does_not_count_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finish keeps its run's summary, counts included, only up to a
    bound of entries: counting reads every entry's header, and a long run
    whose shipping kept up must not pay for its length at its finish. Its
    counts are then read by the first listing that shows them."""
    from primeruns.journal import Journal
    from primeruns.journal import listing as listing_module
    from primeruns.reports import statuses

    runs = point_at(monkeypatch, tmp_path, None)
    monkeypatch.setattr(listing_module, "TALLY_AT_FINISH_MOST", 5)
    counted: list[int] = []
    real_tally = Journal.tally

    def spy_tally(self: Journal, *args: Any, **kwargs: Any) -> Any:
        counted.append(self.last_seq())
        return real_tally(self, *args, **kwargs)

    monkeypatch.setattr(Journal, "tally", spy_tally)
    short = pr.init(name="s", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    short.log_episodes(workloads.gsm8k(2))
    short.finish()
    assert len(counted) == 1 and counted[0] <= 5
    long = pr.init(name="l", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    long.log_episodes(workloads.gsm8k(8))
    long.finish()
    assert len(counted) == 1  # not counted at its finish
    listed = {s.info.path: s for s in statuses(runs)}
    assert len(counted) == 2  # by the listing that shows its counts
    assert listed[long.journal_path].info.last_seq > 5


def test_finish_with_the_episodes_written_count_unreadable_never_raises(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close-out reads how many episodes Prime Traces acknowledged to put
    it in the summary; a journal damaged there (a rotted value, or its file
    truncated under the run) raised JournalCorruptError out of finish(),
    into the caller's code, under on_error="warn". The run still ends."""
    from primeruns.journal.frames import encode_frame
    from primeruns.journal.layout import META_KIND

    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    episodes = workloads.gsm8k(4)
    run.log_episodes(episodes)
    assert run.flush(timeout=60)
    journal = run._recorder.journal
    assert journal is not None
    tx = journal._tx
    # A frame whose payload is not JSON: the value reads as damaged.
    with tx.lock, tx.store.begin(write=True) as txn:
        txn.put(b"episodes_written", encode_frame(META_KIND, b"\xff{"), db=tx.dbs["meta"])
    run.finish(timeout=60)
    assert run.status is pr.RunStatus.COMPLETED
    assert lp.run(run.id)["status"] == "COMPLETED"
    assert lp.run(run.id)["traces"]["episodes"] == len(episodes)


def test_records_logged_after_the_open_spool_segment_was_truncated_all_land(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``cp`` or ``rsync --inplace`` onto the journal truncates the spool
    segment the run is writing. Appended after the cut, every later record
    fell where no reader finds it: all were counted failed, the finish entry
    too, and the run, finished as completed, was closed on the platform as
    crashed. They go to a new segment now, and all land."""
    import os

    from sdk_helpers import platform_episode_ids

    from primeruns.journal.spool import list_segments

    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    episodes = workloads.gsm8k(40)
    run.log_episodes(episodes[:20])
    assert run.flush(timeout=60)  # shipped: the cut takes nothing the platform lacks
    journal = run._recorder.journal
    assert journal is not None and journal.path is not None
    [(_, name)] = list_segments(journal.path)
    segment = journal.path / name
    os.truncate(segment, segment.stat().st_size // 2)
    rehomer = run._recorder.rehomer
    assert rehomer is not None
    rehomer.next_look = 0.0  # it looks every 50 ms: at the next append here
    for i in range(20, 40, 5):
        run.log_episodes(episodes[i : i + 5])
    run.finish(timeout=60)
    assert run.status is pr.RunStatus.COMPLETED
    stored = platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == {e["id"] for e in episodes}, run.failed_records
    assert max(stored.values()) == 1
    assert lp.run(run.id)["status"] == "COMPLETED"


def test_an_evaluation_whose_first_row_is_over_an_answers_bound_lands_every_row(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An episode whose sample row is ~19 MB (within a push's 25 MiB, over the
    client's 16 MiB bound for an answer) is the table's first row: the length
    read before each later batch (a page of that row) was cut off at the
    bound, and no later row ever landed."""
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    episodes = workloads.gsm8k(21)
    node = episodes[0]["traces"][0]["nodes"][2]["message"]
    node["reasoning_content"] = "r" * (9 << 20)  # projected twice into its row
    run = pr.init(
        environments=["gsm8k"], api_key=API_KEY, base_url=local_platform.url, runs_dir=runs
    )
    run.log_episodes(episodes[:1])
    assert run.flush(timeout=120)
    run.log_episodes(episodes[1:])
    run.finish(timeout=120)
    stored = local_platform.run(run.id)
    assert run.errors == [] and run.failed_records == {}
    _assert_landed_once(stored, 21)
