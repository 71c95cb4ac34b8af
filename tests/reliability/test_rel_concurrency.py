"""Concurrency (issue #8 §6): many threads and an asyncio loop logging into one
run at once; a fork in the middle of a run (multiprocessing with fork); two
processes attaching to the same training run id at once. Every record whose
call returned lands exactly once, and nobody sees an exception.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
import rel_helpers as rh
import rel_torture as rt
import workloads

import primeruns as pr
from primeruns.journal import EntryKind, Journal
from primeruns.local import LocalPlatform


def test_threads_and_an_asyncio_loop_logging_at_once_land_exactly_once(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    lp = shared_platform
    episodes = workloads.gsm8k(400)
    errors: list[BaseException] = []
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")

        def worker(part: list[dict[str, Any]]) -> None:
            try:
                for i in range(0, len(part), 3):
                    run.log_episodes(part[i : i + 3])
                    run.update_summary({f"t{threading.get_ident() % 97}": i})
            except BaseException as exc:  # collected: the test fails on any
                errors.append(exc)

        async def coroutine_logger(part: list[dict[str, Any]]) -> None:
            for i in range(0, len(part), 2):
                run.log_episodes(part[i : i + 2])
                await asyncio.sleep(0)

        threads = [
            threading.Thread(target=worker, args=(episodes[k * 40 : (k + 1) * 40],))
            for k in range(8)
        ]
        for t in threads:
            t.start()

        async def main() -> None:
            await asyncio.gather(
                *(coroutine_logger(episodes[320 + k * 20 : 340 + k * 20]) for k in range(4))
            )

        asyncio.run(main())
        for t in threads:
            t.join(120)
        run.finish(timeout=120)
    assert errors == []
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == {e["id"] for e in episodes} and max(stored.values()) == 1
    assert lp.run(run.id)["status"] == "COMPLETED"


class _SlowEpisode:
    """An episode whose encoding takes as long as the test says (a large one)."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.encoding = threading.Event()
        self.go_on = threading.Event()

    def to_record(self) -> dict[str, Any]:
        self.encoding.set()
        assert self.go_on.wait(60)
        return self.record


@pytest.mark.parametrize("shipping", ["uplink", "threads"])
def test_a_call_still_journaling_when_another_thread_finishes_is_refused_not_left_behind(
    shared_platform: LocalPlatform,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shipping: str,
) -> None:
    # A call past its check when another thread's finish() journaled the
    # finish used to append after it; the close-out ships up to the finish,
    # so the run was closed as completed with that record unshipped, its
    # call returned normally, and nothing said so (the journal even read
    # "shipped"). Now that call raises RunFinishedError: a record is either
    # shipped with the run or was never accepted.
    lp = shared_platform
    first, slow_record = workloads.gsm8k(2)
    slow = _SlowEpisode(slow_record)
    raised: list[BaseException] = []

    def log_slowly() -> None:
        try:
            run.log_episodes([slow])
        except BaseException as exc:  # collected: asserted below
            raised.append(exc)

    with rt.sdk_env(lp.url, tmp_path / "home"):
        if shipping == "threads":
            monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes([first])
        logger = threading.Thread(target=log_slowly)
        logger.start()
        assert slow.encoding.wait(30)  # the call is past its check, encoding
        run.finish(timeout=120)
        slow.go_on.set()
        logger.join(60)
    assert len(raised) == 1 and isinstance(raised[0], pr.RunFinishedError), raised
    assert rh.platform_episode_ids(lp.data_dir, run.id) == {first["id"]: 1}
    assert lp.run(run.id)["status"] == "COMPLETED"
    assert run.failed_records == {} and run.dropped_records == 0
    assert run.journal_path is not None
    with Journal.open(run.journal_path, owner=False) as journal:
        last = journal.last_seq()
        finish = journal.read(0, kinds={EntryKind.FINISH}).entries
        assert [e.seq for e in finish] == [last]  # nothing was journaled after it


def _child(run: pr.Run, runs_dir: str, out: Any) -> None:
    """In a forked child: log to the parent's run (through a journal of the
    child's own), then to a run of its own."""
    try:
        run.log_episodes([{"id": "from-child", "traces": []}])
        own = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs_dir)
        own.log_episodes([{"id": "child-own", "traces": []}])
        own.finish()
        out.put(("ok", run.dropped_records, str(own.journal_path)))
    except BaseException as exc:
        out.put(("error", repr(exc), ""))


def test_a_fork_mid_run_neither_raises_nor_touches_the_parents_journal(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    lp = shared_platform
    episodes = workloads.gsm8k(40)
    ctx = multiprocessing.get_context("fork")
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(episodes[:20])
        queue = ctx.Queue()
        with pytest.warns(DeprecationWarning) if sys.version_info >= (3, 12) else _nothing():
            child = ctx.Process(target=_child, args=(run, str(tmp_path / "child-runs"), queue))
            child.start()
        status, dropped, own_path = queue.get(timeout=60)
        child.join(60)
        run.log_episodes(episodes[20:])
        run.finish(timeout=60)
    assert status == "ok", dropped
    assert dropped == 0  # the child's record to the parent's run: in the run (forkchild)
    assert child.exitcode == 0
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == {e["id"] for e in episodes} | {"from-child"}
    assert max(stored.values()) == 1
    assert [r["id"] for r in rh.journal_records(Path(own_path), EntryKind.EPISODE)] == ["child-own"]
    assert run.dropped_records == 0 and lp.run(run.id)["status"] == "COMPLETED"


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_two_processes_attaching_to_one_run_id_land_the_union_once(
    make_local_platform: Any, tmp_path: Path
) -> None:
    lp: LocalPlatform = make_local_platform(train_teams=["team-a"])
    created = httpx.post(
        f"{lp.url}/api/v1/rft/external-runs",
        json={"base_model": "m", "max_steps": 100, "environments": [], "team_id": "team-a"},
        headers={"Authorization": f"Bearer {rt.KEY}"},
        timeout=10,
    )
    run_id = created.json()["run"]["id"]
    env = rh.isolated_env(tmp_path / "home", {"PRIME_TRACES_URL": lp.url})
    children = [
        procs.start(
            [
                sys.executable,
                str(rh.HERE / "rel_attacher.py"),
                str(tmp_path / "runs"),
                lp.url,
                run_id,
                tag,
                str(parity),
                "25",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for tag, parity in (("a", 0), ("b", 1))
    ]
    outs = [p.communicate(timeout=180) for p in children]
    for proc, (out, err) in zip(children, outs, strict=True):
        assert proc.returncode == 0 and "finished" in out, err[-2000:]
        assert "Traceback" not in err, err[-2000:]
    stored = rh.platform_episode_ids(lp.data_dir, run_id)
    expected = {f"{t}-{i}" for t in "ab" for i in range(25)}
    assert set(stored) == expected and max(stored.values()) == 1
    assert set(rh.platform_metric_steps(lp.data_dir, run_id)) == set(range(50))


def test_a_process_attaching_to_a_run_this_host_created_never_closes_it(
    make_local_platform: Any, tmp_path: Path
) -> None:
    """The run's creator is its primary; a process of the same host that
    attaches to it by id afterwards, with no launcher rank, is not a second
    one: its ``finish()`` ships its records and leaves the run open while
    the creator still logs, and the creator's close comes after every
    record of both."""
    lp: LocalPlatform = make_local_platform(train_teams=["team-a"])
    runs = tmp_path / "runs"
    with rt.sdk_env(lp.url, tmp_path / "home"):
        creator = pr.init(
            kind="train",
            model="m",
            team_id="team-a",
            api_key=rt.KEY,
            base_url=lp.url,
            runs_dir=runs,
        )
        env = rh.isolated_env(tmp_path / "worker", {"PRIME_TRACES_URL": lp.url})
        args = [str(runs), lp.url, creator.id, "w", "1", "10"]
        worker = procs.start(
            [sys.executable, str(rh.HERE / "rel_attacher.py"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        out, err = worker.communicate(timeout=180)
        assert worker.returncode == 0 and "finished" in out, err[-2000:]
        assert lp.run(creator.id)["status"] == "RUNNING", "closed by a process attached to it"
        for i in range(10):
            creator.log_episodes([{"id": f"c-{i}", "traces": [], "run": {"work": {"step": 2 * i}}}])
            creator.log_metrics({"loss": 1.0 / (i + 1)}, step=2 * i)
        creator.finish(timeout=120)
    assert lp.run(creator.id)["status"] == "COMPLETED"
    stored = rh.platform_episode_ids(lp.data_dir, creator.id)
    assert set(stored) == {f"{t}-{i}" for t in "cw" for i in range(10)}
    assert max(stored.values()) == 1
    assert set(rh.platform_metric_steps(lp.data_dir, creator.id)) == set(range(20))
