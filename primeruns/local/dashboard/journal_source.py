"""The dashboard's :class:`~.views.Source` over a directory of run journals.

For offline runs (and any run before ``primeruns sync``): the pages read the
journals the producers wrote, with no platform. Journals are opened
read-only, never as owner, so a live run goes on undisturbed. A run's status
is its finish record's (running while its owner lives without one, crashed
after), beside the shipping state ``primeruns ls`` shows. A journal that cannot be read is shown
as damaged, and a damaged entry is skipped: one bad run or record never takes
the pages down. The episodes of a run are projected by the SDK's own code
into the rows the platform would have stored (v0 samples, the training
step's table), so a synced run looks the same on the platform's pages.

Memory is bounded whatever a journal holds or declares: a page reads its own
records only, through a per-journal index (``journal_index``), each decoded
within bounds and clipped (``jsonbound``) with a visible marker; meta values
and finish records are read within bounds too. The indexes are cached up to
:data:`CACHE_BYTES` in all, never the records.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from primeruns.logs import get_logger

from ... import jsonbound
from ...exceptions import JournalError
from ...journal import EntryKind, Journal, JournalInfo, journal_info, list_journals
from ...journal.memo import Memo
from ...journal.meta import K_OVERSIZED
from ...journal.store import DATA_NAME
from ...journal.trust import check_dir
from ...projection import MAX_SAMPLES_PAYLOAD_BYTES, episodes_to_parquet_rows, record_to_samples
from ...reports import CRASH_ERROR, NOT_OPENED, RunStatus, describe
from ...ship.copies import sync_names, sync_root
from ...sinks.train_samples import DEFAULT_INTERVAL as TABLE_INTERVAL
from ..traces_extract import as_object
from .journal_index import (
    MAX_ENTRY_BYTES,
    JournalIndex,
    decoded,
    payloads_in_order,
    read_records,
)
from .narrow_rows import narrow_row
from .rows import record_row, sample_row
from .run_rows import RowCache
from .views import RunDetail, RunRow, SampleRow, StepTable, compact, config_text

log = get_logger("primeruns.local.dashboard")

#: What the cached indexes may hold in all (the one in use is always kept).
CACHE_BYTES = 32 << 20
#: The largest meta value decoded (a spec with its config is a few KB).
MAX_META_BYTES = 1 << 20
#: How much of a meta value and of a shown sample is kept.
META_BOUNDS = jsonbound.Bounds(chars=256 << 10)
SAMPLE_BOUNDS = jsonbound.Bounds(chars=1 << 20, total=4 << 20)
#: The largest episode whose table row is read off the record, unprojected: its
#: v0 row (the record, its last branch and every branch) is surely one row.
DIRECT_ROW_BYTES = MAX_SAMPLES_PAYLOAD_BYTES // 4


def _ending(status: RunStatus) -> tuple[str, str | None]:
    """The run's status and error, as ``primeruns ls`` derives them: its finish
    record's, running while its owner lives, else crashed; damaged when the
    journal cannot be read."""
    outcome = status.outcome
    if outcome in ("damaged", NOT_OPENED):  # (not opened: a link, another user's; says why)
        return "DAMAGED", "; ".join(d.what for d in status.info.damage)
    if outcome == "crashed":
        return "CRASHED", CRASH_ERROR
    error = (status.finish or {}).get("error")
    return outcome.upper(), str(error)[:10_000] if error else None


def _row(status: RunStatus) -> RunRow:
    info = status.info
    spec = status.spec
    state, error = _ending(status)
    created = info.meta.get("journal.created_at")
    oversized = info.meta.get(K_OVERSIZED)
    left_out = [
        f"meta value {k!r} declares {v} bytes: not read"
        for k, v in (oversized.items() if isinstance(oversized, dict) else ())
    ]
    return RunRow(
        id=info.local_id,
        kind=spec.kind if spec is not None else None,
        name=spec.name if spec is not None else None,
        model=spec.model if spec is not None else None,
        status=state,
        error=error,
        created_at=float(created) if isinstance(created, int | float) else None,
        updated_at=info.modified or None,
        counts={name: n for name, n in status.counts.items() if n},
        losses={k: v["count"] for k, v in status.losses.items()},
        damage=[d.what for d in info.damage] + left_out,
        journal=status.shipping,
        environments=tuple(
            str(label)
            for env in (spec.environments if spec is not None else ())
            if (label := env.name or env.slug or env.id)
        ),
        tags=tuple(str(t) for t in spec.tags) if spec is not None else (),
    )


def _step_of(row: dict[str, Any]) -> int:
    step = row.get("step")
    return step if isinstance(step, int) else 0


def _table_shipped(step: int) -> bool:
    """Whether the uplink ships this step's sample table (every
    ``TABLE_INTERVAL``-th step): the others the platform never stores, so the
    offline pages do not show them either."""
    return step % TABLE_INTERVAL == 0


def _clip_meta(value: Any) -> Any:
    return jsonbound.clip(value, META_BOUNDS)


_META = (MAX_META_BYTES, _clip_meta)


def _unshown(why: str) -> dict[str, Any]:
    """The sample row of an episode a page cannot decode: its reason, as its error."""
    return {"sample_id": None, "error": why, "info": {}, "completion": []}


def _fact_of(position: int, record: Any, why: str, size: int) -> SampleRow:
    """An episode's row of the samples table, as ``_sample_of``'s would be, for
    less: read off the record itself (``rows.record_row``), else off its
    projection, where neither the copy that nulls non-finite numbers
    (``sample_row`` takes finite numbers only) nor the clip of the whole row is
    made (a 20,000-episode run's analysis took 47 s with both, against about
    1 s for its first page). An episode of ``size`` bytes whose row might
    not fit one request is projected: the platform stores its traces' rows."""
    if size <= DIRECT_ROW_BYTES and isinstance(record, dict):
        row = record_row(position, record)
        if row is not None:
            return compact(row)
    try:
        projected = record_to_samples(record, {}, finite=True) if record is not None else None
    except Exception as exc:  # a malformed episode: its row says so
        projected, why = None, jsonbound.marker(f"not projected: {exc}")
    body = projected[0] if projected else _unshown(why or "no trace to show")
    return compact(sample_row(position, body))


def _fact_of_payload(
    position: int, seq: int, payload: bytes | None, why: str, size: int
) -> SampleRow:
    """``_fact_of`` the entry's record, decoding only the fields its row reads
    where that gives the same row (``narrow_rows``), else the whole record."""
    if (
        payload is not None
        and size <= DIRECT_ROW_BYTES
        and len(payload) <= min(MAX_ENTRY_BYTES, jsonbound.MAX_VALUES)  # loads' bounds hold
    ):
        row = narrow_row(position, payload)
        if row is not None:
            return compact(row)
    return _fact_of(position, *decoded(seq, payload, why, MAX_ENTRY_BYTES), size)


def _sample_of(record: Any, why: str) -> dict[str, Any]:
    """An episode's v0 sample row (its summary trace's), clipped; or, when it
    could not be read (``why``) or projected, a row saying so."""
    try:
        projected = record_to_samples(record, {}) if record is not None else None
    except Exception as exc:  # a malformed episode: its row says so
        projected, why = None, jsonbound.marker(f"not projected: {exc}")
    if projected:
        return dict(jsonbound.clip(projected[0], SAMPLE_BOUNDS))
    return _unshown(why or "no trace to show")


class JournalSource:
    """Reads the journals under ``runs_dir``; never writes to them."""

    def __init__(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        self._lock = threading.Lock()  # pages are read in worker threads
        self._indexes: OrderedDict[str, JournalIndex] = OrderedDict()
        self._listing = threading.Lock()  # the memo's and the rows' (a listing is long)
        self._memo = Memo()
        self._rows = RowCache()

    def _infos(self) -> list[JournalInfo]:
        # The memo: a reload reads only the journals that changed since.
        with self._listing:  # one listing at a time: they share the memo
            return list_journals(self.runs_dir, tally=True, meta_bounds=_META, memo=self._memo)

    def runs(self) -> list[RunRow]:
        """Every run's row; a journal unchanged since the last reload (files,
        owner, no sync journal) keeps its row (``run_rows``)."""
        infos = self._infos()
        root = sync_root()
        in_root = sync_names(root)
        # Served from the sync root itself, each journal is its own sync journal.
        synced_here = self.runs_dir.absolute() == root.absolute()
        rows = []
        with self._listing:
            for info in infos:
                remembered = self._memo.get(info.path)
                key = (
                    None
                    if remembered is None
                    else (
                        remembered[0].stamp,
                        info.owner,
                        info.owner_alive,
                        not synced_here and (info.local_id in in_root or info.path.name in in_root),
                    )
                )
                row = self._rows.get(info.path, key) if key is not None else None
                if row is None:
                    status = describe(info, root, in_root)
                    row = _row(status)
                    if key is not None and status.synced is None and not key[3]:
                        self._rows.put(info.path, key, row)
                    else:
                        self._rows.drop(info.path)
                rows.append(row)
            self._rows.keep_only({info.path for info in infos})
        return rows

    def _find(self, run_id: str) -> RunStatus | None:
        """The run ``run_id`` names: the journal of that name, read alone (a
        page of a run must not list every journal), else the one whose local
        id it is."""
        if run_id and "/" not in run_id and run_id not in (".", ".."):
            path = self.runs_dir / run_id
            with contextlib.suppress(OSError, JournalError):
                if (path / DATA_NAME).is_file():
                    check_dir(path, "journal directory")  # as a listing: never another's
                    return describe(journal_info(path, tally=True, meta_bounds=_META))
        info = next((i for i in self._infos() if run_id in (i.local_id, i.path.name)), None)
        return None if info is None else describe(info)

    def _index(self, status: RunStatus) -> JournalIndex | None:
        """The journal's index, brought up to date (cached; the cache is bounded)."""
        if status.outcome == NOT_OPENED:  # a link, another user's: its row says why
            return None
        info = status.info
        key = str(info.path)
        training = status.spec is not None and status.spec.kind == "train"
        with self._lock:
            index = self._indexes.pop(key, None)
            if index is None or index.upto > info.last_seq or index.training != training:
                index = JournalIndex(training)  # new, or compacted since: read again
            try:
                with Journal.open(info.path, owner=False) as journal:
                    index.update(journal)
            except Exception:  # a journal that cannot be opened: its row says it is damaged
                log.warning("cannot read the journal of %s", info.local_id, exc_info=True)
                return None
            self._indexes[key] = index
            total = sum(i.cost for i in self._indexes.values())
            while total > CACHE_BYTES and len(self._indexes) > 1:
                _, dropped = self._indexes.popitem(last=False)
                total -= dropped.cost
            return index

    def run(self, run_id: str) -> RunDetail | None:
        status = self._find(run_id)
        if status is None:
            return None
        row = _row(status)
        spec = status.spec
        config = dict(spec.config) if spec is not None else {}
        training = (spec.training if spec is not None else None) or {}
        max_steps = training.get("max_steps")
        index = self._index(status)
        if index is None:
            return RunDetail(row, {}, config_text(config), config)
        notes = index.damage_notes()
        if notes:
            row = RunRow(**{**vars(row), "damage": row.damage + notes})
        finish_summary = as_object((status.finish or {}).get("summary"))
        summary = jsonbound.clip(finish_summary) if finish_summary else index.summary
        tables = [
            StepTable(step, len(seqs))
            for step, seqs in sorted(index.steps.items())
            if _table_shipped(step)
        ]
        return RunDetail(
            row,
            summary,
            config_text(config),
            config,
            max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else None,
            metrics=sorted(index.metrics, key=_step_of),
            thinned=index.charted.cut,
            step_tables=tables if row.kind == "train" else [],
            tables_every=TABLE_INTERVAL if row.kind == "train" else None,
        )

    def _samples(self, run_id: str, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """The v0 sample rows of the episodes ``offset``..``offset + limit`` (one
        per episode: its summary trace's), each clipped, and the episode count."""
        status = self._find(run_id)
        index = None if status is None else self._index(status)
        if status is None or index is None:
            return [], 0
        wanted = index.episodes[offset : offset + limit]
        with Journal.open(status.info.path, owner=False) as journal:
            found = read_records(journal, wanted, EntryKind.EPISODE, MAX_ENTRY_BYTES)
            rows = [_sample_of(record, why) for _, record, why in found]
        return rows, len(index.episodes)

    def sample_facts(self, run_id: str, limit: int) -> tuple[list[SampleRow], int]:
        status = self._find(run_id)
        index = None if status is None else self._index(status)
        if status is None or index is None:
            return [], 0
        with self._lock:
            start = len(index.facts)
            wanted = index.episodes[start:limit]
        new: list[SampleRow] = []
        if wanted:  # read outside the lock: other pages go on meanwhile
            with Journal.open(status.info.path, owner=False) as journal:
                found = payloads_in_order(journal, wanted, EntryKind.EPISODE, MAX_ENTRY_BYTES)
                for position, ((_, size), (seq, payload, why)) in enumerate(
                    zip(wanted, found, strict=True), start
                ):
                    new.append(_fact_of_payload(position, seq, payload, why, size))
        with self._lock:
            if len(index.facts) == start:  # else another page brought them first
                index.facts.extend(new)
            return index.facts[:limit], len(index.episodes)

    def samples(self, run_id: str, offset: int, limit: int) -> tuple[list[SampleRow], int]:
        rows, total = self._samples(run_id, offset, limit)
        return [sample_row(offset + i, s) for i, s in enumerate(rows)], total

    def sample(self, run_id: str, index: int) -> dict[str, Any] | None:
        if index < 0:
            return None
        rows, _ = self._samples(run_id, index, 1)
        return rows[0] if rows else None

    def step_rows(
        self, run_id: str, step: int, offset: int = 0, limit: int | None = None
    ) -> tuple[list[dict[str, Any]], int] | None:
        status = self._find(run_id)
        index = None if status is None else self._index(status)
        seqs = None if index is None or not _table_shipped(step) else index.steps.get(step)
        if status is None or not seqs:
            return None
        page = seqs[offset : None if limit is None else offset + limit]
        rows: list[dict[str, Any]] = []
        now = datetime.now(UTC)
        with Journal.open(status.info.path, owner=False) as journal:
            wanted = [(seq, 0) for seq in page]
            found = read_records(journal, wanted, EntryKind.EPISODE, MAX_ENTRY_BYTES)
            for position, (seq, record, _) in enumerate(found, offset):
                if not isinstance(record, dict):
                    continue
                try:  # one episode at a time (its row numbered as in the whole step's table)
                    projected = episodes_to_parquet_rows(
                        [record], run_id, step, sample_id_offset=position, created_at=now
                    )
                except Exception:  # a malformed episode leaves its row out, not the page
                    log.warning("episode entry %d of %s not projected", seq, run_id, exc_info=True)
                    continue
                rows += [jsonbound.clip(row, SAMPLE_BOUNDS) for row in projected]
        return rows, len(seqs)
