"""Training metrics: one row per ``log_metrics`` call, on its own shipper so a
slow sample upload never holds a curve back (see docs/ARCHITECTURE.md, "The wire").

Each journal entry is the finished row (values cleaned, ``step`` and
``_timestamp`` set when it was logged), so a resend carries the same
timestamp. The platform keeps one row per step, which makes a replay after an
ambiguous failure harmless; rows of a batch already stored are still skipped
on resend, because the batch records how far it got.

A batch (a live run's few steps, the hundreds of a sync of a long offline
run or of an uplink catching up) is a request per row: a backlog's go
several at a time (``sinks.fanout``), and
are settled in the order logged, so what the batch records as done is the
rows before the first failure. Rows after it that landed are sent again on
the resend and collapse, which is why only rows with a step go together (a
row without one is a row of its own on the platform, and goes alone), and
never two of one step (they could land in either order, the earlier last).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

import orjson

from primeruns.logs import get_logger

from ..exceptions import (
    APIError,
    NotFoundError,
    UnprovenAnswerError,
    is_record_rejection,
    is_transient,
)
from ..journal import Entry
from ..platform import PlatformClient
from ..platform.errors import OversizeAnswerError
from ..platform.paths import segment
from ..records import FIRST_STEP, LAST_STEP, encode_parsed, step_out_of_range
from . import receipts
from .base import Binding, Prepared, SendContext
from .fanout import Fanout
from .kinds import SINK_KINDS
from .step_rows import StepRows

__all__ = ["MetricsProgress", "TrainMetricsSink", "landed_rows"]

log = get_logger("primeruns.uplink")

# A step other processes keep changing is sent again at most this often per
# row (each round is one request): they send it themselves anyway.
_MAX_ROUNDS = 20
# A batch's rows go in windows of at most ``_WINDOW`` rows merged and
# settled together; a backlog's (``_PIPELINE_FROM`` rows or more) this many
# requests at a time (``sinks.fanout``), a live run's few in order, one
# request at a time. A live training run's batch is what was logged during
# the last one (a few steps' rows): row by row, each cost a step-table
# transaction, a version read and a progress write of its own, a third of
# the sink's CPU (a window: one each).
_IN_FLIGHT = 4
_WINDOW = 64
_PIPELINE_FROM = 16
# A run's rows are read back this many at a time (``landed_rows``).
_LANDED_PAGE = 1000


@dataclass(frozen=True)
class MetricsProgress:
    """How many rows of the batch are settled (each is its own request): stored,
    or refused for their content (``refused``: their places in the batch,
    counted as failed in the write that acknowledges it, so once, whatever
    dies first). No default for ``done``: a new batch's record says
    ``done: 0``, as it always has."""

    done: int
    refused: tuple[int, ...] = ()


class TrainMetricsSink:
    name = "train_metrics"
    kinds = SINK_KINDS["train_metrics"]
    max_entries = 200
    max_bytes = 4 * 1024 * 1024
    isolates_rejections = False
    progress_type = MetricsProgress

    def __init__(
        self, client: PlatformClient, steps: StepRows | None = None, *, in_flight: int = _IN_FLIGHT
    ) -> None:
        """``steps``: where the rows of the run's processes on this host are
        merged per step (``sinks.step_rows``); None sends each row as logged.
        ``in_flight``: requests at once while a backlog drains (1: one by one)."""
        self._client = client
        self._steps = steps
        self._fanout = Fanout(in_flight, "primeruns-metrics")
        self._in_order = Fanout(1, "primeruns-metrics")  # (no thread: the caller's)

    def prepare(
        self, entries: Sequence[Entry], binding: Binding
    ) -> Prepared[MetricsProgress] | None:
        body = b"[" + b",".join(entry.payload for entry in entries) + b"]"
        try:
            orjson.loads(body)  # as ``send`` will: a row it cannot read must not go in
        except orjson.JSONDecodeError:
            return self._up_to_unreadable(entries)
        return Prepared(body=body, records=len(entries), progress=MetricsProgress(done=0))

    def _up_to_unreadable(self, entries: Sequence[Entry]) -> Prepared[MetricsProgress]:
        """The batch of the rows before the first that orjson cannot read (an
        integer past what a double holds: ``log_metrics`` journals it, orjson
        reads an infinity and refuses), which then fails alone: raised when
        it is first (the shipper fails a batch's first entry when prepare
        raises). Sent in one body, it took every row of its batch with it."""
        taken = 0
        for entry in entries:
            try:
                orjson.loads(entry.payload)
            except orjson.JSONDecodeError:
                if taken == 0:
                    raise
                break
            taken += 1
        body = b"[" + b",".join(entry.payload for entry in entries[:taken]) + b"]"
        last = entries[taken - 1].seq
        return Prepared(
            body=body,
            records=taken,
            progress=MetricsProgress(done=0),
            last_seq=None if last == entries[-1].seq else last,
        )

    def send(self, body: bytes, ctx: SendContext[MetricsProgress]) -> None:
        rows = orjson.loads(body)
        refused = _refused(ctx.progress, len(rows))
        if refused != ctx.progress.refused:  # damaged: what names no settled row goes
            ctx.save_progress(replace(ctx.progress, refused=refused))
        for at in refused:  # recorded by an earlier attempt, or process
            ctx.failed_at_ack.setdefault(at, (1, _REFUSED))
        index = ctx.progress.done
        while index < len(rows):
            window = self._window(rows, index)
            if len(window) < 2:
                self._settle(ctx, index, [self._attempt(ctx.binding.run_id, rows[index])])
            else:
                backlog = len(rows) >= _PIPELINE_FROM
                outcomes = self._send_window(ctx.binding.run_id, window, at_once=backlog)
                self._settle(ctx, index, outcomes)
            index = ctx.progress.done

    def _window(self, rows: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
        """The rows from ``index`` that go out together: up to ``_WINDOW``,
        each of its own step (two rows of one step in flight at once could
        land in either order, the earlier last). A row without a step, or a
        batch of one row, goes alone."""
        if len(rows) < 2:
            return rows[index : index + 1]
        window: list[dict[str, Any]] = []
        steps: set[int] = set()
        for row in rows[index : index + _WINDOW]:
            step = row.get("step")
            if not _keepable_step(step) or step in steps:
                break
            steps.add(step)
            window.append(row)
        return window or rows[index : index + 1]

    def _settle(
        self, ctx: SendContext[MetricsProgress], first: int, outcomes: list[BaseException | None]
    ) -> None:
        """Record the rows from ``first`` as done, in order, up to the first
        that failed for a reason other than its content (raised: the batch is
        resent from there; rows after it that landed are sent again, and
        collapse, each having a step). A refused row is settled alone: recorded
        with the rows done, and counted as failed with the acknowledgement
        (counted at once, in a write of its own, a death before the next
        write had it refused and counted again)."""
        done = first
        refused = list(ctx.progress.refused)
        try:
            for failure in outcomes:
                if failure is not None:
                    if not is_record_rejection(failure):
                        raise failure
                    refused.append(done)  # this row only; the rest of the batch goes on
                    ctx.failed_at_ack[done] = (1, failure)
                done += 1
        finally:
            if done > ctx.progress.done:
                ctx.save_progress(replace(ctx.progress, done=done, refused=tuple(refused)))

    def _attempt(self, run_id: str, row: dict[str, Any]) -> BaseException | None:
        try:
            self._send_row(run_id, row)
        except Exception as exc:
            return exc
        return None

    def _send_window(
        self, run_id: str, window: list[dict[str, Any]], *, at_once: bool
    ) -> list[BaseException | None]:
        """The window's rows, ``_IN_FLIGHT`` requests at a time (``at_once``: a
        backlog's; else one at a time, in order): merged in one
        transaction, posted, and the steps looked at again in one read (a
        step another process changed meanwhile goes again, as ``_send_row``
        sends it). What each row's sending raised, None for a stored row."""
        steps = self._steps
        table = f"{self._client.settings.api_root} {run_id}"
        merged = (
            None if steps is None else steps.merge_many(table, [(r["step"], r) for r in window])
        )
        sent: Sequence[tuple[dict[str, Any], int | None]] = (
            merged if merged is not None else [(row, None) for row in window]
        )
        fanout = self._fanout if at_once else self._in_order
        outcomes = fanout.run(
            lambda item: self._post({"run_id": run_id, "metrics": item[0]}),
            sent,
            give_up=lambda exc: not is_record_rejection(exc),  # the batch stops there
        )
        failures: list[BaseException | None] = [o.error for o in outcomes]
        if steps is None or merged is None:
            return failures
        now = steps.versions(table, [row["step"] for row in window])
        for at, (row, (_, version)) in enumerate(zip(window, merged, strict=True)):
            if failures[at] is None and now is not None and now[row["step"]] != version:
                failures[at] = self._attempt(run_id, row)  # changed meanwhile: rounds as one row
        return failures

    def _send_row(self, run_id: str, row: dict[str, Any]) -> None:
        """One logged row: merged with what the run's other processes on this
        host logged for its step, and sent again while they change the step
        (``sinks.step_rows``: the last request to land carries every key)."""
        step = row.get("step")
        if _is_step(step) and not _keepable_step(step):
            # Journaled before log_metrics refused such steps: the platform
            # cannot keep it, nor the step table hold it (an OverflowError
            # there held back every row after it). Refused, for its content.
            raise ValueError(step_out_of_range("the metrics row's step", step))
        steps = self._steps
        if steps is None or not _is_step(step):
            self._post({"run_id": run_id, "metrics": row})
            return
        table = f"{self._client.settings.api_root} {run_id}"
        for _ in range(_MAX_ROUNDS):
            merged = steps.merge(table, step, row)
            if merged is None:  # the table cannot be used: the row as logged
                self._post({"run_id": run_id, "metrics": row})
                return
            self._post({"run_id": run_id, "metrics": merged[0]})
            if steps.version(table, step) in (merged[1], None):
                return

    def close(self) -> None:
        """Its shipper is done: the step table and the helper threads go
        (``Shipper`` calls this as its thread ends)."""
        if self._steps is not None:
            self._steps.close()
        self._fanout.close()

    def _post(self, payload: dict[str, Any]) -> None:
        """One row, proven stored: by its answer, else by reading it back."""
        run_id, step = payload["run_id"], payload["metrics"].get("step")
        # Encoded here by orjson (``records.encode_parsed``: the row is
        # orjson's parse of the batch, or the step table's merge of parsed
        # rows), not by the client's ``json`` encoder: a fifth of the CPU,
        # the same number in every field.
        answer = self._client.api("POST", "/rft/metrics", encode_parsed(payload))
        if receipts.metrics_proves(answer, run_id, step) or self._stored(run_id, step):
            return
        raise receipts.unproven(
            f"the metrics row of step {step} was answered without a receipt "
            "and is not among the run's rows"
        )

    def _stored(self, run_id: str, step: Any) -> bool:
        """Whether the run's row of ``step`` is on the platform. A row without
        a step cannot be looked up, nor can any where the platform offers no
        read (the internal API): the silent answer is taken, as the contract
        allows."""
        if not isinstance(step, int):
            return True
        try:
            page = self._client.api(
                "GET",
                f"/rft/runs/{segment(run_id)}/metrics",
                params={"min_step": step, "max_step": step, "limit": 10},
            )
        except NotFoundError:
            return True
        return any(
            isinstance(row, dict) and row.get("step") == step
            for row in receipts.page_items(page, "metrics")
        )


def landed_rows(client: PlatformClient, table: str) -> Iterator[list[dict[str, Any]]] | None:
    """The metrics rows the platform holds for the run of step table
    ``table`` (``<API root> <run id>``), each with its step, a page at a time
    (what a step table made anew starts from: ``sinks.step_rows``; a long
    run's rows are never all in memory at once). Read by step until a page
    holds none past the last (a platform that gives fewer rows than asked is
    read to the end too). None where the platform offers no such read, or
    refuses or cannot answer the first page; a later page refused ends the
    pages there, said: a read that only helps never holds the rows back, nor
    refuses one. A transient failure is raised (the batch is tried again)."""
    reader = _LandedReader(client, table.rsplit(" ", 1)[-1])
    items = reader.items(None)
    if items is None:
        return None
    first = _rows_from(items, None)
    if items and not first:
        # A page of rows without a step (the local platform lists them
        # first): those with one, from the lowest step there is.
        first = reader.page(FIRST_STEP) or []
    return reader.pages(first)


class _LandedReader:
    """The pages of one run's landed rows (``landed_rows``), in pages of the
    size that last fit the client's bound for an answer: rows of many
    metrics are read in smaller pages, and every page after the first that
    fit keeps its size (started again at ``_LANDED_PAGE``, each page of
    such rows cost an answer past the bound, up to 16 MiB read, first)."""

    def __init__(self, client: PlatformClient, run_id: str) -> None:
        self._client = client
        self._run_id = run_id
        self._limit = _LANDED_PAGE

    def pages(self, rows: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
        while rows:
            yield rows
            last = max(r["step"] for r in rows)
            # No step comes after the last (``records.LAST_STEP``): asking for
            # those that do is an error (a 500 from the local platform, each time).
            if last >= LAST_STEP:
                return
            page = self.page(last + 1)
            if page is None:
                log.warning(
                    "prime-runs: the platform refused the read of run %s's metrics rows from "
                    "step %d on: the table that merges this host's processes' rows lacks "
                    "them, and a step among them logged again by one process loses the keys "
                    "the others logged for it before",
                    self._run_id,
                    last + 1,
                )
            rows = page or []

    def page(self, lowest: int) -> list[dict[str, Any]] | None:
        """The rows of one page of the run's rows from step ``lowest`` on;
        None where the platform refused or could not answer it (raised:
        transient)."""
        items = self.items(lowest)
        return None if items is None else _rows_from(items, lowest)

    def items(self, lowest: int | None) -> list[Any] | None:
        """What one page of the run's rows from step ``lowest`` on lists
        (None: from the first); None where the platform refused or could
        not answer it (raised: transient)."""
        path = f"/rft/runs/{segment(self._run_id)}/metrics"
        while True:
            params = {"limit": self._limit, **({} if lowest is None else {"min_step": lowest})}
            try:
                page = self._client.api("GET", path, params=params)
                return receipts.page_items(page, "metrics")
            except OversizeAnswerError:
                # Rows of many metrics (1,000 rows of 17 KB are past the
                # client's bound for an answer): fewer of them a page. Given
                # up, the table lacked every landed row, as for a platform
                # without the read.
                if self._limit == 1:
                    return None
                self._limit = max(1, self._limit // 10)
            except APIError as exc:
                if is_transient(exc) and not isinstance(exc, UnprovenAnswerError):
                    raise
                return None


def _rows_from(items: list[Any], lowest: int | None) -> list[dict[str, Any]]:
    """The rows of a page of a run's rows with a step from ``lowest`` on (a
    platform that ignores ``min_step`` gives the first page again: read once),
    each a step a step table can hold (a 64-bit integer)."""
    return [
        r
        for r in items
        if isinstance(r, dict)
        and _keepable_step(r.get("step"))
        and (lowest is None or r["step"] >= lowest)
    ]


# What a refused row recorded by an earlier attempt is counted with (its own
# refusal's text died with that attempt's process, or is kept by this one).
_REFUSED = APIError("the platform refused the metrics row for its content", status_code=422)


def _refused(progress: MetricsProgress, rows: int) -> tuple[int, ...]:
    """The refused rows ``progress`` names, as this version records them: each
    a row settled already (before ``done``, within the batch), once, in order.
    The record is read from a file that may be damaged: any other number
    names no refused row, and counting each as one lost would count rows that
    are not in the batch, or that are still to be sent."""
    settled = min(progress.done, rows)
    return tuple(sorted({at for at in progress.refused if 0 <= at < settled}))


def _is_step(step: Any) -> TypeGuard[int]:
    return isinstance(step, int) and not isinstance(step, bool)


def _keepable_step(step: Any) -> TypeGuard[int]:
    """A step the platform and the step table keep (a 64-bit integer)."""
    return _is_step(step) and FIRST_STEP <= step <= LAST_STEP
