"""Several processes push to one evaluation's sample table, and answers get
lost (issue #29): every row lands exactly once.

A run's forked children, pool workers and ranks each ship a journal of their
own to the same evaluation. The table appends and never deduplicates, so a
batch whose answer was lost is looked for before it is sent again; with
several writers it need not be at the table's tail (others appended after
it). The writers here are sinks in this process, one per "process", each with
its own client, pushing to ``primeruns serve`` over loopback while it drops
connections after committing (ambiguous), refuses requests (retryable) and
answers 200 with nothing (a gateway's page, for a request forwarded or not):

- *interleaved*: one thread drives the writers in a seeded order, one attempt
  at a time, so the server sees a reproducible interleaving (the fault draws
  follow the requests' order);
- *threads*: each writer in its own thread, the requests racing on the server.

And the same with processes: a pool of workers forked from an evaluation,
each logging into the run (a journal and an uplink of its own), the parent
too, while the samples route drops answers after the commit.

Now and then a writer "restarts" after a failure: a new sink that has only
what the journal recorded (the batch's body and state), as a process
replaying a crashed one's journal does. The oracle reads the platform's
SQLite file: each row once, none missing. Before the look read past the
length recorded at the first send, it read the table's tail, so a batch
stored behind another writer's rows was pushed again.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fork_oracle as fo
import pytest
import rel_torture as rt
import workloads
from scripted_platform import Batch, entries_of

import primeruns as pr
from primeruns.exceptions import RetryableAPIError, TransportError, UnprovenAnswerError
from primeruns.journal import EntryKind
from primeruns.local import LocalPlatform
from primeruns.platform import PlatformClient
from primeruns.settings import resolve_settings
from primeruns.sinks.base import Binding
from primeruns.sinks.eval_samples import EvalSamplesSink

_KEY = "writers-key-0123456789"
_WRITERS = 4
_BATCHES = 5  # per writer
_TRANSIENT = (TransportError, RetryableAPIError, UnprovenAnswerError)


def _client(lp: LocalPlatform) -> PlatformClient:
    return PlatformClient(resolve_settings(api_key=_KEY, base_url=lp.url, environ={}, config={}))


@dataclass
class Writer:
    """One process's sink and the batches its journal holds, in order."""

    lp: LocalPlatform
    binding: Binding
    episodes: list[list[dict[str, Any]]]
    rng: random.Random
    client: PlatformClient = field(init=False)
    sink: EvalSamplesSink = field(init=False)
    batch: Batch | None = None
    seq: int = 1
    restarts: int = 0

    def __post_init__(self) -> None:
        self.client = _client(self.lp)
        self.sink = EvalSamplesSink(self.client)

    @property
    def done(self) -> bool:
        return self.batch is None and not self.episodes

    def attempt(self) -> None:
        """One send of the current batch (prepared and recorded first)."""
        if self.batch is None:
            records = self.episodes.pop(0)
            entries = entries_of(EntryKind.EPISODE, records, first_seq=self.seq)
            self.seq += len(records)
            self.batch = Batch.prepare(self.sink, entries, self.binding)
            assert self.batch.records == len(records)
        try:
            self.batch.send(self.sink)
        except _TRANSIENT:
            if self.rng.random() < 0.25:
                self._restart()
            return
        self.batch = None

    def _restart(self) -> None:
        """A new process replays the journal: the batch as recorded, a new sink."""
        assert self.batch is not None
        self.restarts += 1
        state = json.loads(json.dumps(self.batch.state))
        self.client.close()
        self.client = _client(self.lp)
        self.sink = EvalSamplesSink(self.client)
        self.sink.restore(state["carry"])
        self.batch = Batch(
            self.batch.body, state, self.batch.records, self.binding, self.sink.progress_type
        )


@pytest.fixture
def lp(shared_platform: LocalPlatform) -> Iterator[LocalPlatform]:
    try:
        yield shared_platform
    finally:
        shared_platform.set_faults(
            ambiguous_rate=0.0, retryable_rate=0.0, bogus_rate=0.0, routes=[]
        )


def _stored(lp: LocalPlatform, eval_id: str) -> Counter[str]:
    conn = sqlite3.connect(f"file:{lp.data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        query = "SELECT sample_id FROM eval_samples WHERE eval_id = ?"
        return Counter(row[0] for row in conn.execute(query, (eval_id,)))
    finally:
        conn.close()


def _writers(lp: LocalPlatform, eval_id: str, seed: int) -> list[Writer]:
    """Batches of 10 to 150 episodes (a look-back page is 100 rows)."""
    rng = random.Random(seed)
    sizes = [[rng.randint(10, 150) for _ in range(_BATCHES)] for _ in range(_WRITERS)]
    episodes = iter(workloads.gsm8k(sum(map(sum, sizes))))  # ids unique past the bundle
    binding = Binding(run_id=eval_id, kind="eval")
    return [
        Writer(
            lp,
            binding,
            [[next(episodes) for _ in range(size)] for size in mine],
            random.Random(seed * 100 + w),
        )
        for w, mine in enumerate(sizes)
    ]


def _drive_interleaved(writers: list[Writer], seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(20_000):
        active = [w for w in writers if not w.done]
        if not active:
            return
        rng.choice(active).attempt()
    raise AssertionError("the writers never finished their batches")


def _drive_threads(writers: list[Writer]) -> None:
    errors: list[BaseException] = []

    def run(writer: Writer) -> None:
        try:
            for _ in range(5_000):
                if writer.done:
                    return
                writer.attempt()
            raise AssertionError("a writer never finished its batches")
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    assert not errors, errors


@pytest.mark.parametrize(("mode", "seed"), [("interleaved", 1), ("interleaved", 2), ("threads", 3)])
def test_several_writers_with_lost_answers_store_every_row_exactly_once(
    lp: LocalPlatform, mode: str, seed: int
) -> None:
    client = _client(lp)
    created = client.api(
        "POST", "/evaluations/", {"name": f"writers-{mode}-{seed}", "environments": [{"id": "e"}]}
    )
    client.close()
    eval_id = str(created["evaluation_id"])
    writers = _writers(lp, eval_id, seed)
    logged = [str(e["id"]) for w in writers for batch in w.episodes for e in batch]
    # Every sample request, its reads too: a third dropped after the commit,
    # a tenth refused before it, a tenth answered 200 with nothing (forwarded
    # or not).
    lp.set_faults(
        ambiguous_rate=0.3,
        retryable_rate=0.1,
        bogus_rate=0.1,
        statuses=[429, 503, 502],
        seed=seed,
        routes=[f"/api/v1/evaluations/{eval_id}/samples"],
    )
    try:
        if mode == "threads":
            _drive_threads(writers)
        else:
            _drive_interleaved(writers, seed)
    finally:
        for writer in writers:
            writer.client.close()
    lp.set_faults(ambiguous_rate=0.0, retryable_rate=0.0, bogus_rate=0.0, routes=[])
    stored = _stored(lp, eval_id)
    twice = sorted(i for i, count in stored.items() if count > 1)
    assert not twice, f"{len(twice)} rows stored twice"
    assert sorted(stored) == sorted(logged), "rows missing or unknown"
    assert sum(w.restarts for w in writers) > 0  # the journal's record was resumed from


# The run the pool's workers log into: set in the parent before the pool
# forks, inherited by every worker.
_RUN: pr.Run | None = None


def _log_in_worker(part: list[dict[str, Any]]) -> int:
    assert _RUN is not None
    for i in range(0, len(part), 40):  # batches that span look-back pages
        _RUN.log_episodes(part[i : i + 40])
    return _RUN.dropped_records


def test_pool_workers_and_their_parent_with_lost_answers_store_every_row_exactly_once(
    lp: LocalPlatform, tmp_path: Any
) -> None:
    global _RUN
    episodes = workloads.gsm8k(560)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = _RUN = rt.eval_run(lp.url, tmp_path / "runs")
        assert run.id is not None
        lp.set_faults(ambiguous_rate=0.3, seed=4, routes=[f"/api/v1/evaluations/{run.id}/samples"])
        try:
            with fo.fork_pool(4) as pool:
                parts = [episodes[k * 120 : (k + 1) * 120] for k in range(4)]
                result = pool.map_async(_log_in_worker, parts)
                for i in range(480, 560, 40):
                    run.log_episodes(episodes[i : i + 40])
                dropped = result.get(timeout=120)
                pool.close()
                pool.join()
            run.finish(timeout=180)
        finally:
            _RUN = None
            lp.set_faults(ambiguous_rate=0.0, routes=[])
    assert dropped == [0, 0, 0, 0]
    fo.assert_exactly_once(lp, run, episodes)
