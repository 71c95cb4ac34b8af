"""The dashboard's :class:`~.views.Source` over the local platform's SQLite database.

Reads what the API stored, as it stored it: evaluations and their v0 sample
rows, training runs with their metric rows and confirmed Parquet objects, and
runs seen only through Prime Traces uploads. Counts are grouped queries so the
runs list costs a handful of statements, not a few per run.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson

from ..inspect import run_list, run_report
from ..objects import object_path
from ..parquet_bounds import read_rows
from ..storage import Database
from ..traces_extract import as_list, as_object
from ..typed_fields import STR, shown
from . import stored_rows
from .metric_rows import MetricRows
from .rows import sample_row
from .views import (
    MAX_FACTS,
    MissingExtra,
    RunDetail,
    RunRow,
    SampleRow,
    StepTable,
    compact,
    config_text,
)

#: A count per run id.
Counts = dict[str, int]


def _json(text: str | None) -> dict[str, Any]:
    try:
        return as_object(json.loads(text or "{}"))
    except (ValueError, RecursionError):  # a body nested past what json reads is none
        return {}


def _appended(
    conn: sqlite3.Connection, run_id: str, held: tuple[Any, ...], known: tuple[Any, ...]
) -> bool:
    """Whether the run's metric rows changed from ``held`` to ``known`` (each
    their count, latest arrival and last ``row``) by rows appended alone:
    as many more, each after the last held, and none held since sent again
    (a repeated step replaces its row's body and arrival in place)."""
    count, at, last = held
    if last is None or at is None or known[0] <= count:
        return False
    appended, replaced = conn.execute(
        "SELECT count(*) FILTER (WHERE row > ?),"
        " count(*) FILTER (WHERE row <= ? AND received_at > ?)"
        " FROM train_metrics WHERE run_id = ?",
        (last, last, at, run_id),
    ).fetchone()
    return bool(appended == known[0] - count and not replaced)


def _metric_body(text: str | None) -> dict[str, Any]:
    """A training metric row's body as :func:`_json` reads it, parsed by
    orjson: a fifth of the time, and the compare page reads ten runs'
    hundreds of thousands of rows. orjson refuses what ``json`` takes
    (NaN and Infinity, a number past the floats, a lone surrogate, nesting
    past 1,024 levels): those bodies are read by :func:`_json`. It also
    reads an integer past 64 bits as a float, which for a value charts the
    same (the chart takes it as a float) but would drop a ``step`` (kept
    only as an integer): a body whose step came back a float is read again
    by :func:`_json`. Not used for samples and requests, which are shown
    as stored (an id past 64 bits stays exact)."""
    try:
        body = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return _json(text)
    if type(body) is not dict:
        return {}
    if type(body.get("step")) is float:
        return _json(text)
    return body


#: The SDK's own key in an evaluation's metadata (its client token, see
#: ``ship/lifecycle.py``): bookkeeping, not the user's config.
SDK_METADATA_KEY = "prime_runs"


def _user_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's metadata as the config the user gave: the SDK's key left out."""
    return {k: v for k, v in metadata.items() if k != SDK_METADATA_KEY}


#: Sample rows the source keeps for the analysis pages, across evaluations.
FACTS_HELD = 2 * MAX_FACTS
#: What the training runs' charted rows kept between pages may cost (the one in
#: use is always kept), as the offline dashboard's indexes.
CHARTED_BYTES = 32 << 20
#: The fields of a sample's body its row reads (``rows.sample_row``), each
#: where it sits in the body and its JSON path (the episode's last error:
#: the last item of ``errors``, as a one-item list).
_FACT_FIELDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("sample_id",), "$.sample_id"),
    (("reward",), "$.reward"),
    (("task", "id"), "$.task.id"),
    (("task", "name"), "$.task.name"),
    (("example_id",), "$.example_id"),
    (("error",), "$.error"),
    (("token_usage", "prompt_tokens"), "$.token_usage.prompt_tokens"),
    (("token_usage", "cached_input_tokens"), "$.token_usage.cached_input_tokens"),
    (("token_usage", "completion_tokens"), "$.token_usage.completion_tokens"),
    (("info", "native_wrapper", "num_input_tokens"), "$.info.native_wrapper.num_input_tokens"),
    (("info", "native_wrapper", "num_output_tokens"), "$.info.native_wrapper.num_output_tokens"),
    (("info", "native_wrapper", "errors"), "$.info.native_wrapper.errors[#-1]"),
)
#: Each field and its JSON type, picked out of the body by SQLite.
_FACT_COLUMNS = ", ".join(
    f"json_extract(body, '{path}') AS f{i}, json_type(body, '{path}') AS t{i}"
    for i, (_, path) in enumerate(_FACT_FIELDS)
)


def _decoded(value: Any, kind: str) -> Any:
    """A field as JSON has it: SQLite gives objects and arrays as text, true as 1."""
    if kind in ("object", "array"):
        return _json_value(value)
    if kind in ("true", "false"):
        return kind == "true"
    return value


def _fact(index: int, r: sqlite3.Row) -> SampleRow:
    """A sample's row from the fields SQLite picked out of its body: the body
    rebuilt from them alone, read by ``sample_row`` as a whole body would be."""
    body: dict[str, Any] = {}
    for i, (keys, path) in enumerate(_FACT_FIELDS):
        kind = r[f"t{i}"]
        if kind is None:  # not in the body
            continue
        value = _decoded(r[f"f{i}"], kind)
        *parents, last = keys
        into = body
        for key in parents:
            into = into.setdefault(key, {})
        into[last] = [value] if path.endswith("[#-1]") else value
    return sample_row(index, body)


#: Bodies parsed at a time for the rows stored before ``eval_sample_rows``.
_PICK_BATCH = 500


def _picked(conn: sqlite3.Connection, wanted: list[tuple[int, int]]) -> dict[int, SampleRow]:
    """The row (numbered as asked) of each (index, body row), picked out of the body by SQLite."""
    found: dict[int, SampleRow] = {}
    for start in range(0, len(wanted), _PICK_BATCH):
        index_of = dict((row, index) for index, row in wanted[start : start + _PICK_BATCH])
        marks = ", ".join("?" * len(index_of))
        for r in conn.execute(
            f"SELECT row, {_FACT_COLUMNS} FROM eval_samples WHERE row IN ({marks})",
            list(index_of),
        ):
            found[r["row"]] = compact(_fact(index_of[r["row"]], r))
    return found


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _labels(values: Any) -> tuple[str, ...]:
    return tuple(v for v in as_list(values) if isinstance(v, str) and v)


def _environments(request: dict[str, Any], env_names: dict[str, str]) -> tuple[str, ...]:
    """The environments a run's request names ({id} each), by their hub name where known."""
    ids = [as_object(e).get("id") for e in as_list(request.get("environments"))]
    return tuple(env_names.get(i, i) for i in ids if isinstance(i, str) and i)


def _stored_row(
    r: sqlite3.Row, kind: str, model_key: str, env_names: dict[str, str], **counts: Counts
) -> RunRow:
    """A registered run (an evaluation or a training run) with its counts by name."""
    request = _json(r["request"])
    return RunRow(
        id=r["id"],
        kind=kind,
        name=r["name"],
        # Text only: the page sorts the models it lists, and an earlier
        # version stored a list or a number as it came (a 500 for the page).
        model=shown(request.get(model_key), STR),
        status=r["status"],
        error=r["error_message"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        counts={name: per_run.get(r["id"], 0) for name, per_run in counts.items()},
        environments=_environments(request, env_names),
        tags=_labels(request.get("tags")),
    )


class PlatformSource:
    """Reads ``db`` (the running platform's one connection) and its object files."""

    def __init__(self, db: Database, objects_dir: Path) -> None:
        self._db = db
        self._objects_dir = objects_dir
        # Per evaluation: the last stored row read, and each sample's row so far.
        self._facts: OrderedDict[str, tuple[int, list[SampleRow]]] = OrderedDict()
        self._facts_lock = threading.Lock()  # pages are read in worker threads
        # Per training run: its metric rows' count and latest arrival, and its charted rows.
        self._charted_rows: OrderedDict[str, tuple[tuple[Any, ...], MetricRows]] = OrderedDict()
        self._charted_lock = threading.Lock()

    def runs(self) -> list[RunRow]:
        return self._db.read_sync(self._runs)

    def _runs(self, conn: sqlite3.Connection, only: str | None = None) -> list[RunRow]:
        """Every run (or the run ``only``: a live page asks for one every few seconds)."""
        args: tuple[str, ...] = () if only is None else (only,)

        def per_run(table: str, column: str, what: str = "count(*)", where: str = "1") -> Counts:
            one = "" if only is None else f" AND {column} = ?"
            sql = f"SELECT {column}, {what} FROM {table} WHERE {where}{one} GROUP BY {column}"
            return {r[0]: int(r[1]) for r in conn.execute(sql, args) if r[0] is not None}

        one = "" if only is None else " WHERE id = ?"
        evaluations = conn.execute(f"SELECT * FROM evaluations{one}", args).fetchall()
        # Each evaluation counts its samples as they are stored (storage's
        # trigger): counting them here read every sample's index entry, on
        # every load and poll of the runs list.
        samples = {r["id"]: int(r["sample_count"]) for r in evaluations}
        episodes = per_run("episodes", "run_id")
        objects = per_run("objects", "run_id", where="confirmed_at IS NOT NULL")
        env_names = {r[0]: r[1] for r in conn.execute("SELECT id, name FROM environments")}
        rows = [
            _stored_row(r, "eval", "model_name", env_names, samples=samples, episodes=episodes)
            for r in evaluations
        ]
        trains = conn.execute(f"SELECT * FROM train_runs{one}", args).fetchall()
        # Each run counts its steps as they are stored (storage's trigger), as
        # an evaluation its samples.
        steps = {r["id"]: int(r["step_count"]) for r in trains}
        rows += [
            _stored_row(
                r,
                "train",
                "base_model",
                env_names,
                **{"metric steps": steps, "sample tables": objects, "episodes": episodes},
            )
            for r in trains
        ]
        if only is not None and rows:
            return rows
        known = {row.id for row in rows}
        for seen in run_list(conn):
            if seen["id"] not in known and only in (None, seen["id"]):
                rows.append(
                    RunRow(
                        id=seen["id"],
                        kind=seen["kind"],
                        name=seen["name"],
                        model=None,
                        status=seen["status"],
                        error=None,
                        created_at=None,
                        updated_at=None,
                        counts={"episodes": episodes.get(seen["id"], 0)},
                    )
                )
        return rows

    def run(self, run_id: str) -> RunDetail | None:
        return self._db.read_sync(lambda conn: self._run(conn, run_id))

    def _run(self, conn: sqlite3.Connection, run_id: str) -> RunDetail | None:
        row = next(iter(self._runs(conn, run_id)), None)
        if row is None:
            return None
        ev = conn.execute("SELECT * FROM evaluations WHERE id = ?", (run_id,)).fetchone()
        if ev is not None:
            config = _user_config(_json(ev["metadata"]))
            return RunDetail(row, _json(ev["metrics"]), config_text(config), config)
        tr = conn.execute("SELECT * FROM train_runs WHERE id = ?", (run_id,)).fetchone()
        if tr is None:
            report = run_report(conn, run_id) or {}
            return RunDetail(row, report.get("summary") or {}, None, report.get("config") or {})
        request = _json(tr["request"])
        config = as_object(request.get("run_config"))
        charted = self._charted(conn, run_id)
        tables = [
            StepTable(step=r["step"], rows=r["rows"] or 0, key=r["key"])
            for r in conn.execute(
                "SELECT step, key, rows FROM objects WHERE run_id = ? AND confirmed_at IS NOT NULL"
                " ORDER BY step, confirmed_at",
                (run_id,),
            )
        ]
        max_steps = request.get("max_steps")
        return RunDetail(
            row,
            {},
            config_text(config),
            config,
            max_steps=max_steps if isinstance(max_steps, int) else None,
            # A copy: the rows kept go on growing (a live run's new steps).
            metrics=list(charted.rows),
            thinned=charted.cut,
            step_tables=tables,
        )

    def _charted(self, conn: sqlite3.Connection, run_id: str) -> MetricRows:
        """The run's metric rows as the charts read them: kept between pages
        while the run's rows stay as they were; rows appended since (a new
        step) are read alone and added; else (a step sent again with other
        values) all are read again, row by row, each reduced as it is read,
        and thinned within the bound. A live page polls every 2 s: a
        100,000-step run's rows read each time took 1.8 s a poll, with the
        database held from the API's writes (and, once a long run was
        thinned rather than cut, 5 s)."""
        known = tuple(
            conn.execute(
                "SELECT count(*), max(received_at), max(row) FROM train_metrics WHERE run_id = ?",
                (run_id,),
            ).fetchone()
        )
        with self._charted_lock:
            held = self._charted_rows.pop(run_id, None)
        if held is not None and held[0] == known:
            charted = held[1]
        else:
            since = (
                held[0] if held is not None and _appended(conn, run_id, held[0], known) else None
            )
            # Added to a copy: a page being drawn from the rows held keeps them.
            charted = held[1].copy() if since is not None and held is not None else MetricRows()
            # The run's rows counted: a long run is thinned at the width it
            # needs whole from its first thinning (``MetricRows.expected_rows``).
            charted.expected_rows = known[0]
            # Plain tuples, not the connection's named rows: one column, and
            # hundreds of thousands of rows on the compare page.
            cursor = conn.cursor()
            cursor.row_factory = None
            if since is None:
                query = "SELECT body FROM train_metrics WHERE run_id = ? ORDER BY step, row"
                bodies = cursor.execute(query, (run_id,))
            else:
                query = "SELECT body FROM train_metrics WHERE run_id = ? AND row > ? ORDER BY row"
                bodies = cursor.execute(query, (run_id, since[2]))
            charted.extend(_metric_body(body) for (body,) in bodies)
            cursor.close()
        with self._charted_lock:
            self._charted_rows[run_id] = (known, charted)
            total = sum(c.cost for _, c in self._charted_rows.values())
            while total > CHARTED_BYTES and len(self._charted_rows) > 1:
                _, (_, dropped) = self._charted_rows.popitem(last=False)
                total -= dropped.cost
        return charted

    def samples(self, run_id: str, offset: int, limit: int) -> tuple[list[SampleRow], int]:
        def read(conn: sqlite3.Connection) -> tuple[list[SampleRow], int]:
            total = conn.execute(
                "SELECT count(*) FROM eval_samples WHERE eval_id = ?", (run_id,)
            ).fetchone()[0]
            bodies = conn.execute(
                "SELECT body FROM eval_samples WHERE eval_id = ? ORDER BY row LIMIT ? OFFSET ?",
                (run_id, limit, offset),
            ).fetchall()
            rows = [sample_row(offset + i, _json(b["body"])) for i, b in enumerate(bodies)]
            return rows, int(total)

        return self._db.read_sync(read)

    def sample_facts(self, run_id: str, limit: int) -> tuple[list[SampleRow], int]:
        with self._facts_lock:
            last_row, held = self._facts.pop(run_id, (-1, []))
        wanted = max(0, limit - len(held))

        def read(conn: sqlite3.Connection) -> tuple[int, int, list[SampleRow]]:
            total = conn.execute(
                "SELECT count(*) FROM eval_samples WHERE eval_id = ?", (run_id,)
            ).fetchone()[0]
            # Only rows stored since the last read, each as stored with its
            # body (stored_rows); a body stored before that table is parsed.
            new = stored_rows.read(conn, run_id, last_row, wanted, len(held))
            picked = _picked(
                conn, [(i, row) for i, (row, fact) in enumerate(new, len(held)) if fact is None]
            )
            got = [fact if fact is not None else picked[row] for row, fact in new]
            return int(total), new[-1][0] if new else last_row, got

        total, last_row, new = self._db.read_sync(read)
        rows = held + new
        with self._facts_lock:
            self._facts[run_id] = (last_row, rows)
            kept = sum(len(facts) for _, facts in self._facts.values())
            while kept > FACTS_HELD and len(self._facts) > 1:
                _, (_, dropped) = self._facts.popitem(last=False)
                kept -= len(dropped)
        return rows[:limit], total

    def sample(self, run_id: str, index: int) -> dict[str, Any] | None:
        if index < 0:
            return None
        found = self._db.read_sync(
            lambda conn: conn.execute(
                "SELECT body FROM eval_samples WHERE eval_id = ? ORDER BY row LIMIT 1 OFFSET ?",
                (run_id, index),
            ).fetchone()
        )
        return None if found is None else _json(found["body"])

    def step_rows(
        self, run_id: str, step: int, offset: int = 0, limit: int | None = None
    ) -> tuple[list[dict[str, Any]], int] | None:
        objects = self._db.read_sync(
            lambda conn: [
                (r["key"], r["rows"])
                for r in conn.execute(
                    "SELECT key, rows FROM objects WHERE run_id = ? AND step = ?"
                    " AND confirmed_at IS NOT NULL ORDER BY confirmed_at",
                    (run_id, step),
                )
            ]
        )
        if not objects:
            return None
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise MissingExtra(
                "reading a step's Parquet table needs pyarrow: pip install 'prime-runs[train]'"
            ) from None
        # Only the page's rows are decoded, not the step's (parquet_bounds).
        paths = [(object_path(self._objects_dir, key), rows) for key, rows in objects]
        return read_rows(paths, offset, limit)
