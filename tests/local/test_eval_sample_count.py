"""An evaluation's sample count is kept with its rows, not counted over them:
a push (and a read of the evaluation) costs the same however many samples
the evaluation already holds, and a data folder from before the count was
kept gets it, counted once, when the platform opens it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from local_helpers import Api

from primeruns.local.storage import SCHEMA

_SAMPLE = {"sample_id": "s", "reward": 1.0, "task": "gsm8k"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    platform = Api(tmp_path / "data")
    yield platform
    platform.db.close()


def _evaluation(api: Api) -> str:
    created = api.post("/api/v1/evaluations/", json={"name": "e", "run_id": "r"})
    assert created.status_code == 201
    eval_id: str = created.json()["evaluation_id"]
    return eval_id


def _push(api: Api, eval_id: str, samples: list[dict[str, object]]) -> int:
    pushed = api.post(f"/api/v1/evaluations/{eval_id}/samples", json={"samples": samples})
    assert pushed.status_code == 200, pushed.text
    total: int = pushed.json()["total"]
    return total


def _sqlite_steps(api: Api, call: Callable[[], object]) -> int:
    """SQLite virtual machine steps the platform's connection takes for ``call``."""
    db = api.db
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    db.read_sync(lambda conn: conn.set_progress_handler(count, 1))
    try:
        call()
    finally:
        db.read_sync(lambda conn: conn.set_progress_handler(None, 1))
    return steps


def test_a_push_costs_the_same_however_many_samples_the_evaluation_holds(
    api: Api,
) -> None:
    eval_id = _evaluation(api)
    assert _push(api, eval_id, [_SAMPLE]) == 1
    small = _sqlite_steps(api, lambda: _push(api, eval_id, [_SAMPLE]))
    assert _push(api, eval_id, [_SAMPLE] * 3000) == 3002
    large = _sqlite_steps(api, lambda: _push(api, eval_id, [_SAMPLE]))
    assert large == small
    read = _sqlite_steps(api, lambda: api.get(f"/api/v1/evaluations/{eval_id}"))
    assert read < 1000  # a count over 3,003 rows takes at least a step each


def test_every_answer_gives_the_count_the_pushes_made(api: Api) -> None:
    first, second = _evaluation(api), _evaluation(api)
    assert _push(api, first, [_SAMPLE] * 3) == 3
    assert _push(api, second, [_SAMPLE]) == 1
    assert _push(api, first, [_SAMPLE] * 2) == 5
    refused = api.post(f"/api/v1/evaluations/{first}/samples", json={"samples": [1]})
    assert refused.status_code == 422  # nothing stored, nothing counted
    assert api.get(f"/api/v1/evaluations/{first}").json()["total_samples"] == 5
    page = api.get(f"/api/v1/evaluations/{first}/samples", params={"limit": 2}).json()
    assert (page["total"], page["hasMore"]) == (5, True)
    listed = api.get("/api/v1/evaluations/").json()["evaluations"]
    assert {e["id"]: e["total_samples"] for e in listed} == {first: 5, second: 1}
    closed = api.put(f"/api/v1/evaluations/{second}", json={"status": "FAILED"})
    assert closed.json()["total_samples"] == 1


def _schema_before_the_count() -> str:
    kept = [line for line in SCHEMA.splitlines() if "sample_count" not in line]
    old = "\n".join(kept).replace("finalized_at REAL,\n", "finalized_at REAL\n")
    assert "sample_count" not in old
    return old


def test_a_data_folder_from_before_the_count_is_counted_when_opened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    conn = sqlite3.connect(data / "platform.sqlite3")
    conn.executescript(_schema_before_the_count())
    for eval_id, rows in (("eval_a", 3), ("eval_b", 0)):
        conn.execute(
            "INSERT INTO evaluations (id, name, status, request, created_at, updated_at)"
            " VALUES (?, ?, 'RUNNING', '{\"run_id\": \"r\"}', 0, 0)",
            (eval_id, eval_id),
        )
        conn.executemany(
            "INSERT INTO eval_samples (eval_id, sample_id, body) VALUES (?, 's', '{}')",
            [(eval_id,)] * rows,
        )
    conn.commit()
    conn.close()
    (data / "platform.sqlite3").chmod(0o600)

    api = Api(data)
    assert api.get("/api/v1/evaluations/eval_a").json()["total_samples"] == 3
    assert api.get("/api/v1/evaluations/eval_b").json()["total_samples"] == 0
    assert _push(api, "eval_a", [_SAMPLE]) == 4
    api.db.close()
    # Opened again: counted once, not again (the pushed row is in the count).
    again = Api(data)
    assert again.get("/api/v1/evaluations/eval_a").json()["total_samples"] == 4
    again.db.close()


def test_rows_a_platform_from_before_the_count_pushes_are_counted(tmp_path: Path) -> None:
    """A platform of a version from before the count, serving a data folder
    this one opened (a user gone back a version, or two versions sharing one
    folder), inserts rows and never touches the column: they are counted."""
    data = tmp_path / "data"
    api = Api(data)
    eval_id = _evaluation(api)
    assert _push(api, eval_id, [_SAMPLE] * 2) == 2
    api.db.close()
    older = sqlite3.connect(data / "platform.sqlite3")
    with older:  # that version's push: the rows, in one transaction
        older.executemany(
            "INSERT INTO eval_samples (eval_id, sample_id, body) VALUES (?, 's', '{}')",
            [(eval_id,)] * 3,
        )
    older.close()

    again = Api(data)
    assert again.get(f"/api/v1/evaluations/{eval_id}").json()["total_samples"] == 5
    assert _push(again, eval_id, [_SAMPLE]) == 6
    again.db.close()


def test_a_push_into_an_evaluation_that_is_not_there_stores_nothing(api: Api) -> None:
    refused = api.post("/api/v1/evaluations/nope/samples", json={"samples": [_SAMPLE]})
    assert refused.status_code == 404
    rows = api.db.read_sync(lambda conn: conn.execute("SELECT count(*) FROM eval_samples"))
    assert rows.fetchone()[0] == 0
